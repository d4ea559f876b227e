"""Context parallelism in a real run (torchrun, gloo): a tiny Llama trained 10 steps on 2 workers with each sequence
split over both (scaling.context_parallel: 2, data parallel 1) against 1 worker with whole sequences, the same
global batch: every step's loss, the eval loss and the final weights agree to 1e-5, full fine-tuning and LoRA,
packed and padded rows, with and without gradient accumulation, under FSDP with activation checkpointing; the
start of the run says the mesh."""

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
def tiny_llama(tmp_path_factory) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    from scaletrain.model.tokenizer import tiny_llama_tokenizer

    d = tmp_path_factory.mktemp("ckpt") / "tiny-llama"
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=2048, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, intermediate_size=128)).save_pretrained(d)
    tiny_llama_tokenizer().save_pretrained(d)
    return d


def _data(tmp_path: Path, stage: str) -> Path:
    data = tmp_path / f"{stage}.jsonl"
    if stage == "dpo":  # pairs: the right count chosen, a wrong one rejected
        rows = [{"instruction": f"Count to {i % 9 + 1}.", "input": "",
                 "chosen": " ".join(str(k) for k in range(1, i % 9 + 2)),
                 "rejected": " ".join(str(k) for k in range(2, i % 9 + 4))} for i in range(64)]
    else:
        rows = [{"instruction": f"Count to {i % 9 + 1}.", "input": "",
                 "output": " ".join(str(k) for k in range(1, i % 9 + 2))} for i in range(64)]
    data.write_text("\n".join(json.dumps(r) for r in rows))
    return data


def _cfg(tmp_path: Path, model: Path, name: str, workers: int, cp: int, finetuning: str, packing: bool,
         method: str, stage: str = "sft", accumulation: int = 1, save_steps: int = 0) -> dict:
    data = _data(tmp_path, stage)
    return {"model": {"name_or_path": str(model), "task": "causal-lm", "finetuning_type": finetuning,
                      "lora_rank": 4, "lora_alpha": 8},
            "data": {"train_file": str(data), "template": "alpaca", "max_length": 64, "eval_ratio": 0.1,
                     "packing": packing},
            "train": {"per_device_train_batch_size": 2, "max_steps": 10, "learning_rate": 1e-3, "logging_steps": 1,
                      "strategy": "fsdp", "gradient_checkpointing": True, "eval_steps": 10, "stage": stage,
                      "gradient_accumulation_steps": accumulation},
            "scaling": {"num_workers": workers, "launcher": "torchrun" if workers > 1 else "local",
                        "context_parallel": cp, "context_parallel_method": method},
            "checkpoint": {"save_steps": save_steps},
            "output": {"output_dir": str(tmp_path / "runs"), "run_name": name}}


def _train(tmp_path: Path, model: Path, name: str, workers: int, cp: int, finetuning: str, packing: bool,
           method: str, stage: str = "sft", accumulation: int = 1, save_steps: int = 0) -> Path:
    cfg = _cfg(tmp_path, model, name, workers, cp, finetuning, packing, method, stage, accumulation, save_steps)
    out = run_cli("train", write_config(tmp_path / f"{name}.yaml", cfg), "--no-progress",
                  env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
    assert out.returncode == 0, out.stderr[-3000:]
    return tmp_path / "runs" / name


def _weights(run: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out = {}
    for f in sorted((run / "final").glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _assert_adam_close(ours: torch.Tensor, theirs: torch.Tensor, key: str, lr: float = 1e-3) -> None:
    """Weights 10 Adam steps apart from a float-order difference: Adam divides each element's update by the root of
    its own squared gradients, so an element whose gradients stay near zero moves a visible fraction of lr on a
    rounding difference (measured: one element of o_proj's 8192 by 1.2e-5, every other within 1.3e-6). All
    within a tenth of lr, and no more than one in a thousand beyond 1e-5."""
    torch.testing.assert_close(ours, theirs, rtol=0, atol=lr / 10, msg=key)
    off = ((ours - theirs).abs() > 1e-5 + 1e-5 * theirs.abs()).sum().item()
    assert off <= max(1, theirs.numel() // 1000), (key, off, theirs.numel())


@pytest.mark.parametrize("finetuning,packing,method,accumulation", [("full", True, "ulysses", 1),
                                                                   ("lora", False, "ring", 2)])
def test_context_parallel_two_trains_as_one(tmp_path, tiny_llama, finetuning, packing, method, accumulation):
    one = _train(tmp_path, tiny_llama, "one", 1, 1, finetuning, packing, method, accumulation=accumulation)
    two = _train(tmp_path, tiny_llama, "two", 2, 2, finetuning, packing, method, accumulation=accumulation)
    records = [read_jsonl(run / "metrics.jsonl") for run in (one, two)]
    curves = [[r for r in rs if r["kind"] == "train"] for rs in records]
    assert [len(c) for c in curves] == [10, 10]
    for a, b in zip(*curves):
        assert b["train/loss"] == pytest.approx(a["train/loss"], rel=1e-5)
        assert b["throughput/samples_per_s"] > 0
    evals = [[r for r in rs if r["kind"] == "eval"][-1] for rs in records]
    assert evals[1]["eval/loss"] == pytest.approx(evals[0]["eval/loss"], rel=1e-5)
    assert evals[1]["eval/tokens"] == evals[0]["eval/tokens"]  # each target counted once over the group
    ours, theirs = _weights(two), _weights(one)
    assert set(ours) == set(theirs) and ours
    for key in ours:
        _assert_adam_close(ours[key], theirs[key], key)
    log = (two / "logs" / "main.log").read_text()
    assert f"context parallel 2 x data parallel 1 ({method}" in log


def test_dpo_with_context_parallel_trains_as_one(tmp_path, tiny_llama):
    """Both sides of a pair are rows of one batch, so on one group; each sequence's log-probability is its shards'
    sum over the group: the full-fine-tuning DPO run (a frozen reference, sharded like the policy) of 2 workers with
    CP 2 records the 1-worker run's losses, rewards and eval."""
    one = _train(tmp_path, tiny_llama, "one", 1, 1, "full", False, "auto", stage="dpo")
    two = _train(tmp_path, tiny_llama, "two", 2, 2, "full", False, "auto", stage="dpo")
    records = [read_jsonl(run / "metrics.jsonl") for run in (one, two)]
    curves = [[r for r in rs if r["kind"] == "train"] for rs in records]
    assert [len(c) for c in curves] == [10, 10]
    for a, b in zip(*curves):
        for key in ("train/loss", "rewards/chosen", "rewards/margins", "logps/rejected"):
            # the log-probabilities reach -172, where one fp32 ulp is 1.5e-5 (measured: logps/rejected 1 ulp
            # apart); a reward is beta (0.1) x a difference of two, a margin a difference of two rewards: ~3e-6
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-5), key
    evals = [[r for r in rs if r["kind"] == "eval"][-1] for rs in records]
    assert evals[1]["eval/pairs"] == evals[0]["eval/pairs"] > 0  # each pair counted once over the group
    assert evals[1]["eval/loss"] == pytest.approx(evals[0]["eval/loss"], rel=1e-5)


def test_a_context_parallel_checkpoint_resumes_on_one_rank(tmp_path, tiny_llama):
    """The step-5 checkpoint of a CP 2 run (2 ranks, FSDP) resumed with `train --resume RUN` on 1 worker without
    context parallelism (the same data-parallel size, so the same global batch): it reshards, keeps the data
    position, and trains the CP 2 run's steps 6-10 and final weights. (CP 2 x DP 2 on 4 processes:
    tests/loop/test_context_parallel.py; torchrun here refuses 4 processes on 2 CPUs.)"""
    import shutil

    two = _train(tmp_path, tiny_llama, "two", 2, 2, "full", True, "ring", save_steps=5)
    whole = [r for r in read_jsonl(two / "metrics.jsonl") if r["kind"] == "train"]
    again = tmp_path / "runs" / "again"  # the run as if stopped after its step-5 checkpoint
    shutil.copytree(two, again, ignore=shutil.ignore_patterns("step-10", "final", "metrics.jsonl", "summary.json"))
    out = run_cli("train", "--resume", again, "--no-progress", "scaling.num_workers=1", "scaling.context_parallel=1",
                  "scaling.launcher=local", env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resume: from step-5" in (again / "logs" / "main.log").read_text()
    resumed = [r for r in read_jsonl(again / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in resumed] == list(range(6, 11))
    for r in resumed:
        assert r["train/loss"] == pytest.approx(whole[r["step"] - 1]["train/loss"], rel=1e-5)
    ours, theirs = _weights(again), _weights(two)
    for key in ours:
        torch.testing.assert_close(ours[key], theirs[key], rtol=1e-5, atol=1e-5, msg=key)


@pytest.fixture(scope="module")
def tiny_qwen3_moe(tmp_path_factory) -> Path:
    from tests.conftest import save_tiny_qwen3_moe

    return save_tiny_qwen3_moe(tmp_path_factory.mktemp("ckpt") / "tiny-qwen3-moe")  # fp32: exact on the CPU


def test_an_moe_with_context_parallel_pools_its_router_loss_as_one(tmp_path, tiny_qwen3_moe):
    """Qwen3-MoE, padded rows, 2 accumulation micro-batches (the router counts the step's assignments ahead, a
    forward per micro-batch): CP 2 records the 1-worker run's language-model and load-balancing losses; each
    rank's router counts only its own real tokens (the padding masked on its shard too)."""
    one = _train(tmp_path, tiny_qwen3_moe, "one", 1, 1, "lora", False, "auto", accumulation=2)
    two = _train(tmp_path, tiny_qwen3_moe, "two", 2, 2, "lora", False, "auto", accumulation=2)
    curves = [[r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"] for run in (one, two)]
    assert [len(c) for c in curves] == [10, 10]
    for a, b in zip(*curves):
        assert b["train/loss"] == pytest.approx(a["train/loss"], rel=1e-5)
        assert b["train/moe_aux_loss"] == pytest.approx(a["train/moe_aux_loss"], rel=1e-5)
