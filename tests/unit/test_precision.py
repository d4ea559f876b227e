"""The precision policy as a pure function, for every combination on fake devices (GPU paths included)."""

import itertools

import pytest

from scaletrain.errors import ConfigError
from scaletrain.model.dtypes import checkpoint_dtype
from scaletrain.model.precision import policy

COMBOS = list(itertools.product(["gpu", "gpu-no-bf16", "cpu"], ["ddp", "fsdp"], ["bf16", "fp16", "fp32"],
                                ["full", "lora"]))


@pytest.mark.parametrize("device, strategy, wanted, tuning", COMBOS)
def test_every_combination_keeps_fp32_masters_and_reductions(device, strategy, wanted, tuning):
    kind = "cpu" if device == "cpu" else "gpu"
    args = dict(bf16=wanted == "bf16", fp16=wanted == "fp16", strategy=strategy,
                bf16_supported=device != "gpu-no-bf16")
    if device == "gpu-no-bf16" and wanted == "bf16":
        with pytest.raises(ConfigError, match=r"train.bf16=true but this GPU has no bf16 support; set train.fp16"):
            policy(kind, **args)
        return
    p = policy(kind, **args)
    # what never changes: trainable weights (LoRA adapters included), optimizer states and reductions in fp32
    assert (p.master, p.optimizer, p.reduce) == ("fp32", "fp32", "fp32")
    if kind == "cpu":  # fp32 everywhere by default, and the note says so truthfully
        assert (p.compute, p.frozen, p.how, p.scaler) == ("fp32", "fp32", "none", False)
        if wanted != "fp32":
            assert f"{wanted} requested but training on CPU: fp32 everywhere" in p.note
        return
    half = wanted != "fp32"
    assert p.compute == wanted and p.frozen == wanted  # frozen weights in the compute dtype: never upcast
    assert p.how == ("none" if not half else "fsdp mixed precision" if strategy == "fsdp" else "autocast")
    assert p.scaler == (wanted == "fp16")
    assert p.table()["precision/frozen_params"] == wanted


def test_the_cpu_opt_in_is_the_gpu_policy_with_cpu_autocast():
    p = policy("cpu", bf16=True, fp16=False, torch_dtype="bfloat16", strategy="fsdp")
    assert (p.compute, p.frozen, p.master, p.how) == ("bf16", "bf16", "fp32", "fsdp mixed precision")
    assert "opts in" in p.note


def test_torch_dtype_float32_keeps_a_gpu_lora_base_in_fp32():
    assert policy("gpu", bf16=True, fp16=False, torch_dtype="float32").frozen == "fp32"


@pytest.mark.parametrize("kwargs, needle", [
    (dict(device="gpu", bf16=True, fp16=False, torch_dtype="float16"),
     r"model.torch_dtype=float16 and train.bf16=true disagree .* set model.torch_dtype=bfloat16 or auto"),
    (dict(device="gpu", bf16=False, fp16=False, torch_dtype="bfloat16"),
     r"model.torch_dtype=bfloat16 needs train.bf16=true"),
    (dict(device="cpu", bf16=False, fp16=True, torch_dtype="float16"),
     r"model.torch_dtype=float16 on CPU needs train.bf16=true"),
    (dict(device="gpu", bf16=False, fp16=True, fp16_supported=False, strategy="fsdp"),
     r"train.fp16=true but this device has no fp16 support"),
])
def test_combinations_that_cannot_train_are_one_line(kwargs, needle):
    with pytest.raises(ConfigError, match=needle) as e:
        policy(**kwargs)
    assert "\n" not in str(e.value)


def test_an_unknown_dtype_name_is_refused_at_load():
    from scaletrain.config import validate

    with pytest.raises(ConfigError, match=r"model.torch_dtype='fp8' is not valid"):
        validate({"model": {"name_or_path": "builtin:tiny-bert", "torch_dtype": "fp8"}, "data": {"train_file": "x"}})


def test_a_checkpoints_stored_dtype_is_read_from_either_key():
    assert checkpoint_dtype({"torch_dtype": "bfloat16"}) == "bf16"
    assert checkpoint_dtype({"dtype": "float16"}) == "fp16"
    assert checkpoint_dtype({}) is None
