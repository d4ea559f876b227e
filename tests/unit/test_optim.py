"""The optimizer: fused AdamW where torch has the kernel, same update as the per-parameter loop."""

import torch

from scaletrain.config.schema import TrainConfig
from scaletrain.worker.optim import build_optimizer


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 2))


def test_fused_adamw_on_cpu_matches_the_per_parameter_loop():
    train = TrainConfig(weight_decay=0.1)
    fused_model, loop_model = _model(), _model()
    fused, _ = build_optimizer(fused_model, train, lr=1e-2, total=10)
    assert fused.defaults["fused"] is True
    # the same groups: decay for matrices, none for biases and norms
    assert [len(g["params"]) for g in fused.param_groups] == [2, 4]
    assert [g["weight_decay"] for g in fused.param_groups] == [0.1, 0.0]
    params = list(loop_model.parameters())
    loop = torch.optim.AdamW([{"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.1},
                              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}],
                             lr=1e-2, foreach=False)
    x = torch.randn(4, 8)
    for _ in range(3):
        for model, opt in ((fused_model, fused), (loop_model, loop)):
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    for a, b in zip(fused_model.parameters(), loop_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not torch.equal(fused_model[0].weight, _model()[0].weight)  # it did train


def test_parameters_on_a_device_without_the_kernel_use_the_loop():
    model = _model().to("meta")
    opt, _ = build_optimizer(model, TrainConfig(), lr=1e-3, total=10)
    assert not opt.defaults.get("fused")
    assert opt.defaults["foreach"] is False
