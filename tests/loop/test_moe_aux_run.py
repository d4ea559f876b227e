"""An MoE fine-tune with its load-balancing loss over the global batch, for real: a tiny Qwen3-MoE saved in bf16,
1 worker with 2 accumulation micro-batches against 2 workers (torchrun) with 1, the same global batch: the
language-model loss and the auxiliary loss (logged on its own; the router z-loss too, where asked) agree, full
fine-tuning under DDP and LoRA under FSDP; the start of the run says the coefficient and where it comes from."""

import json
import os
from pathlib import Path

import pytest
import torch

from scaletrain.metrics.records import read_jsonl
from tests.cli import run_cli
from tests.conftest import write_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_qwen3_moe(tmp_path_factory) -> Path:
    from tests.conftest import save_tiny_qwen3_moe

    return save_tiny_qwen3_moe(tmp_path_factory.mktemp("ckpt") / "tiny-qwen3-moe", torch.bfloat16)


def _train(tmp_path: Path, model: Path, name: str, workers: int, accumulation: int, finetuning: str,
           strategy: str, z: float | None) -> Path:
    data = tmp_path / "data.jsonl"
    if not data.exists():
        data.write_text("\n".join(json.dumps({"instruction": f"Count to {i % 7 + 1}.", "input": "",
                                              "output": " ".join(str(k) for k in range(1, i % 7 + 2))})
                                  for i in range(48)))
    cfg = {"model": {"name_or_path": str(model), "task": "causal-lm", "finetuning_type": finetuning,
                     "lora_rank": 4, "lora_alpha": 8},
           "data": {"train_file": str(data), "template": "alpaca", "max_length": 64, "eval_ratio": 0},
           "train": {"per_device_train_batch_size": 2, "gradient_accumulation_steps": accumulation,
                     "max_steps": 3, "learning_rate": 1e-3, "logging_steps": 1, "strategy": strategy,
                     "moe_z_loss_coef": z},
           "scaling": {"num_workers": workers, "launcher": "torchrun" if workers > 1 else "local"},
           "output": {"output_dir": str(tmp_path / "runs"), "run_name": name}}
    out = run_cli("train", write_config(tmp_path / f"{name}.yaml", cfg), "--no-progress",
                  env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
    assert out.returncode == 0, out.stderr[-3000:]
    return tmp_path / "runs" / name


@pytest.mark.parametrize("finetuning,strategy,z", [("full", "ddp", None), ("lora", "fsdp", 1e-3)])
def test_one_and_two_workers_give_the_same_lm_and_aux_loss(tmp_path, tiny_qwen3_moe, finetuning, strategy, z):
    one = _train(tmp_path, tiny_qwen3_moe, "one", 1, 2, finetuning, strategy, z)
    two = _train(tmp_path, tiny_qwen3_moe, "two", 2, 1, finetuning, strategy, z)
    curves = [[r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"] for run in (one, two)]
    assert [len(c) for c in curves] == [3, 3]
    for a, b in zip(*curves):
        assert b["train/loss"] == pytest.approx(a["train/loss"], rel=1e-5)
        assert b["train/moe_aux_loss"] == pytest.approx(a["train/moe_aux_loss"], rel=1e-5)
        assert ("train/moe_z_loss" in a) == (z is not None)  # the router z-loss (ST-MoE) only where asked
        if z is not None:
            assert b["train/moe_z_loss"] == pytest.approx(a["train/moe_z_loss"], rel=1e-4) and a["train/moe_z_loss"] > 0
    assert 1.0 < curves[0][0]["train/moe_aux_loss"] < 4.0  # E x sum_e f_e P_e: top-k (2) when balanced
    shares = curves[1][-1]["moe/expert_shares"]  # the router's health: layer x expert, 1.0 a fair share
    assert len(shares) == 2 and all(len(row) == 4 and sum(row) == pytest.approx(4.0, abs=1e-3) for row in shares)
    assert len(curves[1][-1]["moe/router_entropy"]) == 2 and (two / "experts.png").stat().st_size > 10_000
    log = (one / "logs" / "main.log").read_text()
    assert "4 experts, top-2; load-balancing loss over the global batch" in log
    assert "coefficient 0.01 (the checkpoint's router_aux_loss_coef" in log
