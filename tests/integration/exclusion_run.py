"""Run by test_multinode.py in its own process: a simulated 2-node Ray cluster (1 CPU each) where the one worker
fails with a likely hardware fault (SCALETRAIN_FAULTS=ecc:0:3); the restart must run on the other node."""

import json
import sys
from pathlib import Path

from two_nodes import two_node_cluster

from scaletrain.config import validate
from scaletrain.launch.job import run_job

cfg = json.loads(Path(sys.argv[1]).read_text())
with two_node_cluster():
    result = run_job(validate(cfg), "exclusion.yaml", show_progress=False)
    print("STEPS", result.summary["steps"])
