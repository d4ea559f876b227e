"""Streaming (#46 item 4): a run reads its JSON Lines shards while training (local or s3://), killed after a
checkpoint and resumed with `train --resume` on another number of workers, trains each record of the epoch once
and each step the same records as the run that was not killed (data.record_examples: the records' shard and
line), and the stream goes on into its next epoch."""

import json
import os
import shutil
from pathlib import Path

import pytest

from scaletrain.data.stream import ROW_BITS
from scaletrain.worker.seen import trained
from tests.cli import run_cli
from tests.conftest import make_bucket, write_config

pytestmark = pytest.mark.slow

CUT, STEPS, RECORDS = 4, 9, 30  # 9 steps of 4 records: 36, so the stream crosses into its second epoch


def _shards(folder: Path) -> list[str]:
    """Three shards of 10 records (a blank line in the first: not a record), with their ids."""
    folder.mkdir(parents=True, exist_ok=True)
    texts = []
    for s in range(3):
        lines = [json.dumps({"instruction": f"Count to {i % 9 + 1}.", "input": "",
                             "output": " ".join(str(k) for k in range(1, i % 9 + 2))})
                 for i in range(s * 10, s * 10 + 10)]
        if s == 0:
            lines.insert(4, "")
        texts.append("\n".join(lines) + "\n")
        (folder / f"part-{s}.jsonl").write_text(texts[-1])
    return texts


def _config(tmp_path: Path, root: str, workers: int, extra: dict | None = None) -> Path:
    cfg = {"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"},
           "data": {"train_file": root, "template": "alpaca", "max_length": 48, "streaming": True,
                    "buffer_size": 7, "record_examples": True},
           "train": {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 2 // workers,
                     "max_steps": STEPS, "learning_rate": 1e-3, "logging_steps": 1},
           "scaling": {"num_workers": workers, "launcher": "torchrun" if workers > 1 else "local"},
           "checkpoint": {"save_steps": CUT, "save_total_limit": 100},
           "output": {"output_dir": str(tmp_path / "runs"), "run_name": "whole"}, **(extra or {})}
    return write_config(tmp_path / "whole.yaml", cfg)


def _scaletrain(args: list[str]) -> str:
    out = run_cli(*args, "--no-progress", env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout + out.stderr


def _killed_after_cut(run: Path, into: Path) -> Path:
    def later(folder, names):
        return [n for n in names if n.startswith("step-") and int(n[5:]) > CUT] + \
               [n for n in names if n in ("final", "metrics.jsonl", "summary.json")]
    shutil.copytree(run, into, ignore=later)
    return into


def _check_resume(tmp_path: Path, whole: Path, before: int, after: int) -> None:
    seen = trained(whole / "examples")
    assert list(seen) == list(range(1, STEPS + 1))
    again = _killed_after_cut(whole, tmp_path / "runs" / "again")
    launcher = "torchrun" if after > 1 else "local"
    _scaletrain(["train", "--resume", str(again), f"scaling.num_workers={after}", f"scaling.launcher={launcher}"])
    assert f"resume: from step-{CUT}" in (again / "logs" / "main.log").read_text()
    resumed = trained(again / "examples")
    assert list(resumed) == list(seen)
    for step in seen:  # the same records each step, whichever size trained it
        assert sorted(resumed[step]["ids"]) == sorted(seen[step]["ids"]), step
    ids = [[i for i in resumed[step]["ids"]] for step in sorted(resumed)]
    every = {0 << ROW_BITS | line for line in (0, 1, 2, 3, 5, 6, 7, 8, 9, 10)} | {
        s << ROW_BITS | line for s in (1, 2) for line in range(10)}  # shard 0's line 5 is blank: not a record
    before_last = [i for step in ids[:7] for i in step]  # 28 records: all in the first epoch
    assert len(before_last) == len(set(before_last)) == 28 and set(before_last) < every
    assert set(before_last) | set(ids[7]) == every  # step 8 ends the first epoch and starts the second
    assert max(resumed[step]["epoch"] for step in resumed) == 1
    assert before_last != sorted(before_last)  # shuffled


def test_a_streamed_run_resumed_at_another_world_size_trains_each_record_once(tmp_path):
    _shards(tmp_path / "shards")
    out = _scaletrain(["train", str(_config(tmp_path, str(tmp_path / "shards"), 1))])
    assert "streaming 3 jsonl shard(s)" in out
    whole = tmp_path / "runs" / "whole"
    assert "stream: 36 records read by this rank, 0 skipped" in (whole / "logs" / "worker-0.log").read_text()
    _check_resume(tmp_path, whole, 1, 2)


def test_a_run_streams_from_s3_and_resumes(tmp_path, s3_server):
    import fsspec

    bucket = make_bucket(s3_server, "stream")
    fs = fsspec.filesystem("s3", endpoint_url=s3_server, skip_instance_cache=True)
    for s, text in enumerate(_shards(tmp_path / "shards")):
        fs.pipe_file(f"{bucket}/sft/part-{s}.jsonl", text.encode())
    cfg = _config(tmp_path, f"s3://{bucket}/sft/", 2, {"storage": {"endpoint_url": s3_server}})
    out = _scaletrain(["train", str(cfg)])
    assert f"streaming 3 jsonl shard(s) from s3://{bucket}/sft/" in out
    _check_resume(tmp_path, tmp_path / "runs" / "whole", 2, 1)
