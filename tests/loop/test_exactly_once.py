"""Exactly-once at any world size (#46 item 3): a run killed mid-epoch after a checkpoint and resumed with
`train --resume` on another number of workers trains each example of the epoch once, and each step the same
examples as the run that was not killed, packed (2 -> 1 workers) and padded with balanced ranks (1 -> 2), read
from the record every rank writes (data.record_examples, worker/seen.py)."""

import json
import os
import shutil
from pathlib import Path

import pytest

from scaletrain.worker.seen import trained
from tests.cli import run_cli
from tests.conftest import write_config

pytestmark = pytest.mark.slow

CUT = 3  # the checkpoint the killed run is resumed from


def _train(tmp_path: Path, workers: int, packing: bool) -> Path:
    data = tmp_path / "count.jsonl"
    data.write_text("\n".join(json.dumps({"instruction": f"Count to {i % 9 + 1}.", "input": "",
                                          "output": " ".join(str(k) for k in range(1, i % 9 + 2))})
                              for i in range(96)))
    cfg = {"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"},
           "data": {"train_file": str(data), "template": "alpaca", "max_length": 48, "eval_ratio": 0.0,
                    "packing": packing, "record_examples": True},
           "train": {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 2 // workers,
                     "num_train_epochs": 1, "learning_rate": 1e-3, "logging_steps": 1},
           "scaling": {"num_workers": workers, "launcher": "torchrun" if workers > 1 else "local"},
           "checkpoint": {"save_steps": CUT, "save_total_limit": 100},
           "output": {"output_dir": str(tmp_path / "runs"), "run_name": "whole"}}
    _scaletrain(["train", write_config(tmp_path / "whole.yaml", cfg)])
    return tmp_path / "runs" / "whole"


def _scaletrain(args: list[str]) -> None:
    out = run_cli(*args, "--no-progress", env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
    assert out.returncode == 0, out.stderr[-3000:]


def _killed_after_cut(run: Path, into: Path) -> Path:
    """The run as if killed after its step-CUT checkpoint: later checkpoints, metrics and final gone; its record
    keeps the steps it trained after the checkpoint (what the resume must supersede)."""
    def later(folder, names):
        return [n for n in names if n.startswith("step-") and int(n[5:]) > CUT] + \
               [n for n in names if n in ("final", "metrics.jsonl", "summary.json")]
    shutil.copytree(run, into, ignore=later)
    return into


@pytest.mark.parametrize("packing,before,after", [(True, 2, 1), (False, 1, 2)], ids=["packed-2to1", "padded-1to2"])
def test_a_resume_at_another_world_size_trains_each_example_once(tmp_path, packing, before, after):
    import datasets

    whole = _train(tmp_path, before, packing)
    seen = trained(whole / "examples")
    again = _killed_after_cut(whole, tmp_path / "runs" / "again")
    assert max(trained(again / "examples")) > CUT  # the killed attempt recorded steps past its checkpoint
    launcher = "torchrun" if after > 1 else "local"
    _scaletrain(["train", "--resume", str(again), f"scaling.num_workers={after}", f"scaling.launcher={launcher}"])
    assert f"resume: from step-{CUT}" in (again / "logs" / "main.log").read_text()
    assert sorted(p.name for p in (again / "examples").iterdir()) == sorted(
        [f"from-step-1-rank-{r}.jsonl" for r in range(before)] + [f"from-step-{CUT + 1}-rank-{r}.jsonl"
                                                                   for r in range(after)])
    resumed = trained(again / "examples")
    assert list(resumed) == list(seen) == list(range(1, len(seen) + 1)) and len(seen) > CUT + 1
    for step in seen:  # the same examples each step, whichever size trained it
        assert sorted(resumed[step]["ids"]) == sorted(seen[step]["ids"]), step
    ids = [i for step in resumed.values() for i in step["ids"]]
    assert len(ids) == len(set(ids))  # each example once
    train = datasets.load_from_disk(json.loads((whole / "data" / "source.json").read_text())["train"])
    examples = sum(train["examples"]) if packing else len(train)
    global_batch = 4  # 2 per device x 2 (accumulation x workers)
    if packing:  # whole rows: the rows the epoch leaves out are fewer than a step's
        left = sorted(set(range(examples)) - set(ids))
        assert sorted(ids + left) == list(range(examples))
        assert len(train) - len(seen) * global_batch < global_batch
    else:
        assert len(ids) == len(seen) * global_batch and examples - len(ids) < global_batch
