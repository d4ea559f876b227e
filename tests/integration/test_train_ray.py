"""End-to-end runs on a shared local Ray with gloo: 1 and 2 workers, full and LoRA (that a 2-worker Ray run is
reproducible to the bit: test_reliability.py, whose runs interrupted and resumed on Ray end with the weights of
another, uninterrupted run of the same config). What the worker
loop does on 2 workers with other data formats and FSDP runs under torchrun (test_train_torchrun.py): the loop does
not depend on the launcher, and a torchrun job starts in about half a Ray one's time."""

import pytest

from scaletrain.errors import LaunchError
from tests.conftest import train_losses
from tests.integration.train_checks import check_run_dir, rank_evals, run

# the shared Ray up from the first test on: scaling.launcher auto runs on it, as the tests mean (without it, 2
# local workers would run under torchrun)
pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_local")]


@pytest.mark.parametrize("workers", [1, 2])
def test_classification_full_ddp(classify_cfg, tmp_path, workers, no_orphans):
    classify_cfg["train"].update(max_steps=80, logging_steps=10, eval_steps=40)
    classify_cfg["scaling"]["num_workers"] = workers
    classify_cfg["checkpoint"] = {"save_steps": 40, "save_total_limit": 1}
    result = run(classify_cfg, tmp_path, f"cls{workers}")
    summary = check_run_dir(result.run_dir, workers, 80)
    losses = train_losses(result.run_dir)
    assert losses[-1] < losses[0] * 0.7
    assert summary["final"]["eval/accuracy"] > 0.75
    evals = rank_evals(result.run_dir, workers)
    assert all(e == evals[0] for e in evals)  # all-reduced: bit-identical on every rank
    assert evals[0]["eval/loss"] == summary["final"]["eval/loss"]
    assert [p.name for p in (result.run_dir / "checkpoints").iterdir()] == ["step-80"]  # keep 1
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(result.run_dir / "final")
    assert sum(p.numel() for p in model.parameters()) > 0


def test_causal_lm_lora_ddp(demo_dir, tmp_path, no_orphans):
    """2 workers (1 worker of LoRA SFT: tests/loop/test_loop_local.py; 1 Ray worker: the classification run)."""
    workers = 2
    cfg = {
        "model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm", "finetuning_type": "lora"},
        "data": {"train_file": str(demo_dir / "alpaca.json"), "eval_ratio": 0.1, "max_length": 48},
        "train": {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "learning_rate": 5e-3,
                  "max_steps": 20, "logging_steps": 5},
        "scaling": {"num_workers": workers},
    }
    result = run(cfg, tmp_path, f"sft{workers}")
    summary = check_run_dir(result.run_dir, workers, 20)
    losses = train_losses(result.run_dir)
    assert losses[-1] < losses[0]
    assert summary["global_batch_size"] == 8 * workers and "eval/perplexity" in summary["final"]
    evals = rank_evals(result.run_dir, workers)
    assert all(e == evals[0] for e in evals)
    assert (result.run_dir / "final" / "adapter_model.safetensors").is_file()


def test_too_many_workers_is_a_clear_error_and_no_run_dir(classify_cfg, tmp_path, ray_local):
    classify_cfg["scaling"]["num_workers"] = 3
    with pytest.raises(LaunchError, match=r"scaling.num_workers=3 needs 3 CPUs .* the cluster has 2"):
        run(classify_cfg, tmp_path, "big")
    assert not (tmp_path / "runs" / "big").exists()


def test_nccl_without_gpu_is_a_clear_error(classify_cfg, tmp_path, ray_local):
    classify_cfg["comm"] = {"backend": "nccl"}
    with pytest.raises(LaunchError, match="comm.backend=nccl needs a GPU.*set comm.backend=gloo or auto"):
        run(classify_cfg, tmp_path, "nccl")
