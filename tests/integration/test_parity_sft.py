"""Causal-LM SFT with variable-length replies means the same objective on 1 and 2 workers: the loss is the sum of
token losses over the optimizer step divided by the step's target tokens across every rank and micro-batch.
1 worker x accumulation 4, 2 workers x accumulation 2 and 2 workers x batch/2 give the same curve (1e-5), for
DDP and FSDP; and the chunked loss on 2 workers trains the same curve as the plain one. The runs use the torchrun
launcher: the objective is the worker loop's, whatever starts the workers, and a torchrun job starts in ~18 s where a
Ray Train one takes ~30 s on this 2-core machine (test_train_ray.py trains on Ray)."""

import json

import pytest

from scaletrain.cli import main
from scaletrain.config import validate
from scaletrain.launch.job import run_job
from scaletrain.scaling.parity import compare
from tests.conftest import train_losses
from tests.integration.test_scaling_ray import _write

TOLERANCE = 1e-5  # relative, CPU fp32


def _chat_rows(n: int) -> list[dict]:
    """Replies from 1 to ~40 tokens: a mean of per-micro-batch means would weigh them differently."""
    import random

    rng = random.Random(5)
    words = "cold hot fast slow big small up down left right good bad".split()
    return [{"instruction": f"Say {i % 7} words", "output": " ".join(rng.choices(words, k=rng.choice([1, 2, 20, 40])))}
            for i in range(n)]


def _run(tmp_path, name, strategy, workers, batch, accum, chunk=0):
    data = tmp_path / "sft.jsonl"
    if not data.exists():
        data.write_text("\n".join(json.dumps(r) for r in _chat_rows(256)))
    cfg = validate({
        "model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm", "dropout": 0.0},
        "data": {"train_file": str(data), "eval_ratio": 0.0, "max_length": 64, "template": "alpaca"},
        "train": {"strategy": strategy, "per_device_train_batch_size": batch, "gradient_accumulation_steps": accum,
                  "learning_rate": 2e-3, "max_steps": 6, "logging_steps": 1, "seed": 3, "max_grad_norm": 0.0,
                  "loss_chunk_tokens": chunk},
        "scaling": {"num_workers": workers, "launcher": "torchrun"},
        "monitor": {"report": False},
        "output": {"output_dir": str(tmp_path / "runs"), "run_name": name},
    })
    return run_job(cfg, tmp_path / f"{name}.yaml", show_progress=False).run_dir


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_one_and_two_workers_optimise_the_same_token_mean(tmp_path, strategy):
    one = _run(tmp_path, "1x4", strategy, workers=1, batch=4, accum=4)  # global batch 16
    two_accum = _run(tmp_path, "2x2", strategy, workers=2, batch=4, accum=2)
    two_half = _run(tmp_path, "2xhalf", strategy, workers=2, batch=2, accum=4)
    # the chunked loss (the output layer sharded under FSDP, DDP's hooks on it) trains the plain path's curve
    two_chunked = _run(tmp_path, "2x2-chunked", strategy, workers=2, batch=4, accum=2, chunk=16)
    assert "loss in chunks of 16 tokens" in (two_chunked / "logs" / "main.log").read_text()
    reference = train_losses(one)
    assert len(reference) == 6 and reference[-1] < reference[0]
    for other in (two_accum, two_half, two_chunked):
        result = compare(one, other)
        assert result["steps"] == 6 and result["max_rel_loss_diff"] < TOLERANCE, (result, train_losses(other))


# `scaletrain parity`: 1 and 2 workers of the same config, pass or fail with the cause (the runs under torchrun: what
# parity compares does not depend on the launcher)

@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_parity_passes_for_a_correct_config(classify_cfg, tmp_path, capsys, strategy):
    classify_cfg["train"].update(strategy=strategy, per_device_train_batch_size=8)
    classify_cfg["scaling"] = {"launcher": "torchrun"}
    assert main(["parity", str(_write(classify_cfg, tmp_path)), "--workers", "2", "--steps", "8"]) == 0
    assert "PASS" in capsys.readouterr().err


def test_parity_fails_when_lr_scaling_is_wrong(classify_cfg, tmp_path, capsys):
    classify_cfg["train"].update(lr_scaling="linear", per_device_train_batch_size=8)  # doubles the LR at 2 workers
    classify_cfg["scaling"] = {"launcher": "torchrun"}
    assert main(["parity", str(_write(classify_cfg, tmp_path)), "--workers", "2", "--steps", "8"]) == 1
    err = capsys.readouterr().err.replace("\n", " ")
    assert "FAIL" in err and "learning rate 0.001 on 1 worker but 0.002 on 2" in err
