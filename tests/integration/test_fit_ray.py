"""Fitting big models, on 2 CPU workers: the memory levers keep the run's curve, and the plan's memory estimate
is within 15% of the peak each run measured (summary.json records both)."""

import json

import pytest

from scaletrain.config import validate
from scaletrain.launch.job import run_job
from scaletrain.scaling.parity import compare
from tests.conftest import train_losses

pytestmark = pytest.mark.ray


def _rows(n: int) -> list[dict]:
    import random

    rng = random.Random(9)
    words = "cold hot fast slow big small up down left right good bad".split()
    return [{"instruction": f"Say {i % 7} words", "output": " ".join(rng.choices(words, k=rng.choice([3, 20, 60])))}
            for i in range(n)]


def _run(tmp_path, name, model="builtin:tiny-llama", workers=2, steps=6, batch=2, max_length=64, **train):
    data = tmp_path / "sft.jsonl"
    if not data.exists():
        data.write_text("\n".join(json.dumps(r) for r in _rows(400)))
    finetuning = train.pop("finetuning_type", "full")
    cfg = validate({
        "model": {"name_or_path": model, "task": "causal-lm", "dropout": 0.0, "finetuning_type": finetuning},
        "data": {"train_file": str(data), "eval_ratio": 0.02, "max_length": max_length, "template": "alpaca",
                 "packing": True},
        "train": {"per_device_train_batch_size": batch, "per_device_eval_batch_size": batch, "learning_rate": 2e-3,
                  "max_steps": steps, "logging_steps": 1, "seed": 3, "max_grad_norm": 0.0, **train},
        "scaling": {"num_workers": workers},
        "monitor": {"report": False},
        "output": {"output_dir": str(tmp_path / "runs"), "run_name": name},
    })
    return run_job(cfg, tmp_path / f"{name}.yaml", show_progress=False).run_dir


def test_fsdp_levers_and_checkpointing_keep_the_curve(tmp_path, ray_local, no_orphans):
    plain = _run(tmp_path, "fsdp", strategy="fsdp")
    reference = train_losses(plain)
    assert len(reference) == 6 and reference[-1] < reference[0]
    for name, levers in (("hybrid", {"fsdp_shard_size": 1}), ("zero2", {"fsdp_reshard_after_forward": False}),
                         ("ckpt", {"gradient_checkpointing": True})):
        other = _run(tmp_path, name, strategy="fsdp", **levers)
        result = compare(plain, other)
        assert result["steps"] == 6 and result["max_rel_loss_diff"] < 1e-5, (name, result, train_losses(other))
    ddp_ckpt = _run(tmp_path, "ddp-ckpt-lora", strategy="ddp", gradient_checkpointing=True, finetuning_type="lora")
    ddp = _run(tmp_path, "ddp-lora", strategy="ddp", finetuning_type="lora")
    assert compare(ddp, ddp_ckpt)["max_rel_loss_diff"] < 1e-5  # LoRA: the checkpointed blocks have a graph


@pytest.mark.parametrize("name,workers,train", [
    ("full-ddp-1", 1, {"strategy": "ddp"}),
    ("lora-ddp-1-ckpt", 1, {"strategy": "ddp", "finetuning_type": "lora", "gradient_checkpointing": True}),
    ("full-fsdp-2", 2, {"strategy": "fsdp"}),
    ("lora-fsdp-2", 2, {"strategy": "fsdp", "finetuning_type": "lora"}),
    ("full-ddp-2-ckpt", 2, {"strategy": "ddp", "gradient_checkpointing": True}),
])
def test_the_memory_estimate_is_within_15_percent_of_the_measured_peak(tmp_path, ray_local, no_orphans, name,
                                                                      workers, train):
    run = _run(tmp_path, name, model="builtin:llama-100m", workers=workers, steps=2, batch=2, max_length=256,
               **train)
    summary = json.loads((run / "summary.json").read_text())
    ratio = summary["memory/predicted_over_measured"]
    assert len(summary["memory/peak_bytes_per_rank"]) == workers
    assert summary["memory/peak_bytes"] > 200 * 2**20  # ~80M parameters: a real peak, not noise
    assert 0.85 <= ratio <= 1.15, (name, ratio, summary["memory/peak_bytes"], summary["memory/predicted"])
