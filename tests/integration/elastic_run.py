"""Run by test_fit_ray.py in its own process: an elastic run on a simulated 2-node Ray cluster (1 CPU each).
A node is removed mid-run (the run goes on with 1 worker), then added back (it grows to 2 again). Prints the
losses by step and the resize lines as JSON."""

import json
import sys
import threading
import time
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

from scaletrain.config import validate
from scaletrain.errors import ScaletrainError
from scaletrain.launch.job import run_job
from scaletrain.metrics.records import read_jsonl

cfg = json.loads(Path(sys.argv[1]).read_text())
run = Path(cfg["output"]["output_dir"]) / cfg["output"]["run_name"]
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
node = cluster.add_node(num_cpus=1)
ray.init(address=cluster.address, log_to_driver=False)
events = {}


def steps_done() -> int:
    try:
        return max((r["step"] for r in read_jsonl(run / "metrics.jsonl") if r.get("kind") == "train"), default=0)
    except (OSError, ValueError):
        return 0


def chaos():
    global node
    deadline = time.time() + 240
    while steps_done() < 10 and time.time() < deadline:
        time.sleep(0.2)
    events["removed_at_step"] = steps_done()
    events["removed_t"] = time.time()
    cluster.remove_node(node)  # a lost node: its worker dies with it
    while time.time() < deadline:
        log = (run / "logs" / "main.log").read_text() if (run / "logs" / "main.log").exists() else ""
        if "resize: from 2 to 1" in log:
            break
        time.sleep(0.2)
    events["shrunk_t"] = time.time()
    time.sleep(3)
    node = cluster.add_node(num_cpus=1)  # room again: the run grows back


threading.Thread(target=chaos, daemon=True).start()
try:
    result = run_job(validate(cfg), "elastic.yaml", show_progress=False)
    status = "finished"
except ScaletrainError as e:
    status = f"error: {e}"
finally:
    ray.shutdown()
    cluster.shutdown()
losses = {}
workers = {}
first_after = {}
for r in read_jsonl(run / "metrics.jsonl"):
    if r.get("kind") == "train":
        losses[r["step"]] = r["train/loss"]
        workers[r["step"]] = r["scaling/workers"]
        if "shrunk_t" in events and r["time"] > events["removed_t"] and "first_after_loss" not in first_after:
            first_after["first_after_loss"] = r["time"] - events["removed_t"]
log = (run / "logs" / "main.log").read_text()
print("RESULT " + json.dumps({"status": status, "losses": losses, "workers": workers, **events, **first_after,
                              "resizes": [ln for ln in log.splitlines() if "resize:" in ln]}))
