"""The drills that need two nodes, on one simulated 2-node Ray cluster (ray.cluster_utils, 1 CPU a node) in a
harness process of its own (two_node_drills.py; its own session and TMPDIR, run_own_group, apart from the suite's
shared Ray, so these run beside the Ray group under make test): the harness runs every drill once, one after
another, on the same cluster, and each test here checks its own drill's part of what it printed.

- STRICT_SPREAD puts one rank on each node, and main.log says which (also with the run directory on object
  storage); commbench across the nodes reports the across-node rows;
- a worker's likely hardware fault: the restarted worker group leaves its node out;
- elastic: a run shrinks when a node is lost and grows back, with the fixed run's curve (the decisions under it,
  the size a restart asks for and whole context-parallel groups among them, run in milliseconds in
  tests/unit/test_restart_decisions.py);
- tokenization by Ray tasks on both nodes writes the cache the driver writes, also when a node dies mid-task."""

import json
import os
import re
import sys
from pathlib import Path

import pytest

from scaletrain.data.spread import PARALLEL_ROWS
from tests.conftest import classify_dict, make_bucket, run_own_group
from tests.integration.fit_runs import _losses_by_step, _rows, _run

# one harness for the module (a module-scoped fixture: its tests keep to one pytest worker, tests/conftest.py)
pytestmark = pytest.mark.ray_head

ELASTIC_STEPS = 100
# the elastic run and its fixed reference (test_elastic_run_...): enough data and a gentle LR that the run learns
# rather than memorises (memorising 400 examples for 30 epochs amplifies float rounding, the order of a 2-term
# sum, into 1e-1 loss differences within 100 steps)
ELASTIC = dict(steps=ELASTIC_STEPS, batch=2, rows=4000, learning_rate=5e-4)


@pytest.fixture(scope="module")
def drills(tmp_path_factory, demo_dir, s3_server):
    """The harness run once: (its parts' results by name, the folder of their runs)."""
    tmp = tmp_path_factory.mktemp("two-nodes")
    spec = {}

    # spread: a 2-worker run, one rank a node; the same job on object storage; commbench across the nodes
    cfg = classify_dict(demo_dir, tmp)
    cfg["train"].update(max_steps=6, logging_steps=2)
    cfg["scaling"] = {"num_workers": 2, "placement_strategy": "STRICT_SPREAD"}
    cfg["output"] = {"output_dir": str(tmp / "runs"), "run_name": "spread"}
    bucket = make_bucket(s3_server, "multinode")
    stored = {**cfg, "checkpoint": {"save_steps": 3}, "output": {"output_dir": f"s3://{bucket}/runs",
                                                                 "run_name": "spread"},
              "storage": {"endpoint_url": s3_server, "mirror_dir": str(tmp / "mirror"),
                          "node_dir": str(tmp / "nodes")}}
    spec["spread"] = {"cfg": cfg, "stored": stored, "bench_dir": str(tmp / "bench")}

    # exclusion: the one worker fails with a GPU fault (injected: the ECC count a CPU cannot raise) at step 3
    cfg = classify_dict(demo_dir, tmp)
    cfg["train"].update(max_steps=6, logging_steps=1)
    cfg.update(checkpoint={"save_steps": 2}, fault_tolerance={"max_failures": 1},
               output={"output_dir": str(tmp / "runs"), "run_name": "exclusion"})
    spec["exclusion"] = {"cfg": cfg, "faults": "ecc:0:3"}

    # elastic: num_workers [1, 2]; rank 0 sleeps 650 ms before each step (a `pause` fault: the losses do not
    # change, and no CPU is spent, where a `slow` one's busy-wait cost 64 CPU-seconds of the suite) so that its 100
    # steps outlast the shrink and the grow-back, 12-35 s after the node returns (step 25 on a quiet machine with
    # its workers forked; 160 steps at 400 ms lasted as long and trained 60% more steps), by a margin
    data = tmp / f"sft-{ELASTIC['rows']}.jsonl"  # the data file fit_runs._run writes for the fixed run
    data.write_text("\n".join(json.dumps(r) for r in _rows(ELASTIC["rows"])))
    spec["elastic"] = {"faults": "pause:0:1:650", "cfg": {
        "model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm", "dropout": 0.0},
        "data": {"train_file": str(data), "eval_ratio": 0.02, "max_length": 64, "template": "alpaca",
                 "packing": True, "max_truncated_ratio": 1.0},  # as the fixed run's (fit_runs._run)
        "train": {"per_device_train_batch_size": 2, "per_device_eval_batch_size": 2,
                  "learning_rate": ELASTIC["learning_rate"], "max_steps": ELASTIC_STEPS, "logging_steps": 1,
                  "seed": 3, "max_grad_norm": 0.0},
        "scaling": {"num_workers": [1, 2], "elastic_resize_interval_s": 2.0},
        "checkpoint": {"save_steps": 5}, "fault_tolerance": {"max_failures": -1},
        "monitor": {"report": False},
        "output": {"output_dir": str(tmp / "runs"), "run_name": "elastic"}}}

    # tokenize: a source past the parallel threshold, two records with no reply in different shards
    rows = [{"instruction": f"Count to {i % 9 + 1}.", "input": "", "output": " ".join(map(str, range(i % 9 + 1)))}
            for i in range(PARALLEL_ROWS + 5000)]
    for i in (7, 15_001):
        rows[i]["output"] = ""
    (tmp / "big.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    spec["tokenize"] = {"data": str(tmp / "big.jsonl"), "out": str(tmp / "tokenized")}

    (tmp / "spec.json").write_text(json.dumps(spec))
    # After the elastic run's node is lost, Ray's first restart still asks for 2 workers and waits out the worker
    # group's start timeout (60 s by default; RESULTS.md) before it tries 1: 30 s here, still 4x the 7 s a 1-worker
    # start takes (the other drills' groups start in seconds)
    env = {**os.environ, "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "30"}
    proc = run_own_group([sys.executable, str(Path(__file__).with_name("two_node_drills.py")), str(tmp / "spec.json")],
                         timeout=900, env=env)
    results = {line.split(" ", 2)[1]: json.loads(line.split(" ", 2)[2])
               for line in proc.stdout.splitlines() if line.startswith("RESULT ")}
    results["output"] = proc.stdout[-3000:] + proc.stderr[-3000:]
    return results, tmp


def _part(drills, name: str) -> dict:
    results, _ = drills
    assert name in results, results["output"]
    assert "error" not in results[name], results[name]["error"]
    return results[name]


def test_strict_spread_over_two_nodes(drills, s3_server):
    """Also on object storage: the same job, its run directory on the S3 server, each rank on its own node."""
    out, tmp = _part(drills, "spread"), drills[1]
    assert out["steps"] == 6 and out["stored_steps"] == 6
    import fsspec

    fs = fsspec.filesystem("s3", endpoint_url=s3_server, skip_instance_cache=True)
    assert fs.exists("multinode/runs/spread/checkpoints/step-6/manifest.json")
    assert fs.exists("multinode/runs/spread/final/model.safetensors")
    stored_log = fs.cat_file("multinode/runs/spread/logs/main.log").decode()
    assert len(set(re.findall(r"rank \d: node (\w+)", stored_log))) == 2  # one rank per node, logs via the relay
    log = (tmp / "runs" / "spread" / "logs" / "main.log").read_text()
    nodes = re.findall(r"rank (\d): node (\w+)", log)
    assert sorted(r for r, _ in nodes) == ["0", "1"]
    assert len({n for _, n in nodes}) == 2  # one rank per node
    assert [tuple(s) for s in out["scopes"]] == [("all", 2, 0), ("inter", 2, 0)]  # across-node numbers too


def test_a_restart_after_a_likely_hardware_fault_runs_on_another_node(drills):
    """One worker on a 2-node cluster fails with a GPU fault (injected: the ECC count a CPU cannot raise); the
    restarted worker group leaves its node out, runs on the other one and finishes from the checkpoint."""
    out, tmp = _part(drills, "exclusion"), drills[1]
    assert out["steps"] == 6
    run = tmp / "runs" / "exclusion"
    worker_log = (run / "logs" / "worker-0.log").read_text()
    assert "[likely hardware fault: GPU cpu on " in worker_log and "ECC errors rose by 1 (injected)]" in worker_log
    log = (run / "logs" / "main.log").read_text()
    excluded = re.search(r"exclude: node (\w+) \(a likely hardware fault on rank 0's GPU\) is left out", log)
    assert excluded, log[-3000:]
    nodes = re.findall(r"rank 0: node (\w+)", log)  # the placement line of each worker group
    assert len(nodes) == 2 and nodes[0] != nodes[1], nodes
    assert nodes[0].startswith(excluded.group(1)[:8]) or excluded.group(1).startswith(nodes[0][:8]), (nodes, log)


def test_elastic_run_shrinks_on_a_lost_node_and_grows_back_with_the_same_curve(drills):
    """num_workers: [1, 2]: a node is lost mid-run and the run goes on with 1 worker (accumulation doubled); the
    node comes back and the run grows to 2 workers again (accumulation halved). Every step's loss equals the fixed
    2-worker run's: the same samples (each once), global batch and LR schedule. The fixed reference runs at full
    speed, here (under torchrun: any launcher gives the same curve, test_torchrun.py)."""
    out, tmp = _part(drills, "elastic"), drills[1]
    fixed = _losses_by_step(_run(tmp, "fixed", workers=2, launcher="torchrun", **ELASTIC))
    assert out["status"] == "finished", out
    resizes = " ".join(out["resizes"])
    assert "resize: from 2 to 1 worker(s)" in resizes and "gradient_accumulation_steps 1 -> 2" in resizes, resizes
    assert "resize: from 1 to 2 worker(s)" in resizes and "gradient_accumulation_steps 2 -> 1" in resizes, resizes
    assert "(elastic: fewer workers fit (a worker or its node was lost" in resizes, resizes  # why
    assert "(elastic: more workers fit)" in resizes and " s since the last step" in resizes, resizes  # time lost
    assert out["alerts"].count("throughput_drop") <= 2, out["alerts"]  # a resize changes the speed: no alert storm
    by_step = [out["workers"][str(s)] for s in range(1, ELASTIC_STEPS + 1)]
    phases = [w for i, w in enumerate(by_step) if i == 0 or by_step[i - 1] != w]
    assert phases == [2, 1, 2], phases  # each record says the scale it trained at
    grown = {int(k): v for k, v in out["losses"].items()}
    print("ELASTIC", {k: out[k] for k in out if k not in ("losses", "workers")})
    assert sorted(grown) == sorted(fixed) == list(range(1, ELASTIC_STEPS + 1))  # every step once, none skipped
    for step in fixed:  # identical before the resize; after it, float sums in another order
        assert grown[step] == pytest.approx(fixed[step], rel=1e-5 if step <= 10 else 1e-4), step


def test_ray_tasks_on_two_nodes_write_the_cache_the_driver_writes(drills):
    """Tokenization over a Ray cluster (#46 item 2): Ray tasks on both nodes encode a large source into a cache
    byte-identical to the driver's own, skipped records and all; a node killed while its task encodes takes the task
    with it, and Ray runs it again on the other node: the same cache."""
    out, driver = _part(drills, "tokenize"), _part(drills, "driver")
    ray = out["ray"]
    assert "Ray tasks on 2 node(s), 2 CPUs" in ray["note"], ray["note"]
    assert "process(es)" in driver["note"] and "Ray" not in driver["note"]
    assert ray["files"] == driver["files"] and ray["files"]  # the same bytes
    assert ray["skipped"] == driver["skipped"] and sum(driver["skipped"].values()) == 2
    assert ray["train"] == driver["train"] > PARALLEL_ROWS
    lost = out["lost"]
    assert lost["busy"] and lost["killed_after_s"] < lost["done_after_s"]  # killed while both nodes encoded
    assert "Ray tasks on 1 node(s)" in lost["note"], lost["note"]  # every shard came back from the head node
    assert lost["files"] == driver["files"] and lost["skipped"] == driver["skipped"]
