"""A simulated 2-node Ray cluster: STRICT_SPREAD puts one rank on each node, and main.log says which."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray


def test_strict_spread_over_two_nodes(classify_cfg, tmp_path):
    cfg = json.loads(json.dumps(classify_cfg))
    cfg["train"].update(max_steps=6, logging_steps=2)
    cfg["scaling"] = {"num_workers": 2, "placement_strategy": "STRICT_SPREAD"}
    cfg["output"] = {"output_dir": str(tmp_path / "runs"), "run_name": "spread"}
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    script = Path(__file__).with_name("multinode_run.py")
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "cfg.json")],
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "STEPS 6" in proc.stdout
    log = (tmp_path / "runs" / "spread" / "logs" / "main.log").read_text()
    nodes = re.findall(r"rank (\d): node (\w+)", log)
    assert sorted(r for r, _ in nodes) == ["0", "1"]
    assert len({n for _, n in nodes}) == 2  # one rank per node
    assert "SCOPES [('all', 2, 0), ('inter', 2, 0)]" in proc.stdout  # commbench reports across-node numbers too
