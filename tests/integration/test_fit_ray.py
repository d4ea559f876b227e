"""Fitting big models on the shared local Ray, 2 CPU workers: sharded checkpoints resume on another world size,
async saves, elastic resizing (the memory levers, the memory estimate and bf16 checkpoints: test_fit_torchrun.py)."""

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import run_own_group, train_losses
from tests.integration.fit_runs import _run

pytestmark = pytest.mark.ray


def _resume_cli(run_dir, *overrides):
    """`scaletrain train --resume RUN_DIR k=v ...`, in this process (the shared local Ray)."""
    import argparse

    from scaletrain.commands import train as train_command

    args = argparse.Namespace(config=None, overrides=list(overrides), resume=str(run_dir), force_resume=False,
                              no_progress=True)
    assert train_command.run(args) == 0


@pytest.fixture(scope="module")
def cut_fsdp_run(tmp_path_factory, ray_local):
    """An uninterrupted 2-worker FSDP run and the same run cut at step 7 (rank 1 dies after step-6 was saved),
    shared by the resumes below (each resumes its own copy). Both under torchrun (a job starts in about half a Ray
    one's time; what they save does not depend on the launcher): the resumes run on Ray."""
    import os

    from scaletrain.errors import TrainingError

    tmp_path = tmp_path_factory.mktemp("cut")
    common = dict(strategy="fsdp", steps=12, batch=2, gradient_accumulation_steps=2, save_steps=6, launcher="torchrun")
    reference = train_losses(_run(tmp_path, "ref", **common))
    os.environ["SCALETRAIN_FAULTS"] = "exit:1:7"
    try:
        with pytest.raises(TrainingError):
            _run(tmp_path, "cut", **common)
    finally:
        del os.environ["SCALETRAIN_FAULTS"]
    return tmp_path, reference


@pytest.mark.parametrize("workers", [1, 4])
def test_a_sharded_checkpoint_resumes_on_another_world_size_with_the_same_steps(cut_fsdp_run, tmp_path, no_orphans,
                                                                               workers):
    """Saved by 2 FSDP workers (each its own shard), resumed on 1 or 4: the global batch is kept (accumulation
    recomputed), the data position carried as steps, so the resumed steps train on the same samples as the
    uninterrupted 2-worker run: the same losses (parity tolerance), no sample repeated or skipped."""
    shared, reference = cut_fsdp_run
    run = tmp_path / "runs" / "cut"
    shutil.copytree(shared / "runs" / "cut", run)
    assert [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("step-")] == ["step-6"]
    assert sorted(p.name for p in (run / "checkpoints" / "step-6" / "state").glob("*.distcp")) == \
        ["__0_0.distcp", "__1_0.distcp"]  # a shard per rank
    # 4 workers on 2 cores: Ray's fractional CPUs (torchrun refuses more processes than cores); 1 under torchrun
    on = ["scaling.launcher=ray", "scaling.resources_per_worker={'CPU': 0.5}"] if workers == 4 else \
        ["scaling.launcher=torchrun"]
    _resume_cli(run, f"scaling.num_workers={workers}", *on)
    log = (run / "logs" / "main.log").read_text()
    assert "resume: from step-6: step 6" in log and f"{workers} worker(s)" in log
    by_step = _losses_by_step(run)
    ref_by_step = _losses_by_step(shared / "runs" / "ref")
    for step in range(7, 13):  # the resumed steps: the same samples, the same token mean
        assert by_step[step] == pytest.approx(ref_by_step[step], rel=1e-5), (step, by_step, ref_by_step)
    assert reference == [ref_by_step[s] for s in sorted(ref_by_step)]


def _losses_by_step(run):
    from scaletrain.metrics.records import read_jsonl

    out = {}
    for r in read_jsonl(run / "metrics.jsonl"):
        if r["kind"] == "train":
            out[r["step"]] = r["train/loss"]  # a step trained again after a restart: the last one counts
    return out


def test_async_save_writes_the_same_checkpoints_and_resumes_exactly(tmp_path, ray_local, no_orphans):
    common = dict(strategy="fsdp", steps=8, save_steps=4)
    sync = _run(tmp_path, "sync", launcher="torchrun", **common)  # the reference: any launcher, the faster one
    run = _run(tmp_path, "async", async_save=True, tokenize_on="cluster", overwrite_cache=True, **common)
    # tokenized by Ray tasks (joined before the data is prepared), into the same data: the same losses below
    assert "Ray tasks on 1 node(s)" in (run / "logs" / "main.log").read_text()
    from scaletrain import checkpoint

    names = [p.name for p in checkpoint.list_checkpoints(run / "checkpoints")]
    assert names == ["step-4", "step-8"] and all(checkpoint.verify(run / "checkpoints" / n) is None for n in names)
    assert not any(p.name.startswith(".tmp-") for p in (run / "checkpoints").iterdir())
    assert train_losses(run) == train_losses(sync)  # training did not change while the shards were written
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    for name, r in (("s", sync), ("a", run)):
        dcp_to_torch_save(str(r / "checkpoints" / "step-8" / "state"), str(tmp_path / f"{name}.pt"))
    import torch

    a, b = torch.load(tmp_path / "s.pt", weights_only=True), torch.load(tmp_path / "a.pt", weights_only=True)
    assert a["model"].keys() == b["model"].keys()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def test_elastic_run_shrinks_on_a_lost_node_and_grows_back_with_the_same_curve(tmp_path, ray_local, no_orphans):
    """num_workers: [1, 2] on a simulated 2-node cluster: a node is lost mid-run and the run goes on with 1 worker
    (accumulation doubled); the node comes back and the run grows to 2 workers again (accumulation halved).
    Every step's loss equals the fixed 2-worker run's: the same samples (each once), global batch and LR
    schedule. The elastic run's rank 0 is made 400 ms slower a step (a `slow` fault: the losses do not change) so
    that its 160 steps outlast the shrink and the grow-back, 12-35 s after the node returns (~step 30, at most ~90
    on a slower machine, whose steps are slower too), by a wide margin; the fixed reference runs at full speed
    (under torchrun: any launcher gives the same curve, test_torchrun.py)."""
    import os
    import sys

    steps = 160
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
    env = {**os.environ, "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "30", "SCALETRAIN_FAULTS": "slow:0:1:400"}
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


def test_an_elastic_context_parallel_run_starts_whole_groups_where_ray_has_room_for_one_more(tmp_path, ray_local,
                                                                                            no_orphans):
    """num_workers: [2, 4] with context_parallel: 2 on a simulated cluster of 3 one-CPU nodes: Ray's own elastic
    policy would start 3 workers, which cannot form the data x context mesh; the run starts 2 (one CP group, data
    parallel 1), trains and finishes. The same config with Ray's policy fails (checked)."""
    import os
    import sys

    rows = [{"instruction": f"Count to {i % 9 + 1}.", "input": "", "output": " ".join(map(str, range(1, i % 9 + 2)))}
            for i in range(40)]
    (tmp_path / "count.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    cfg = {
        "model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm", "dropout": 0.0},
        "data": {"train_file": str(tmp_path / "count.jsonl"), "eval_ratio": 0.0, "max_length": 64,
                 "template": "alpaca"},
        "train": {"per_device_train_batch_size": 2, "max_steps": 3, "logging_steps": 1, "strategy": "fsdp",
                  "learning_rate": 1e-3},
        "scaling": {"num_workers": [2, 4], "context_parallel": 2, "elastic_resize_interval_s": 600},
        "checkpoint": {"save_steps": 0}, "monitor": {"report": False},
        "output": {"output_dir": str(tmp_path / "runs"), "run_name": "elastic"},
    }
    (tmp_path / "elastic.json").write_text(json.dumps(cfg))
    proc = run_own_group([sys.executable, str(Path(__file__).with_name("elastic_run.py")),
                          str(tmp_path / "elastic.json"), "groups"], timeout=600, env=dict(os.environ))
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(line[len("RESULT "):])
    assert out["status"] == "finished", out
    assert set(out["workers"].values()) == {2} and sorted(map(int, out["workers"])) == [1, 2, 3], out["workers"]
    log = (tmp_path / "runs" / "elastic" / "logs" / "main.log").read_text()
    assert "context parallel" in log.lower(), log[-2000:]
