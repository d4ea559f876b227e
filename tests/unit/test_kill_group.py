"""`scaletrain down` stops the head's process group: SIGTERM, a wait for every process that can hold a job's state
(the raylet, the node's workers) to exit on its own, then SIGKILL to the Ray processes that never do (the group's
leader `ray start --block`, gcs_server, the autoscaler's monitor: measured with Ray 2.60, up 25 s after SIGTERM).
A fake group stands in for Ray's: a leader that ignores SIGTERM and a child named like the process."""

import subprocess
import sys
import textwrap
import time

import pytest

from scaletrain.launch.warm.cluster import _kill_group, _live_members

pytestmark = pytest.mark.loop  # it starts processes

CHILD = textwrap.dedent("""
    import signal, sys, time
    def graceful(*_):
        time.sleep({exit_after})
        open(sys.argv[1], "w").write("exited")
        sys.exit(0)
    signal.signal(signal.SIGTERM, graceful if {exit_after} >= 0 else signal.SIG_IGN)
    open(sys.argv[1] + ".up", "w").write("up")
    time.sleep(120)
""")
LEADER = textwrap.dedent("""
    import signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.argv[1], "-c", sys.argv[2], sys.argv[3]])
    time.sleep(120)
""")


def _group(tmp_path, name: str, exit_after: float):
    exe = tmp_path / name  # the child's process name
    exe.symlink_to(sys.executable)
    marker = tmp_path / "child"
    leader = subprocess.Popen([sys.executable, "-c", LEADER, str(exe), CHILD.format(exit_after=exit_after),
                               str(marker)], start_new_session=True)
    deadline = time.time() + 30
    while not (tmp_path / "child.up").exists():
        assert time.time() < deadline
        time.sleep(0.05)
    return leader, marker


def _alive(pgid: int) -> list[str]:
    return [p.info["name"] for p in _live_members(pgid)]


@pytest.mark.timeout(120)  # a grace waited out (an hour) is a hang, ended here
def test_the_raylet_ends_on_its_own_then_what_never_does_is_killed(tmp_path):
    leader, marker = _group(tmp_path, "raylet", exit_after=1.5)
    _kill_group(leader.pid, grace_s=3600)  # returns once the raylet ended: the leader ignoring SIGTERM not waited for
    leader.wait(timeout=10)
    assert marker.read_text() == "exited"  # waited for its graceful exit
    assert _alive(leader.pid) == []


class _Clock:
    """Time as _kill_group sees it: each of its sleeps moves the clock on, none waits."""

    def __init__(self):
        self.now = 0.0

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_process_that_may_hold_a_job_gets_the_whole_grace(tmp_path, monkeypatch):
    from scaletrain.launch.warm import cluster

    leader, marker = _group(tmp_path, "worker", exit_after=-1)  # ignores SIGTERM: not a Ray control process
    clock = _Clock()
    monkeypatch.setattr(cluster, "time", clock)
    _kill_group(leader.pid, grace_s=20)
    monkeypatch.undo()
    leader.wait(timeout=10)
    assert clock.now >= 20, clock.now  # SIGKILL only once the whole grace had passed
    deadline = time.time() + 5
    while _alive(leader.pid) and time.time() < deadline:
        time.sleep(0.1)
    assert _alive(leader.pid) == [] and not marker.exists()
