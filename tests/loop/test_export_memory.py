"""`scaletrain export` of a model split into 9 shards (0.26 GB in bf16) in a process of its own: its peak resident
set (sampled every 2 ms) grows by a few shards and the adapter, not by the model (what a whole-model merge needs)."""

import subprocess
import sys

import pytest

from scaletrain.after.export import shards_of
from tests.unit.test_export import _base, _run


@pytest.mark.slow
def test_host_memory_grows_by_about_two_shards_not_the_model(tmp_path):
    """The resident set's growth during the export, against the shard and model sizes."""
    base = _base(tmp_path / "base", hidden=1024, layers=8, intermediate=4096, shard="32MB", vocab=2048)
    names = shards_of(base)
    shard = max((base / n).stat().st_size for n in names)
    model = sum((base / n).stat().st_size for n in names)
    assert len(names) >= 4
    run = _run(tmp_path, base)
    adapter = (run / "final" / "adapter_model.safetensors").stat().st_size
    probe = ("import sys, threading, time, psutil, torch, safetensors.torch\n"
             "from scaletrain.after.export import export_run\n"
             "proc, peak, done = psutil.Process(), [0], threading.Event()\n"
             "def watch():\n"
             "    while not done.is_set():\n"
             "        peak[0] = max(peak[0], proc.memory_info().rss)\n"
             "        time.sleep(0.002)\n"
             "before = proc.memory_info().rss\n"
             "t = threading.Thread(target=watch)\n"
             "t.start()\n"
             "export_run(sys.argv[1])\n"
             "done.set()\n"
             "t.join()\n"
             "print(peak[0] - before)\n")
    out = subprocess.run([sys.executable, "-c", probe, str(run)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    grew = int(out.stdout.strip().splitlines()[-1])
    # one shard read, its merged copy, safetensors' write buffer: at most three shards (measured 70-140 MB here
    # with 31 MB shards of a 260 MB model), never the model
    assert 0 < grew < 3 * shard + adapter + 100e6 and grew < 0.75 * model, (grew, shard, model)
