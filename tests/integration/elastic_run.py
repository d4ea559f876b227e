"""Run by test_elastic.py in its own process: an elastic run on a simulated 2-node Ray cluster (1 CPU each).
A node is removed mid-run (the run goes on with 1 worker), then added back (it grows to 2 again). Prints the
losses and worker counts by step (the last record of each step: a step trained again after a resize counts as
its newer run), the resize lines and the events' times as JSON."""

import contextlib
import json
import sys
import threading
import time
from pathlib import Path

from two_nodes import plain_starts, two_node_cluster, worker_runtime_env

from scaletrain.config import validate
from scaletrain.errors import ScaletrainError
from scaletrain.launch.job import run_job
from scaletrain.metrics.records import read_jsonl

cfg = json.loads(Path(sys.argv[1]).read_text())
run = Path(cfg["output"]["output_dir"]) / cfg["output"]["run_name"]
stack = contextlib.ExitStack()  # the cluster ends in the finally below
cluster = stack.enter_context(two_node_cluster())
node = cluster.list_all_nodes()[1]
events = {}


def steps_done() -> int:
    try:
        return max((r["step"] for r in read_jsonl(run / "metrics.jsonl") if r.get("kind") == "train"), default=0)
    except (OSError, ValueError):
        return 0


def trained_on_one() -> bool:
    """The shrunk group has trained a step past a checkpoint of its own: the node is added back only then. Added
    sooner (while the 1-worker group restores, or before its first checkpoint), Ray may replace that group with a
    2-worker one that resumes from the 2-worker checkpoint and trains its steps again (said as a resize from 1 to
    2), and the run rightly records no 1-worker phase."""
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


# The run in a thread; the cluster changes in the main thread (Ray's add_node installs a signal handler, which
# only the main thread may do).
job = threading.Thread(target=train, daemon=True)
job.start()
deadline = time.time() + 400
try:
    if wait_for(lambda: steps_done() >= 10, deadline):
        events["removed_at_step"] = steps_done()
        events["removed_t"] = time.time()
        cluster.remove_node(node)  # a lost node: its worker dies with it
        if wait_for(lambda: "resize: from 2 to 1" in main_log(), deadline):
            events["shrunk_t"] = time.time()
            wait_for(trained_on_one, deadline)
            node = cluster.add_node(num_cpus=1)  # room again: the run grows back
            events["added_t"] = time.time()
            events["added_at_step"] = steps_done()
            if wait_for(lambda: "resize: from 1 to 2" in main_log(), deadline):
                events["grown_t"] = time.time()
    job.join(timeout=max(1.0, deadline - time.time()))
    events.setdefault("status", "still running at the deadline")
finally:
    stack.close()
losses = {}
workers = {}
first_after = {}
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
log = (run / "logs" / "main.log").read_text()
print("RESULT " + json.dumps({"losses": losses, "workers": workers, **events, **first_after,
                              "plain_starts": plain_starts(), "forked": worker_runtime_env() is not None,
                              "resizes": [ln for ln in log.splitlines() if "resize:" in ln],
                              "alerts": [ln.split("alert: ")[1].split(":")[0] for ln in log.splitlines()
                                         if "alert: " in ln]}))
