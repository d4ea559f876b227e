"""Run by test_two_nodes.py in its own process: the drills that need two nodes, one after another on one simulated
2-node Ray cluster (1 CPU each; one cluster and one fork server for all, where each drill once started its own:
~30 CPU-seconds apiece). Each part prints ``RESULT <part> <json>``; a part that fails prints its error and the
next one still runs.

- ``spread``: a 2-worker run under STRICT_SPREAD, the same job with its run directory on object storage, and
  commbench across the two nodes;
- ``exclusion``: one worker fails with a likely hardware fault (SCALETRAIN_FAULTS=ecc:0:3): the restart runs on
  the other node;
- ``elastic``: a node is removed mid-run (the run goes on with 1 worker), then added back (it grows to 2 again):
  the losses and worker counts by step (the last record of each step: a step trained again after a resize counts
  as its newer run), the resize lines and the events' times;
- ``tokenize``: Ray tasks on both nodes tokenize a source (data.tokenize_on: auto, the driver connected); then
  again, the second node killed while its task runs (the task is redone on the head node; the last drill, as it
  leaves one node); and the driver alone does it again.
"""

import contextlib
import hashlib
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path

from two_nodes import plain_starts, two_node_cluster, worker_runtime_env

from scaletrain.config import validate
from scaletrain.errors import ScaletrainError
from scaletrain.launch.job import run_job
from scaletrain.metrics.records import read_jsonl

spec = json.loads(Path(sys.argv[1]).read_text())


@contextlib.contextmanager
def faults(value: str | None):
    """SCALETRAIN_FAULTS for one run (the driver reads it and hands it to the workers it starts)."""
    if value:
        os.environ["SCALETRAIN_FAULTS"] = value
    try:
        yield
    finally:
        os.environ.pop("SCALETRAIN_FAULTS", None)


def spread(cluster, part: dict) -> dict:
    out = {"steps": run_job(validate(part["cfg"]), "multinode.yaml", show_progress=False).summary["steps"]}
    out["stored_steps"] = run_job(validate(part["stored"]), "multinode.yaml", show_progress=False).summary["steps"]
    from scaletrain.comm.bench import BenchParams
    from scaletrain.launch.commbench import run_commbench

    rows = run_commbench(BenchParams(("all_reduce",), (65536,), iters=2, warmup_iters=1), 2, "gloo", None, {},
                         None, 60, Path(part["bench_dir"]))
    out["scopes"] = sorted({(r.scope, r.ranks, r.oop_wrong) for r in rows})
    return out


def exclusion(cluster, part: dict) -> dict:
    with faults(part["faults"]):
        return {"steps": run_job(validate(part["cfg"]), "exclusion.yaml", show_progress=False).summary["steps"]}


def elastic(cluster, part: dict) -> dict:
    cfg = part["cfg"]
    run = Path(cfg["output"]["output_dir"]) / cfg["output"]["run_name"]
    node = cluster.list_all_nodes()[1]
    events = {}

    def steps_done() -> int:
        try:
            return max((r["step"] for r in read_jsonl(run / "metrics.jsonl") if r.get("kind") == "train"), default=0)
        except (OSError, ValueError):
            return 0

    def trained_on_one() -> bool:
        """The shrunk group has trained a step past a checkpoint of its own: the node is added back only then.
        Added sooner (while the 1-worker group restores, or before its first checkpoint), Ray may replace that
        group with a 2-worker one that resumes from the 2-worker checkpoint and trains its steps again (said as a
        resize from 1 to 2), and the run rightly records no 1-worker phase."""
        save = cfg["checkpoint"]["save_steps"]
        first_own = (events["removed_at_step"] // save + 1) * save  # the 1-worker group's first checkpoint
        try:
            records = read_jsonl(run / "metrics.jsonl")
            return any(r.get("kind") == "train" and r.get("scaling/workers") == 1 and r["step"] > first_own
                       for r in records)
        except (OSError, ValueError):
            return False

    def train():
        try:
            run_job(validate(cfg), "elastic.yaml", show_progress=False)
            events["status"] = "finished"
        except ScaletrainError as e:
            events["status"] = f"error: {e}"

    def main_log() -> str:
        return (run / "logs" / "main.log").read_text() if (run / "logs" / "main.log").exists() else ""

    def wait_for(predicate, deadline: float) -> bool:
        while not predicate():
            if time.time() > deadline or not job.is_alive():
                return False
            time.sleep(0.2)
        return True

    # The run in a thread; the cluster changes in this, the main thread (Ray's add_node installs a signal handler,
    # which only the main thread may do).
    with faults(part["faults"]):
        job = threading.Thread(target=train, daemon=True)
        job.start()
        deadline = time.time() + 400
        if wait_for(lambda: steps_done() >= 10, deadline):
            events["removed_at_step"] = steps_done()
            events["removed_t"] = time.time()
            cluster.remove_node(node)  # a lost node: its worker dies with it
            if wait_for(lambda: "resize: from 2 to 1" in main_log(), deadline):
                events["shrunk_t"] = time.time()
                wait_for(trained_on_one, deadline)
                cluster.add_node(num_cpus=1)  # room again: the run grows back
                events["added_t"] = time.time()
                events["added_at_step"] = steps_done()
                if wait_for(lambda: "resize: from 1 to 2" in main_log(), deadline):
                    events["grown_t"] = time.time()
        job.join(timeout=max(1.0, deadline - time.time()))
    events.setdefault("status", "still running at the deadline")
    losses, workers, first_after = {}, {}, {}
    for r in read_jsonl(run / "metrics.jsonl"):
        if r.get("kind") == "train":
            losses[r["step"]] = r["train/loss"]
            workers[r["step"]] = r["scaling/workers"]
            if ("shrunk_t" in events and r["time"] > events["removed_t"] and r["scaling/workers"] == 1
                    and "first_after_loss" not in first_after):
                first_after["first_after_loss"] = r["time"] - events["removed_t"]
            if ("added_t" in events and r["time"] > events["added_t"] and r["scaling/workers"] == 2
                    and "first_after_add" not in first_after):
                first_after["first_after_add"] = r["time"] - events["added_t"]
    log = main_log()
    return {"losses": losses, "workers": workers, **events, **first_after,
            "resizes": [ln for ln in log.splitlines() if "resize:" in ln],
            "alerts": [ln.split("alert: ")[1].split(":")[0] for ln in log.splitlines() if "alert: " in ln]}


def prepared(part: dict, where: str) -> dict:
    """The tokenize part's source prepared with data.tokenize_on=``where``: its note, its files' hashes, what it
    skipped."""
    from scaletrain.data import prepare_data
    from scaletrain.model.tokenizer import load_tokenizer

    data, out = Path(part["data"]), Path(part["out"])
    cfg = validate({"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"},
                    "data": {"train_file": str(data), "template": "alpaca", "max_length": 64, "eval_ratio": 0.01,
                             "tokenize_on": where, "cache_dir": str(out / where)},
                    "output": {"output_dir": str(out / "runs")}})
    p = prepare_data(cfg, load_tokenizer("builtin:tiny-llama"))
    files = {}
    for split in ("train", "eval"):
        for f in sorted(Path(getattr(p, f"{split}_path")).glob("*.arrow")):
            files[f"{split}/{f.name}"] = hashlib.sha256(f.read_bytes()).hexdigest()
    return {"note": next(n for n in p.notes if n.startswith("data: tokenized")), "files": files,
            "skipped": p.skipped, "train": len(p.train)}


def tokenize(cluster, part: dict) -> dict:
    def kill_the_second_node_while_it_encodes(killed: dict) -> None:
        import ray

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and ray.available_resources().get("CPU", 0) > 0:
            time.sleep(0.05)  # until both nodes' CPUs run a shard's task
        killed["busy"] = ray.available_resources().get("CPU", 0) == 0
        cluster.remove_node(cluster.list_all_nodes()[1], allow_graceful=False)
        killed["at"] = time.monotonic()

    on_ray = prepared(part, "auto")
    killed: dict = {}
    watcher = threading.Thread(target=kill_the_second_node_while_it_encodes, args=(killed,))
    watcher.start()
    started = time.monotonic()
    lost = prepared(part, "cluster")
    watcher.join()
    lost.update(busy=killed["busy"], killed_after_s=killed["at"] - started, done_after_s=time.monotonic() - started)
    return {"ray": on_ray, "lost": lost}


def report(name: str, fn, *args) -> None:
    started = time.time()
    try:
        result = fn(*args)
    except Exception:  # noqa: BLE001 - one drill's failure is its test's; the next drill still runs
        result = {"error": traceback.format_exc()[-3000:]}
    result["seconds"] = round(time.time() - started, 1)
    print(f"RESULT {name} " + json.dumps(result), flush=True)


with two_node_cluster() as cluster:
    for name, fn in (("spread", spread), ("exclusion", exclusion), ("elastic", elastic), ("tokenize", tokenize)):
        if name in spec:
            report(name, fn, cluster, spec[name])
if "tokenize" in spec:  # the driver alone, after the cluster: the cache the Ray tasks' must equal
    report("driver", prepared, spec["tokenize"], "driver")
print("RESULT forks " + json.dumps({"plain_starts": plain_starts(), "forked": worker_runtime_env() is not None}))
