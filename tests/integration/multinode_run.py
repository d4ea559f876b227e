"""Run by test_multinode.py in its own process: a simulated 2-node Ray cluster (1 CPU each)."""

import json
import sys
from pathlib import Path

from two_nodes import two_node_cluster

from scaletrain.config import validate
from scaletrain.launch.job import run_job

cfg = json.loads(Path(sys.argv[1]).read_text())
with two_node_cluster():
    result = run_job(validate(cfg), "multinode.yaml", show_progress=False)
    print("STEPS", result.summary["steps"])
    # the same job with its run directory on object storage (argv[2]), on the same two nodes
    if len(sys.argv) > 2:
        stored = run_job(validate(json.loads(Path(sys.argv[2]).read_text())), "multinode.yaml", show_progress=False)
        print("STORED STEPS", stored.summary["steps"])

    # commbench across the same two nodes: the all-rank rows and the across-nodes rows.
    from scaletrain.comm.bench import BenchParams
    from scaletrain.launch.commbench import run_commbench

    rows = run_commbench(BenchParams(("all_reduce",), (65536,), iters=2, warmup_iters=1), 2, "gloo", None, {},
                         None, 60, Path(sys.argv[1]).parent / "bench")
    print("SCOPES", sorted({(r.scope, r.ranks, r.oop_wrong) for r in rows}))
