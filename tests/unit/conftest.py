"""The test tiers (tests/README.md): a test here is a pure-function test unless marked ``loop``.

An unmarked test that starts a process (subprocess, fork) or runs the worker loop fails, so the pure tier stays
seconds long and the fast target (``make test-fast``: pure + loop, no Ray) a few minutes.
"""

import os
import subprocess

import pytest

TIER_RULE = ("a pure-function test starts no process and runs no training loop: mark it @pytest.mark.loop "
             "(the in-process tier) or move it to tests/integration (Ray, torchrun, clusters)")


@pytest.fixture(autouse=True, scope="session")
def _matplotlib_font_cache():
    """matplotlib builds its font cache on its first import on a machine by running fc-list: a fresh clone does it
    here, once, before the guard below would refuse that process to the first test that draws a plot."""
    import matplotlib.font_manager  # noqa: F401


@pytest.fixture(autouse=True)
def _pure_tier_guard(request, monkeypatch):
    if request.node.get_closest_marker("loop"):
        return

    def refuse(*args, **kwargs):
        raise AssertionError(TIER_RULE)

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse)
    monkeypatch.setattr(os, "fork", refuse)
    import scaletrain.worker.loop as loop

    monkeypatch.setattr(loop, "run_loop", refuse)
