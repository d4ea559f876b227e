"""A simulated 2-node Ray cluster: STRICT_SPREAD puts one rank on each node, and main.log says which."""

import json
import re
import sys
from pathlib import Path

import pytest

from tests.conftest import make_bucket, run_own_group

# a simulated cluster in a harness of its own session and TMPDIR (run_own_group), apart from the suite's Ray
pytestmark = pytest.mark.ray_head


def test_strict_spread_over_two_nodes(classify_cfg, tmp_path, s3_server):
    """Also on object storage: the same job, its run directory on the S3 server, each rank on its own node."""
    cfg = json.loads(json.dumps(classify_cfg))
    cfg["train"].update(max_steps=6, logging_steps=2)
    cfg["scaling"] = {"num_workers": 2, "placement_strategy": "STRICT_SPREAD"}
    cfg["output"] = {"output_dir": str(tmp_path / "runs"), "run_name": "spread"}
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    bucket = make_bucket(s3_server, "multinode")
    stored = {**cfg, "checkpoint": {"save_steps": 3}, "output": {"output_dir": f"s3://{bucket}/runs",
                                                                 "run_name": "spread"},
              "storage": {"endpoint_url": s3_server, "mirror_dir": str(tmp_path / "mirror"),
                          "node_dir": str(tmp_path / "nodes")}}
    (tmp_path / "stored.json").write_text(json.dumps(stored))
    script = Path(__file__).with_name("multinode_run.py")
    proc = run_own_group([sys.executable, str(script), str(tmp_path / "cfg.json"), str(tmp_path / "stored.json")],
                         timeout=400)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "STEPS 6" in proc.stdout and "STORED STEPS 6" in proc.stdout
    import fsspec

    fs = fsspec.filesystem("s3", endpoint_url=s3_server, skip_instance_cache=True)
    assert fs.exists(f"{bucket}/runs/spread/checkpoints/step-6/manifest.json")
    assert fs.exists(f"{bucket}/runs/spread/final/model.safetensors")
    stored_log = fs.cat_file(f"{bucket}/runs/spread/logs/main.log").decode()
    assert len(set(re.findall(r"rank \d: node (\w+)", stored_log))) == 2  # one rank per node, logs via the relay
    log = (tmp_path / "runs" / "spread" / "logs" / "main.log").read_text()
    nodes = re.findall(r"rank (\d): node (\w+)", log)
    assert sorted(r for r, _ in nodes) == ["0", "1"]
    assert len({n for _, n in nodes}) == 2  # one rank per node
    assert "SCOPES [('all', 2, 0), ('inter', 2, 0)]" in proc.stdout  # commbench reports across-node numbers too


def test_a_restart_after_a_likely_hardware_fault_runs_on_another_node(classify_cfg, tmp_path):
    """One worker on a 2-node cluster fails with a GPU fault (injected: the ECC count a CPU cannot raise); the
    restarted worker group leaves its node out, runs on the other one and finishes from the checkpoint."""
    import os

    cfg = json.loads(json.dumps(classify_cfg))
    cfg["train"].update(max_steps=6, logging_steps=1)
    cfg.update(checkpoint={"save_steps": 2}, fault_tolerance={"max_failures": 1},
               output={"output_dir": str(tmp_path / "runs"), "run_name": "exclusion"})
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    env = {**os.environ, "SCALETRAIN_FAULTS": "ecc:0:3"}
    proc = run_own_group([sys.executable, str(Path(__file__).with_name("exclusion_run.py")),
                          str(tmp_path / "cfg.json")], timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "STEPS 6" in proc.stdout
    run = tmp_path / "runs" / "exclusion"
    worker_log = (run / "logs" / "worker-0.log").read_text()
    assert "[likely hardware fault: GPU cpu on " in worker_log and "ECC errors rose by 1 (injected)]" in worker_log
    log = (run / "logs" / "main.log").read_text()
    excluded = re.search(r"exclude: node (\w+) \(a likely hardware fault on rank 0's GPU\) is left out", log)
    assert excluded, log[-3000:]
    nodes = re.findall(r"rank 0: node (\w+)", log)  # the placement line of each worker group
    assert len(nodes) == 2 and nodes[0] != nodes[1], nodes
    assert nodes[0].startswith(excluded.group(1)[:8]) or excluded.group(1).startswith(nodes[0][:8]), (nodes, log)
