"""FP8 matmuls for LoRA's frozen base (#63, ``model.fp8_base``): which devices have them, the conversion (run here on
CPU, where torch emulates the FP8 matmul: the numerics, not the speed), the refusals and the plan's step time."""

import pytest
import torch

from scaletrain.config import validate
from scaletrain.errors import ConfigError
from scaletrain.model import fp8

pytest.importorskip("torchao")


@pytest.mark.parametrize("device,capability,arch,ok", [
    ("gpu", (9, 0), None, True),  # H100, H200
    ("gpu", (8, 9), None, True),  # L40S
    ("gpu", (10, 0), None, True),  # B200
    ("gpu", (8, 0), None, False),  # A100
    ("gpu", None, "gfx942:sramecc+:xnack-", True),  # MI300X
    ("gpu", None, "gfx950", True),  # MI355X
    ("gpu", None, "gfx90a:sramecc+:xnack-", False),  # MI250X
    ("cpu", None, None, False),
])
def test_which_devices_have_fp8(device, capability, arch, ok):
    assert (fp8.fp8_device_error(device, capability, arch) is None) == ok


def test_a_gpu_without_fp8_is_one_line_from_its_rank(monkeypatch):
    class Props:
        major, minor, name = 8, 0, "NVIDIA A100-SXM4-80GB"

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Props())
    monkeypatch.setattr(torch.version, "hip", None)
    with pytest.raises(ConfigError, match=r"model.fp8_base: this NVIDIA GPU \(compute capability 8.0\) has no FP8 "
                                          r"tensor cores .*; remove model.fp8_base"):
        fp8.check_device("cuda:0")


def _model_cfg(**over):
    return validate({"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm", "finetuning_type": "lora",
                               "fp8_base": True, "dropout": 0.0, **over},
                     "data": {"train_file": "x.jsonl"}}).model


def test_lora_trains_on_an_fp8_base():
    from scaletrain.model.build import build_model
    from scaletrain.model.tokenizer import Vocab, load_tokenizer
    from scaletrain.worker.trainer import seed_everything

    vocab = Vocab.of(load_tokenizer("builtin:tiny-llama"))
    seed_everything(0)
    plain = build_model(_model_cfg(fp8_base=False), vocab)
    seed_everything(0)
    model = build_model(_model_cfg(), vocab, fp8=True)
    converted = [n for n, m in model.named_modules() if type(m).__name__ == "Float8Linear"]
    assert len(converted) == 14  # 2 blocks x 7 linear layers, each the base layer LoRA wraps
    assert all(n.endswith("base_layer") for n in converted)
    ids = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(0))
    out = model(input_ids=ids, labels=ids)
    with torch.no_grad():
        reference = plain(input_ids=ids, labels=ids).loss
    assert out.loss.item() == pytest.approx(reference.item(), rel=2e-2)  # e4m3: 3 mantissa bits
    assert not torch.equal(out.loss, reference)  # the matmuls did run in FP8
    out.loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    assert grads and all(g is not None for n, g in grads.items() if "lora_A" in n)
    assert all(p.grad is None for n, p in model.named_parameters() if not p.requires_grad)


def test_fp8_base_refusals_are_one_line():
    from scaletrain.model.frozen_base import quantization_note
    from scaletrain.model.tokenizer import Vocab, load_tokenizer

    with pytest.raises(ConfigError, match="model.fp8_base computes a frozen LoRA base in FP8; it needs "
                                          "model.finetuning_type: lora"):
        _model_cfg(finetuning_type="full")
    with pytest.raises(ConfigError, match="and no model.quantization_bit"):
        _model_cfg(quantization_bit=4)
    vocab = Vocab.of(load_tokenizer("builtin:tiny-llama"))
    with pytest.raises(ConfigError, match=r"model.fp8_base: a CPU has no FP8 units .*; remove model.fp8_base"):
        quantization_note(_model_cfg(), vocab, gpu=False, strategy="ddp", world_size=1)
    assert quantization_note(_model_cfg(), vocab, gpu=True, strategy="ddp", world_size=1).startswith(
        "fp8 base: 14 linear layers of the decoder blocks compute in FP8")


def test_the_plan_times_the_base_matmuls_at_the_fp8_peak():
    from scaletrain.memory.estimate import model_shape
    from scaletrain.memory.plan import device_named, step_time_s
    from scaletrain.model.tokenizer import Vocab

    cfg = validate({"model": {"name_or_path": "builtin:llama-100m", "task": "causal-lm", "finetuning_type": "lora",
                              "fp8_base": True},
                    "data": {"train_file": "x.jsonl", "max_length": 1024}, "train": {"bf16": True}})
    shape = model_shape(cfg, Vocab(32000, 0), 1, 1024, 1)
    h100 = device_named("h100")
    plain = cfg.model_copy(update={"model": cfg.model.model_copy(update={"fp8_base": False})})
    faster, slower = step_time_s(cfg, shape, h100, "bf16"), step_time_s(plain, shape, h100, "bf16")
    # the base's 4N FLOPs per token at twice the rate; attention (1k tokens) and LoRA's at the bf16 one: 0.64
    assert 0.55 < faster / slower < 0.7
