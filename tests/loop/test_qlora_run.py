"""QLoRA end to end (#63): a tiny bf16 Llama whose decoder blocks torchao quantizes to NF4 trains LoRA on top (the
loss falls, the line at start says what is 4-bit), a killed run resumes bit-identical (the adapter is the whole
checkpoint; the base is quantized again from the same bytes), 1 and 2 workers under FSDP2 agree, and export merges
the adapter into the original-precision base from its own files, equal to peft's merge_and_unload."""

import json
import os
from pathlib import Path

import pytest
import torch
import yaml

from scaletrain.launch.local import run_in_process
from tests.cli import run_cli
from tests.conftest import (
    cli_train,
    local_spec,
    resumes_bit_identical,
    save_tiny_llama,
    train_losses,
    write_config,
)

pytestmark = pytest.mark.loop
pytest.importorskip("torchao")


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("ckpt") / "tiny-llama")


def _data(root: Path) -> Path:
    data = root / "data.jsonl"
    data.write_text("\n".join(json.dumps({"instruction": f"Count to {i % 7 + 1}.", "input": "",
                                          "output": " ".join(str(k) for k in range(1, i % 7 + 2))})
                              for i in range(48)))
    return data


def _cfg(model: Path, data: Path, steps: int = 10, **train) -> dict:
    return {"model": {"name_or_path": str(model), "task": "causal-lm", "finetuning_type": "lora",
                      "quantization_bit": 4, "lora_rank": 8, "lora_alpha": 16},
            "data": {"train_file": str(data), "template": "alpaca", "max_length": 64, "eval_ratio": 0},
            "train": {"per_device_train_batch_size": 8, "max_steps": steps, "learning_rate": 5e-3,
                      "logging_steps": 1, **train},
            "scaling": {"num_workers": 1}}


@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
def test_qlora_trains_and_exports_into_the_original_precision_base(tiny_llama, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from scaletrain.after.export import export_run
    from tests.unit.test_export import _load, _within_one_ulp

    cfg, _, spec = local_spec(_cfg(tiny_llama, _data(tmp_path)), tmp_path / "run")
    run_in_process(spec)
    (tmp_path / "run" / "config.resolved.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    losses = train_losses(tmp_path / "run")
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 1.0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    held, planned = summary["memory/param_bytes_per_rank"][0], summary["memory/predicted"]["parameters"]
    assert held == pytest.approx(planned, rel=0.01)  # the plan counts the NF4 base as the run holds it
    assert held < 0.6 * summary["parameters/total"] * 4  # fp32 on CPU but for the 4-bit blocks
    done = export_run(tmp_path / "run")
    assert done.merged == 14 and done.dtype == "bf16"  # every adapted linear of the 2 blocks, in the base's dtype
    reference = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.bfloat16),
                                          tmp_path / "run" / "final").merge_and_unload().state_dict()
    ours = _load(done.path)
    assert all(_within_one_ulp(tensor, reference[key]) for key, tensor in ours.items())


@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
def test_the_start_of_run_says_what_is_4_bit(tiny_llama, tmp_path):
    cfg = {**_cfg(tiny_llama, _data(tmp_path), steps=1), "scaling": {"num_workers": 1, "launcher": "local"},
           "output": {"output_dir": str(tmp_path / "runs")}}
    out = run_cli("train", "--no-progress", write_config(tmp_path / "c.yaml", cfg),
                  env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert ("model: qlora: 14 linear layers of the decoder blocks in NF4 via torchao (1,179,648 parameters at "
            "0.516 bytes each, double-quantized scales, frozen)") in out.stderr
    assert "Failed to load" not in out.stderr and "register_constant" not in out.stderr  # torchao's import noise


@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
def test_a_killed_qlora_run_resumes_bit_identical(tiny_llama, tmp_path):
    cfg = _cfg(tiny_llama, _data(tmp_path), steps=4)
    cfg["checkpoint"] = {"save_steps": 2}
    resumes_bit_identical(cfg, tmp_path, 2, weights="adapter_model.safetensors")


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_one_and_two_workers_agree(tiny_llama, tmp_path, strategy):
    """The NF4 base sharded by FSDP2 over 2 workers (torchao's NF4 all-gathers its 4-bit bytes), or whole on each
    under DDP, against 1 worker with the same global batch."""
    data = _data(tmp_path)
    curves = [train_losses(cli_train(_cfg(tiny_llama, data, steps=4, strategy=strategy,
                                          per_device_train_batch_size=8 // workers), tmp_path, f"w{workers}", workers))
              for workers in (1, 2)]
    assert len(curves[0]) == 4 and curves[1] == pytest.approx(curves[0], rel=1e-5)
