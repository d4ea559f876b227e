"""Run by test_tokenize_on_ray.py in its own process: a simulated 2-node Ray cluster (1 CPU each) tokenizes a
source with Ray tasks (data.tokenize_on: auto, the driver connected to it); then again on the same cluster,
whose second node is killed while its task runs (the task is redone on the head node); and the driver alone does
it again."""

import hashlib
import json
import sys
import threading
import time
from pathlib import Path

from two_nodes import two_node_cluster

from scaletrain.config import validate
from scaletrain.data import prepare_data
from scaletrain.model.tokenizer import load_tokenizer

data, out = Path(sys.argv[1]), Path(sys.argv[2])
tok = load_tokenizer("builtin:tiny-llama")


def prepared(where: str):
    cfg = validate({"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"},
                    "data": {"train_file": str(data), "template": "alpaca", "max_length": 64, "eval_ratio": 0.01,
                             "tokenize_on": where, "cache_dir": str(out / where)},
                    "output": {"output_dir": str(out / "runs")}})
    p = prepare_data(cfg, tok)
    files = {}
    for split in ("train", "eval"):
        for f in sorted(Path(getattr(p, f"{split}_path")).glob("*.arrow")):
            files[f"{split}/{f.name}"] = hashlib.sha256(f.read_bytes()).hexdigest()
    return {"note": next(n for n in p.notes if n.startswith("data: tokenized")), "files": files,
            "skipped": p.skipped, "train": len(p.train)}


def kill_the_second_node_while_it_encodes(cluster, killed: dict) -> None:
    import ray

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and ray.available_resources().get("CPU", 0) > 0:
        time.sleep(0.05)  # until both nodes' CPUs run a shard's task
    killed["busy"] = ray.available_resources().get("CPU", 0) == 0
    cluster.remove_node(cluster.list_all_nodes()[1], allow_graceful=False)
    killed["at"] = time.monotonic()


with two_node_cluster() as cluster:
    on_ray = prepared("auto")
    killed: dict = {}
    watcher = threading.Thread(target=kill_the_second_node_while_it_encodes, args=(cluster, killed))
    watcher.start()
    started = time.monotonic()
    lost = prepared("cluster")
    watcher.join()
    lost.update(busy=killed["busy"], killed_after_s=killed["at"] - started, done_after_s=time.monotonic() - started)
driver = prepared("driver")
print("RESULT " + json.dumps({"ray": on_ray, "lost": lost, "driver": driver}))
