"""DoRA (`model.use_dora`, LLaMA-Factory's name; #63): a LoRA SFT run with DoRA trains (the loss falls), its adapter
holds the trained magnitudes, a killed run resumes bit-identical, and export merges it (tests/unit/test_export.py:
equal to peft's merge_and_unload within one bf16 ulp)."""

import json

import pytest

from scaletrain.launch.local import run_in_process
from tests.conftest import local_spec, resumes_bit_identical, train_losses

pytestmark = pytest.mark.loop


def _cfg(demo_dir, steps=12) -> dict:
    return {"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm", "finetuning_type": "lora",
                      "use_dora": True, "dropout": 0.0},
            "data": {"train_file": str(demo_dir / "alpaca.json"), "template": "chatml", "max_length": 64,
                     "eval_ratio": 0},
            "train": {"per_device_train_batch_size": 8, "max_steps": steps, "learning_rate": 5e-3,
                      "logging_steps": 1},
            "scaling": {"num_workers": 1}}


def test_dora_trains_and_its_adapter_holds_the_magnitudes(demo_dir, tmp_path):
    from safetensors.torch import load_file

    _, _, spec = local_spec(_cfg(demo_dir), tmp_path / "run")
    run_in_process(spec)
    losses = train_losses(tmp_path / "run")
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3
    final = tmp_path / "run" / "final"
    assert json.loads((final / "adapter_config.json").read_text())["use_dora"] is True
    assert any(k.endswith("lora_magnitude_vector") for k in load_file(final / "adapter_model.safetensors"))


@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
def test_a_killed_dora_run_resumes_bit_identical(demo_dir, tmp_path):
    cfg = _cfg(demo_dir, steps=4)
    cfg["checkpoint"] = {"save_steps": 2}
    resumes_bit_identical(cfg, tmp_path, 2, weights="adapter_model.safetensors")


def test_dora_with_full_fine_tuning_is_one_line():
    from scaletrain.config import validate
    from scaletrain.errors import ConfigError

    with pytest.raises(ConfigError, match="model.use_dora applies to model.finetuning_type=lora"):
        validate({"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm", "use_dora": True},
                  "data": {"train_file": "x.jsonl"}})
