"""Data-parallel wrapping: DDP without the per-forward buffer broadcast, and no deprecation warning."""

import os
import socket
import subprocess
import sys

import pytest

DDP_ON_ONE_RANK = """
import os, warnings
import torch, torch.distributed as dist
from scaletrain.worker.parallel import no_forward_buffer_sync
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
dist.init_process_group("gloo", rank=0, world_size=1)
warnings.simplefilter("error")  # a deprecation warning from the wrap fails the child
m = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2), **no_forward_buffer_sync())
print("forward sync", m.broadcast_buffers)
dist.destroy_process_group()
"""


@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
def test_ddp_wrap_turns_off_the_forward_buffer_sync_without_a_warning():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.run([sys.executable, "-c", DDP_ON_ONE_RANK], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PORT": str(port)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "forward sync False" in proc.stdout
