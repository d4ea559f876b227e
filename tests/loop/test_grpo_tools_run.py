"""#74 item 3: GRPO with multi-turn tool rollouts, for real: a tiny model under Qwen3's released template that calls
a calculator (rl.tools) and guesses in a small environment (rl.environment, which owns a reward), its tool replies in
the context and out of the loss; the run logs TRL's tools/ metrics, counts the calls that raised, and 2 workers
sample the same conversations and train the same weights as 1 (each round of each completion drawn from its own
random stream)."""

import json
import random

import pytest

from scaletrain.launch.local import run_in_process
from scaletrain.metrics.records import read_jsonl
from tests.conftest import cli_train, local_spec
from tests.tool_model import tool_caller

pytestmark = [pytest.mark.loop, pytest.mark.slow]


@pytest.fixture(scope="module")
def caller(tmp_path_factory):
    return tool_caller(tmp_path_factory.mktemp("caller") / "model")


def _cfg(model, tmp_path, per_device: int = 8) -> dict:
    rng = random.Random(0)
    rows = [{"prompt": [{"role": "user", "content": f"What is {a}+{b}?"}], "answer": str(a + b)}
            for a, b in ((rng.randint(0, 9), rng.randint(0, 9)) for _ in range(32))]
    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"model": {"name_or_path": str(model), "task": "causal-lm", "finetuning_type": "full", "dropout": 0.0},
            "data": {"train_file": str(data), "formatting": "messages", "max_length": 2048, "eval_ratio": 0},
            "train": {"stage": "grpo", "per_device_train_batch_size": per_device, "max_steps": 3,
                      "learning_rate": 1e-3, "logging_steps": 1},
            "rl": {"reward_funcs": [f"{model}/tools.py:vowels"], "tools": [f"{model}/tools.py:add"],
                   "environment": f"{model}/tools.py:Counter", "num_generations": 4, "max_completion_length": 64,
                   "beta": 0.04, "loss_type": "bnpo"}}


def _records(run) -> list[dict]:
    return [r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]


def test_tool_rollouts_train_and_two_workers_sample_and_train_what_one_does(caller, tmp_path):
    _, _, spec = local_spec(_cfg(caller, tmp_path), tmp_path / "one")
    run_in_process(spec)
    one = _records(tmp_path / "one")
    assert len(one) == 3
    # the model called tools (some with arguments the calculator refuses: answered with the error, counted)
    assert all(r["tools/call_frequency"] > 0.5 for r in one) and any(r["tools/failure_frequency"] > 0 for r in one)
    assert all("rewards/Counter/mean" in r and "rewards/vowels/mean" in r for r in one)  # the environment's reward
    samples = (tmp_path / "one" / "samples.jsonl").read_text()
    assert "<tool_response>" in samples  # a reply in the context of what was sampled after it
    two = _records(cli_train(_cfg(caller, tmp_path, per_device=4), tmp_path, "two", workers=2))
    assert [r["reward"] for r in two] == pytest.approx([r["reward"] for r in one], rel=1e-9)
    assert [r["tools/call_frequency"] for r in two] == [r["tools/call_frequency"] for r in one]
    assert [r["train/loss"] for r in two] == pytest.approx([r["train/loss"] for r in one], rel=1e-4, abs=1e-6)
    assert [r["kl"] for r in two] == pytest.approx([r["kl"] for r in one], rel=1e-4, abs=1e-7)
