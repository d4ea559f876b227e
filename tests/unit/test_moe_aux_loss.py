"""The MoE load-balancing loss over the global batch (worker/router.py): summed over the micro-batches of a step
it equals transformers' own ``load_balancing_loss_func`` on the concatenated batch, value and gradients, for each
family; averaging the expert shares per micro-batch (what a per-forward loss does) gives another loss; a dense
model with the coefficient set is one line."""

import pytest
import torch

from scaletrain.model.moe import experts_of
from scaletrain.worker.router import RouterLoss
from tests.unit.test_moe_lora import _model

FAMILIES = ["qwen3_moe", "mixtral", "gpt_oss"]


def _batch(seed: int = 0) -> dict:
    """4 sequences of 12 tokens, the last two padded at the end (padding must not count)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 128, (4, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[2, 8:], mask[3, 5:] = 0, 0
    return {"input_ids": ids, "attention_mask": mask}


def _reference(model, batch):
    """transformers' own auxiliary loss, one forward over the whole (global) batch."""
    import importlib

    family = type(model).__module__
    lb = importlib.import_module(family).load_balancing_loss_func
    e = experts_of(model.config)
    out = model(**batch, output_router_logits=True)
    return lb(out.router_logits, e.count, e.top_k, batch["attention_mask"])


def _ours(model, batch, micro: int, per_micro_batch: bool = False):
    """The step's auxiliary loss as scaletrain sums it over ``micro`` micro-batches (one process: the all-reduce
    is the identity), with backward per micro-batch as the step runs it."""
    e = experts_of(model.config)
    router = RouterLoss(1.0, e, world_size=1, device="cpu")
    window = [{k: v[i::micro] for k, v in batch.items()} for i in range(micro)]
    if not per_micro_batch:
        router.begin_step(model, window, _no_autocast)
    total = 0.0
    for mb in window:
        if per_micro_batch:
            router.shares = None  # each forward counts only itself: the per-micro-batch loss
        out = model(**mb, output_router_logits=True)
        loss = router.micro_loss(out.router_logits, mb)
        if per_micro_batch:
            loss = loss * mb["attention_mask"].sum() / batch["attention_mask"].sum()
        loss.backward()
        total += float(loss.detach())
    return total, router


class _no_autocast:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", FAMILIES)
def test_summed_over_micro_batches_it_is_the_global_batch_loss_with_its_gradients(family):
    model = _model(family).float()
    batch = _batch()
    reference = _reference(model, batch)
    reference.backward()
    want = _grads(model)
    model.zero_grad()
    value, router = _ours(model, batch, micro=4)
    assert value == pytest.approx(float(reference), rel=1e-5)
    assert router.sums[0] == pytest.approx(float(reference), rel=1e-5)  # what train/moe_aux_loss records
    got = _grads(model)
    assert set(got) == set(want) and any(".gate" in n or ".router" in n for n in got)
    for name in want:
        assert torch.allclose(got[name], want[name], rtol=1e-4, atol=1e-7), name


def test_shares_of_each_micro_batch_give_another_loss():
    """The check that the shares are the global batch's: averaged per micro-batch, the loss moves."""
    model = _model("qwen3_moe").float()
    batch = _batch(1)
    reference = float(_reference(model, batch))
    per_micro, _ = _ours(model, batch, micro=4, per_micro_batch=True)
    assert abs(per_micro - reference) > 1e-3 * reference


def test_one_micro_batch_counts_in_its_own_forward():
    model = _model("mixtral").float()
    batch = _batch(2)
    value, _ = _ours(model, batch, micro=1)
    assert value == pytest.approx(float(_reference(model, batch)), rel=1e-5)


def test_the_coefficient_on_a_dense_model_is_one_line_and_an_moe_says_its_own(tmp_path):
    from transformers import LlamaConfig, Qwen3MoeConfig

    from scaletrain.config import validate
    from scaletrain.errors import ConfigError
    from scaletrain.model.build import router_loss_note
    from scaletrain.model.tokenizer import Vocab

    common = dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    LlamaConfig(**common, intermediate_size=64).save_pretrained(tmp_path / "dense")
    Qwen3MoeConfig(**common, intermediate_size=64, moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2,
                   head_dim=8, router_aux_loss_coef=0.001).save_pretrained(tmp_path / "moe")
    vocab = Vocab(size=128, pad_id=0)

    def cfg(model, **train):
        return validate({"model": {"name_or_path": str(tmp_path / model), "task": "causal-lm"},
                         "data": {"train_file": "x.jsonl"}, "train": train})

    with pytest.raises(ConfigError, match=r"train.moe_aux_loss_coef=0.01: .*dense.* has no routed experts"):
        router_loss_note(cfg("dense", moe_aux_loss_coef=0.01), vocab)
    with pytest.raises(ConfigError, match=r"train.moe_z_loss_coef=0.001: .*dense.* has no routed experts"):
        router_loss_note(cfg("dense", moe_z_loss_coef=0.001), vocab)
    assert router_loss_note(cfg("dense"), vocab) is None
    note = router_loss_note(cfg("moe"), vocab)
    assert "4 experts, top-2; load-balancing loss over the global batch" in note and \
        "coefficient 0.001 (the checkpoint's router_aux_loss_coef" in note
    assert "coefficient 0.02 (train.moe_aux_loss_coef)" in router_loss_note(cfg("moe", moe_aux_loss_coef=0.02), vocab)
    assert "no load-balancing loss" in router_loss_note(cfg("moe", moe_aux_loss_coef=0), vocab)
    assert "a no-grad forward of the window first" in router_loss_note(cfg("moe", gradient_accumulation_steps=4),
                                                                       vocab)


def _deepseek_v2(**extra):
    from transformers import DeepseekV2Config

    return DeepseekV2Config(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=4, intermediate_size=64, moe_intermediate_size=16, n_routed_experts=8,
                            num_experts_per_tok=2, first_k_dense_replace=0, n_shared_experts=1, kv_lora_rank=16,
                            q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, **extra)


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
def test_the_z_loss_over_micro_batches_is_the_global_batch_mean_with_its_gradients(family):
    """Switch Transformers' router_z_loss_func per layer, averaged over the layers, on the whole batch (no padding:
    it counts every position) equals the step's z-loss summed over 3 micro-batches, value and gradients."""
    from transformers.models.switch_transformers.modeling_switch_transformers import router_z_loss_func

    model = _model(family).float()
    batch = {"input_ids": torch.randint(0, 128, (6, 10), generator=torch.Generator().manual_seed(3))}
    batch["attention_mask"] = torch.ones_like(batch["input_ids"])
    layers = model(**batch, output_router_logits=True).router_logits
    reference = sum(router_z_loss_func(layer.reshape(6, 10, -1)) for layer in layers) / len(layers)
    reference.backward()
    want = _grads(model)
    model.zero_grad()
    router = RouterLoss(0.0, experts_of(model.config), world_size=1, device="cpu", z_coef=1.0)
    window = [{k: v[i::3] for k, v in batch.items()} for i in range(3)]
    router.begin_step(model, window, _no_autocast)
    total = 0.0
    for mb in window:
        loss = router.micro_loss(model(**mb, output_router_logits=True).router_logits, mb)
        loss.backward()
        total += float(loss.detach())
    assert total == pytest.approx(float(reference), rel=1e-5)
    assert router.sums[2] == pytest.approx(float(reference), rel=1e-5)  # what train/moe_z_loss records
    got = _grads(model)
    assert set(got) == set(want)
    for name in want:
        assert torch.allclose(got[name], want[name], rtol=1e-4, atol=1e-7), name


def test_group_limited_routing_counts_the_experts_deepseek_v2_picks():
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter

    from scaletrain.worker.router import _chosen

    config = _deepseek_v2(n_group=4, topk_group=1, topk_method="group_limited_greedy")  # both from the best group
    experts = experts_of(config)
    assert experts.groups == (4, 1)
    router = DeepseekV2TopkRouter(config)
    torch.nn.init.normal_(router.weight, std=1.0)
    hidden = torch.randn(64, 32, generator=torch.Generator().manual_seed(4))
    logits, _, picked = router(hidden)
    ours = _chosen(logits, experts)
    assert [sorted(r) for r in ours.tolist()] == [sorted(r) for r in picked.tolist()]
    plain = torch.topk(logits, 2, dim=-1).indices  # what plain top-k would have counted: not the same choices
    assert [sorted(r) for r in plain.tolist()] != [sorted(r) for r in picked.tolist()]


def test_deepseek_v2_gets_the_term_its_transformers_code_omits(tmp_path):
    """DeepSeek-V2's released config names the coefficient aux_loss_alpha; transformers' code reads the router
    logits but never adds the loss: scaletrain adds it, and says so; the z-loss is off unless asked."""
    from transformers import DeepseekV2ForCausalLM

    from scaletrain.comm.context import DistContext
    from scaletrain.config import validate
    from scaletrain.model.build import router_loss_note
    from scaletrain.model.tokenizer import Vocab
    from scaletrain.worker.trainer import router_loss_for

    config = _deepseek_v2(aux_loss_alpha=0.001, n_group=4, topk_group=2, topk_method="group_limited_greedy")
    config.save_pretrained(tmp_path / "dsv2")
    cfg = validate({"model": {"name_or_path": str(tmp_path / "dsv2"), "task": "causal-lm"},
                    "data": {"train_file": "x.jsonl"}, "train": {}})
    note = router_loss_note(cfg, Vocab(size=128, pad_id=0))
    assert "8 experts, top-2 within 2 of 4 groups" in note
    assert "coefficient 0.001 (the checkpoint's aux_loss_alpha: transformers' code for deepseek_v2 omits the term, " \
        "added here)" in note and "z-loss" not in note
    router = router_loss_for(cfg, config, DistContext(world_rank=0, local_rank=0, world_size=1,
                                                        local_world_size=1, node_rank=0, device="cpu", backend="gloo"))
    assert router.coef == 0.001 and router.z_coef == 0.0 and router.experts.groups == (4, 2)
    torch.manual_seed(0)
    model = DeepseekV2ForCausalLM(config).float()
    batch = _batch(5)
    loss = router.micro_loss(model(**batch, output_router_logits=True).router_logits, batch)
    loss.backward()
    assert float(loss) > 0 and all(layer.mlp.gate.weight.grad.abs().sum() > 0 for layer in model.model.layers)
    z_note = router_loss_note(validate({"model": {"name_or_path": str(tmp_path / "dsv2"), "task": "causal-lm"},
                                        "data": {"train_file": "x.jsonl"}, "train": {"moe_z_loss_coef": 0.001}}),
                              Vocab(size=128, pad_id=0))
    assert "router z-loss, coefficient 0.001 (train.moe_z_loss_coef), logged as train/moe_z_loss" in z_note


def test_router_health_from_counts_and_the_starvation_alert():
    from scaletrain.metrics.alerts import ExpertStarved
    from scaletrain.metrics.experts import router_health

    health = router_health([[25, 25, 25, 25], [97, 1, 1, 1]])
    assert health["moe/expert_shares"] == [[1.0, 1.0, 1.0, 1.0], [3.88, 0.04, 0.04, 0.04]]
    assert health["moe/expert_share_min"] == [1.0, 0.04] and health["moe/expert_share_max"] == [1.0, 3.88]
    assert health["moe/router_entropy"][0] == pytest.approx(1.0) and health["moe/router_entropy"][1] < 0.2
    rule = ExpertStarved(share=0.1, records=3)
    fired = []
    for step in range(1, 8):
        fired += rule.observe({"kind": "train", "step": step, **health})
    assert [(a.step, a.message.split(" receives")[0]) for a in fired] == [
        (3, "MoE layer 1 expert 1"), (3, "MoE layer 1 expert 2"), (3, "MoE layer 1 expert 3")]  # once each
    assert "0.04x its fair share of tokens (4 experts) for 3 records" in fired[0].message


def test_the_router_records_per_layer_counts_for_its_health():
    model = _model("qwen3_moe").float()
    value, router = _ours(model, _batch(3), micro=2)
    values = router.health_values()
    assert len(values) == 2 * 4 and sum(values) == pytest.approx(2 * 2 * int(_batch(3)["attention_mask"].sum()))
    assert router.health_values() == [0.0] * 8  # reset after a record, the same length on every rank
