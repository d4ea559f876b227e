"""#72: what a driver starts for a run ends with it, however it dies (launch/orphans.py): processes carrying its
mark are stopped by its reaper once it is SIGKILLed, and what an earlier driver left is named by `train` and
`doctor`. Small stand-in processes (a sleeping "driver" and "Ray process"): the reaper is a process, so these start
processes; the whole drill (an embedded Ray under a SIGKILLed `scaletrain train`) is
tests/integration/test_reliability.py's outliving-its-driver test."""

import os
import signal
import subprocess
import sys
import time

import pytest

from scaletrain.launch import orphans

pytestmark = pytest.mark.loop  # it starts processes

SLEEP = [sys.executable, "-c", "import time; time.sleep(120)"]


def _start(env_mark: str | None = None) -> subprocess.Popen:
    env = dict(os.environ)
    env.pop(orphans.MARK, None)
    if env_mark:
        env[orphans.MARK] = env_mark
    return subprocess.Popen(SLEEP, env=env, start_new_session=True)


def _until(condition, timeout_s: float = 15.0) -> bool:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def test_the_reaper_stops_what_a_sigkilled_driver_started_and_nothing_else():
    driver = _start()
    token = orphans.token_of(driver.pid)
    child, stranger = _start(token), _start("1:0.00-another-driver")
    reaper = subprocess.Popen([sys.executable, "-m", "scaletrain.launch.orphans", token], start_new_session=True)
    try:
        assert _until(lambda: [p.pid for p, _ in orphans.marked(token)] == [child.pid])
        time.sleep(0.5)
        assert child.poll() is None and reaper.poll() is None  # the driver lives: nothing is stopped
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
        assert _until(lambda: child.poll() is not None), "the driver's process outlived it"
        assert reaper.wait(timeout=15) == 0
        assert stranger.poll() is None  # another driver's (or no driver's) process is left alone
    finally:
        for p in (driver, child, stranger, reaper):
            p.kill()
            p.wait()


def test_what_an_earlier_driver_left_is_named_by_doctor_with_how_to_stop_it():
    from scaletrain.commands.doctor import gather_facts
    from scaletrain.launch.doctor import Status, check_leftovers
    from tests.cli import run_cli

    gone = _start()
    token = orphans.token_of(gone.pid)
    gone.kill()
    gone.wait()
    left = _start(token)
    try:
        assert _until(lambda: any(x.pid == left.pid for x in orphans.leftovers()))
        found = [x for x in orphans.leftovers() if x.pid == left.pid][0]
        assert found.driver == str(gone.pid) and found.rss_mb > 1
        line = orphans.describe([found])
        assert line.startswith(f"1 process(es) of an earlier run are still running (driver pid {gone.pid}, gone): ")
        assert line.endswith(f"stop them with kill {left.pid}")
        facts = gather_facts(None, smoke=False)
        result = check_leftovers(facts)
        assert result.status is Status.WARN and f"pid {left.pid}" in result.detail, result
        # (the machine's own leftovers are named beside it: under make test, a cluster stopped by a test on the other
        # pytest worker may leave one of its processes under pid 1 for a moment)
        assert result.fix.startswith("stop them: kill ") and str(left.pid) in result.fix.split(), result.fix
        row = next(ln for ln in run_cli("doctor").stderr.splitlines() if "leftover processes" in ln)
        assert "│ warn" in row, row
    finally:
        left.kill()
        left.wait()
    assert not any(x.pid == left.pid for x in orphans.leftovers())


def test_ray_workers_orphaned_only_while_their_cluster_stops_are_not_leftovers(monkeypatch):
    """`ray stop` (or another test's cluster going down) ends the raylet first: its workers sit under pid 1 for a
    moment before they exit. Only those still there after ORPHAN_GRACE_S are an earlier run's leftovers."""
    import types

    import psutil

    from scaletrain.launch import orphans

    def fake(pid):
        p = types.SimpleNamespace(pid=pid, info={"name": "python", "cmdline": ["ray::IDLE"], "ppid": 1})
        p.cmdline = lambda: ["ray::IDLE"]
        p.memory_info = lambda: types.SimpleNamespace(rss=2**20)
        return p

    stopping, stuck = fake(101), fake(102)
    waited = []
    monkeypatch.setattr(orphans, "marked", lambda: [])
    monkeypatch.setattr(psutil, "process_iter", lambda attrs=None: [stopping, stuck])
    monkeypatch.setattr(psutil, "wait_procs", lambda procs, timeout: (waited.append(timeout) or ([stopping], [stuck])))
    assert [x.pid for x in orphans.leftovers()] == [102] and waited == [orphans.ORPHAN_GRACE_S]
