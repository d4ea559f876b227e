"""Elastic resizing on a simulated Ray cluster (ray.cluster_utils, in a harness process of its own): a run shrinks
when a node is lost and grows back, with the fixed run's curve. The decisions under it, the size a restart asks for
and whole context-parallel groups among them, run in milliseconds in tests/unit/test_restart_decisions.py.
Each cluster keeps to its own session and TMPDIR (run_own_group), apart from the suite's shared Ray, so these run
beside the Ray group under make test (`ray_head`)."""

import json
from pathlib import Path

import pytest

from tests.conftest import run_own_group
from tests.integration.fit_runs import _losses_by_step, _run

pytestmark = pytest.mark.ray_head


def test_elastic_run_shrinks_on_a_lost_node_and_grows_back_with_the_same_curve(tmp_path):
    """num_workers: [1, 2] on a simulated 2-node cluster: a node is lost mid-run and the run goes on with 1 worker
    (accumulation doubled); the node comes back and the run grows to 2 workers again (accumulation halved).
    Every step's loss equals the fixed 2-worker run's: the same samples (each once), global batch and LR
    schedule. The elastic run's rank 0 sleeps 650 ms before each step (a `pause` fault: the losses do not change,
    and no CPU is spent, where a `slow` one's busy-wait cost 64 CPU-seconds of the suite) so that its 100 steps
    outlast the shrink and the grow-back, 12-35 s after the node returns (step 25 on a quiet machine with its
    workers forked; 160 steps at 400 ms lasted as long and trained 60% more steps, twice over: ~100 CPU-seconds
    of the suite), by a margin; the fixed reference runs at full speed (under torchrun: any launcher gives the
    same curve, test_torchrun.py)."""
    import os
    import sys

    steps = 100
    # enough data and a gentle LR that the run learns rather than memorises: memorising 400 examples for 30
    # epochs amplifies float rounding (the order of a 2-term sum) into 1e-1 loss differences within 100 steps
    common = dict(steps=steps, batch=2, save_steps=5, rows=4000, learning_rate=5e-4)
    fixed = _losses_by_step(_run(tmp_path, "fixed", workers=2, launcher="torchrun", **{**common, "save_steps": 0}))
    cfg = {
        "model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm", "dropout": 0.0},
        "data": {"train_file": str(tmp_path / "sft-4000.jsonl"), "eval_ratio": 0.02, "max_length": 64,
                 "template": "alpaca", "packing": True, "max_truncated_ratio": 1.0},  # as the fixed run's
        "train": {"per_device_train_batch_size": 2, "per_device_eval_batch_size": 2, "learning_rate": 5e-4,
                  "max_steps": steps, "logging_steps": 1, "seed": 3, "max_grad_norm": 0.0},
        "scaling": {"num_workers": [1, 2], "elastic_resize_interval_s": 2.0},
        "checkpoint": {"save_steps": 5}, "fault_tolerance": {"max_failures": -1},
        "monitor": {"report": False},
        "output": {"output_dir": str(tmp_path / "runs"), "run_name": "elastic"},
    }
    (tmp_path / "elastic.json").write_text(json.dumps(cfg))
    # After the loss Ray's first restart still asks for 2 workers and waits out the worker group's start timeout
    # (60 s by default; RESULTS.md) before it tries 1: 30 s here, still 4x the 7 s a 1-worker start takes
    env = {**os.environ, "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "30", "SCALETRAIN_FAULTS": "pause:0:1:650"}
    proc = run_own_group([sys.executable, str(Path(__file__).with_name("elastic_run.py")),
                          str(tmp_path / "elastic.json")], timeout=600, env=env)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(line[len("RESULT "):])
    assert out["status"] == "finished", out
    resizes = " ".join(out["resizes"])
    assert "resize: from 2 to 1 worker(s)" in resizes and "gradient_accumulation_steps 1 -> 2" in resizes, resizes
    assert "resize: from 1 to 2 worker(s)" in resizes and "gradient_accumulation_steps 2 -> 1" in resizes, resizes
    assert "(elastic: fewer workers fit (a worker or its node was lost" in resizes, resizes  # why
    assert "(elastic: more workers fit)" in resizes and " s since the last step" in resizes, resizes  # time lost
    assert out["alerts"].count("throughput_drop") <= 2, out["alerts"]  # a resize changes the speed: no alert storm
    by_step = [out["workers"][str(s)] for s in range(1, steps + 1)]
    phases = [w for i, w in enumerate(by_step) if i == 0 or by_step[i - 1] != w]
    assert phases == [2, 1, 2], phases  # each record says the scale it trained at
    grown = {int(k): v for k, v in out["losses"].items()}
    print("ELASTIC", {k: out[k] for k in out if k not in ("losses", "workers")})
    assert sorted(grown) == sorted(fixed) == list(range(1, steps + 1))  # every step once, none skipped
    for step in fixed:  # identical before the resize; after it, float sums in another order
        assert grown[step] == pytest.approx(fixed[step], rel=1e-5 if step <= 10 else 1e-4), step
