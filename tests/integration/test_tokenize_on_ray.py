"""Tokenization over a Ray cluster (#46 item 2): on a simulated 2-node cluster, Ray tasks on both nodes encode a
large source into a cache byte-identical to the driver's own, skipped records and all; a node killed while its
task encodes takes the task with it, and Ray runs it again on the other node: the same cache."""

import json
import sys
from pathlib import Path

import pytest

from scaletrain.data.spread import PARALLEL_ROWS
from tests.conftest import run_own_group

# a simulated cluster in a harness of its own session and TMPDIR (run_own_group), apart from the suite's Ray
pytestmark = pytest.mark.ray_head


def test_ray_tasks_on_two_nodes_write_the_cache_the_driver_writes(tmp_path):
    rows = [{"instruction": f"Count to {i % 9 + 1}.", "input": "", "output": " ".join(map(str, range(i % 9 + 1)))}
            for i in range(PARALLEL_ROWS + 5000)]
    for i in (7, 15_001):  # two records with no reply, in different shards: skipped and counted either way
        rows[i]["output"] = ""
    data = tmp_path / "big.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows))
    proc = run_own_group([sys.executable, str(Path(__file__).with_name("tokenize_run.py")), str(data),
                          str(tmp_path)], timeout=400)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    ray, driver = result["ray"], result["driver"]
    assert "Ray tasks on 2 node(s), 2 CPUs" in ray["note"], ray["note"]
    assert "process(es)" in driver["note"] and "Ray" not in driver["note"]
    assert ray["files"] == driver["files"] and ray["files"]  # the same bytes
    assert ray["skipped"] == driver["skipped"] and sum(driver["skipped"].values()) == 2
    assert ray["train"] == driver["train"] > PARALLEL_ROWS
    lost = result["lost"]
    assert lost["busy"] and lost["killed_after_s"] < lost["done_after_s"]  # killed while both nodes encoded
    assert "Ray tasks on 1 node(s)" in lost["note"], lost["note"]  # every shard came back from the head node
    assert lost["files"] == driver["files"] and lost["skipped"] == driver["skipped"]
