"""Run by test_multinode.py in its own process: a simulated 2-node Ray cluster (1 CPU each) where the one worker
fails with a likely hardware fault (SCALETRAIN_FAULTS=ecc:0:3); the restart must run on the other node."""

import json
import sys
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

from scaletrain.config import validate
from scaletrain.launch.job import run_job

cfg = json.loads(Path(sys.argv[1]).read_text())
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
cluster.add_node(num_cpus=1)
ray.init(address=cluster.address, log_to_driver=False)
try:
    result = run_job(validate(cfg), "exclusion.yaml", show_progress=False)
    print("STEPS", result.summary["steps"])
finally:
    ray.shutdown()
    cluster.shutdown()
