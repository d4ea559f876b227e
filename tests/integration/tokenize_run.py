"""Run by test_tokenize_on_ray.py in its own process: a simulated 2-node Ray cluster (1 CPU each) tokenizes a
source with Ray tasks (data.tokenize_on: auto, the driver connected to it) and the driver alone does it again."""

import hashlib
import json
import sys
from pathlib import Path

from two_nodes import two_node_cluster

from scaletrain.config import validate
from scaletrain.data import prepare_data
from scaletrain.tokenizer import load_tokenizer

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


with two_node_cluster():
    on_ray = prepared("auto")
driver = prepared("driver")
print("RESULT " + json.dumps({"ray": on_ray, "driver": driver}))
