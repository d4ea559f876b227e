"""The warm cluster's fork server (launch/warm/forkserver.py), without Ray: a caller gets a forked child that runs its
script with the caller's stdio, environment, directory and arguments, and the child's exit status; the child
is its own process group and dies with its caller; an environment or code the preloaded modules would not match
makes the caller run the plain interpreter instead."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scaletrain import envvars
from scaletrain.launch.warm import forkserver

pytestmark = pytest.mark.slow  # subprocesses of the CLI or whole runs: make test-loop's budget, not test-fast's

SCRIPT = """import json, os, sys, time
print(json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "pgid": os.getpgid(0), "cwd": os.getcwd(),
                  "foo": os.environ.get("FOO"), "argv": sys.argv[1:], "main": __name__,
                  "preloaded": "preloaded_mod" in sys.modules}), flush=True)
if sys.argv[1] == "sleep":
    time.sleep(60)
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture
def server(tmp_path):
    """A fork server that preloads a module of tmp_path; yields (socket, its process, its log)."""
    (tmp_path / "preloaded_mod.py").write_text("VALUE = 1\n")
    sock, log = str(tmp_path / "fs.sock"), tmp_path / "fs.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "FOO"))}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-c", "import sys; from scaletrain.launch.warm.forkserver import "
                                                       "serve; "
                                 f"serve({sock!r}, ('preloaded_mod', 'json'))"], stdout=out, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)
    deadline = time.time() + 60
    while not forkserver.answers(sock):
        assert proc.poll() is None and time.time() < deadline, log.read_text()
        time.sleep(0.05)
    yield sock, proc, log, env
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=30)


def _call(sock, script, *args, env, cwd, **kw):
    return subprocess.Popen([sys.executable, "-m", forkserver.MODULE, sock, str(script), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd, **kw)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # reaped between the two looks: gone
        return False


def test_a_caller_gets_a_forked_child_with_its_stdio_env_cwd_args_and_exit_status(server, tmp_path):
    sock, proc, log, env = server
    script = tmp_path / "worker.py"
    script.write_text(SCRIPT)
    work = tmp_path / "work"
    work.mkdir()
    caller = _call(sock, script, "7", "x", env={**env, "FOO": "bar"}, cwd=work)
    out, err = caller.communicate(timeout=60)
    assert caller.returncode == 7, err
    seen = json.loads(out)
    assert seen["ppid"] == proc.pid and seen["pid"] != caller.pid  # forked by the server, not the caller itself
    assert seen["pgid"] == seen["pid"]  # its own process group: Ray stops a worker by signalling its group
    assert seen["cwd"] == str(work) and seen["foo"] == "bar" and seen["argv"] == ["7", "x"]
    assert seen["main"] == "__main__" and seen["preloaded"]
    assert f"forked {seen['pid']}" in log.read_text()

    again = _call(sock, script, "0", env={**env, "FOO": "baz"}, cwd=work)
    out, _ = again.communicate(timeout=60)
    second = json.loads(out)
    assert again.returncode == 0 and second["foo"] == "baz" and second["pid"] != seen["pid"]  # a fresh child


def test_an_environment_the_preloaded_imports_would_not_match_runs_the_plain_interpreter(server, tmp_path):
    sock, proc, log, env = server
    script = tmp_path / "worker.py"
    script.write_text(SCRIPT)
    caller = _call(sock, script, "3", env={**env, "MALLOC_ARENA_MAX": "2", "FOO": "secret-value"}, cwd=tmp_path)
    out, err = caller.communicate(timeout=60)
    assert caller.returncode == 3, err
    seen = json.loads(out)
    assert seen["pid"] == caller.pid and seen["ppid"] == os.getpid()  # the caller exec'd the script itself
    assert not seen["preloaded"] and seen["foo"] == "secret-value"
    text = log.read_text()
    assert "exec: MALLOC_ARENA_MAX differs from the fork server's" in text and "secret-value" not in text


def test_a_forked_child_counts_in_its_callers_process_tree(server, tmp_path):
    """The child is the server's, not the caller's: the server notes it for the caller (forked.py), so the driver's
    process tree (its memory in summary.json) holds the process that does the work; the note goes with the child."""
    import psutil

    from scaletrain import forked
    from scaletrain.metrics.sampler import TreeMemory

    sock, proc, log, env = server
    script = tmp_path / "worker.py"
    script.write_text(SCRIPT)
    caller = _call(sock, script, "sleep", env=env, cwd=tmp_path)
    child = json.loads(caller.stdout.readline())["pid"]
    assert forked.child_of(psutil.Process(caller.pid)).pid == child
    assert {p.pid for p in TreeMemory(psutil.Process(caller.pid)).processes()} == {caller.pid, child}
    assert forked.child_of(psutil.Process(proc.pid)) is None  # the server itself is no caller
    caller.kill()
    caller.wait()
    deadline = time.time() + 30
    while (Path(f"{sock}.forked") / str(caller.pid)).exists():
        assert time.time() < deadline, "the note outlived the child"
        time.sleep(0.05)


def test_the_child_dies_with_its_caller_and_a_sigterm_reaches_it(server, tmp_path):
    sock, proc, log, env = server
    script = tmp_path / "worker.py"
    script.write_text(SCRIPT)
    for how in (signal.SIGKILL, signal.SIGTERM):
        caller = _call(sock, script, "sleep", env=env, cwd=tmp_path)
        child = json.loads(caller.stdout.readline())["pid"]
        assert _alive(child)
        caller.send_signal(how)
        caller.wait(timeout=30)
        if how == signal.SIGTERM:  # forwarded: the child died of it, and so does the caller (as Ray sees it)
            assert caller.returncode == -signal.SIGTERM
        deadline = time.time() + 30
        while _alive(child):
            assert time.time() < deadline, f"the child outlived its caller ({how!r})"
            time.sleep(0.05)


def test_a_changed_preloaded_module_is_not_forked_and_the_server_starts_over(server, tmp_path):
    sock, proc, log, env = server
    script = tmp_path / "worker.py"
    script.write_text(SCRIPT)
    mod = tmp_path / "preloaded_mod.py"
    mod.write_text("VALUE = 2\n")
    os.utime(mod, (time.time() + 5, time.time() + 5))
    caller = _call(sock, script, "0", env=env, cwd=tmp_path)
    out, _ = caller.communicate(timeout=60)
    assert caller.returncode == 0 and json.loads(out)["pid"] == caller.pid  # old code is never run
    deadline = time.time() + 60
    while "restarting" not in log.read_text() or not forkserver.answers(sock):
        assert time.time() < deadline, log.read_text()
        time.sleep(0.1)
    time.sleep(0.5)
    while True:  # the restarted server imports the new module, then forks again
        caller = _call(sock, script, "0", env=env, cwd=tmp_path)
        out, _ = caller.communicate(timeout=60)
        if json.loads(out)["pid"] != caller.pid:
            break
        assert time.time() < deadline, log.read_text()
        time.sleep(0.2)
    assert "preloaded_mod.py changed since the fork server imported it" in log.read_text()


def test_no_server_means_the_plain_interpreter(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(SCRIPT)
    caller = _call(str(tmp_path / "none.sock"), script, "5", env=dict(os.environ), cwd=tmp_path)
    out, _ = caller.communicate(timeout=60)
    assert caller.returncode == 5 and json.loads(out)["pid"] == caller.pid


def test_fork_mismatch_names_import_time_variables_only():
    base = {"HF_HUB_OFFLINE": "1", "PATH": "/bin", "RAY_AUTH_MODE": "token"}
    worker = {**base, "PATH": "/usr/bin", "RAY_JOB_ID": "01000000", "RAY_TRAIN_V2_ENABLED": "1",
              "OMP_NUM_THREADS": "1", "NCCL_DEBUG": "INFO", "PYTHONPATH": "/x"}
    assert forkserver.fork_mismatch(worker, base) is None  # Ray's per-worker and Train's variables, threads, NCCL
    assert forkserver.fork_mismatch({**worker, "HF_HUB_OFFLINE": "0"}, base) == "HF_HUB_OFFLINE differs from the " \
        "fork server's"
    # Ray's token mode: read by Ray, which the server does not import; a child imports it under its own value
    assert forkserver.fork_mismatch({k: v for k, v in worker.items() if k != "RAY_AUTH_MODE"}, base) is None
    assert forkserver.fork_mismatch({**worker, "RAY_ADDRESS": "10.0.0.1:6379"}, base).startswith("RAY_ADDRESS")
    assert forkserver.fork_mismatch({**worker, "LD_PRELOAD": "/lib/x.so"}, base).startswith("LD_PRELOAD")
    # Intel OpenMP's switches that scikit-learn and joblib set when imported (torch here runs GNU's OpenMP): a
    # driver that imported them still forks its workers (KMP_INIT_AT_FORK: 28 plain workers in one make test)
    assert forkserver.fork_mismatch({**worker, "KMP_INIT_AT_FORK": "FALSE", "KMP_DUPLICATE_LIB_OK": "True"},
                                    base) is None
    assert forkserver.fork_mismatch({**worker, "KMP_AFFINITY": "compact"}, base).startswith("KMP_AFFINITY")
    # what the server's imports set (torch's inductor cache directory), inherited by a forked driver's workers
    imported = {"TORCHINDUCTOR_CACHE_DIR": "/tmp/torchinductor_u"}
    assert forkserver.fork_mismatch({**worker, **imported}, base, imported) is None
    assert forkserver.fork_mismatch({**worker, "TORCHINDUCTOR_CACHE_DIR": "/elsewhere"}, base, imported).startswith(
        "TORCHINDUCTOR_CACHE_DIR")


def test_apply_threads_sets_torch_threads_from_omp_num_threads():
    import torch

    before = torch.get_num_threads()
    try:
        envvars.apply_threads({"OMP_NUM_THREADS": "1"})
        assert torch.get_num_threads() == 1
        envvars.apply_threads({"OMP_NUM_THREADS": "2"})
        assert torch.get_num_threads() == 2
        envvars.apply_threads({})  # unset: left as it is
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_the_py_executable_names_this_interpreter_and_the_socket():
    cmd = forkserver.command("/tmp/a b.sock")
    assert cmd == f"{sys.executable} -m scaletrain.launch.warm.forkserver '/tmp/a b.sock'"


def test_a_module_runs_as_main_in_the_fork_with_the_callers_arguments(server, tmp_path):
    """How a scaletrain command's driver runs forked (cli.main -> local_cluster.run_forked_driver)."""
    sock, proc, log, env = server
    (tmp_path / "cmdmod.py").write_text(SCRIPT)
    caller = subprocess.run(
        [sys.executable, "-c", "import os, sys; from scaletrain.launch.warm.forkserver import run_forked; "
         f"sys.exit(run_forked({sock!r}, ['prog', '4', 'y'], dict(os.environ), module='cmdmod'))"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert caller.returncode == 4, caller.stderr
    seen = json.loads(caller.stdout)
    assert seen["ppid"] == proc.pid and seen["main"] == "__main__" and seen["argv"] == ["4", "y"]


def test_a_caller_of_another_python_environment_is_not_forked(server, tmp_path):
    sock, proc, log, env = server
    (tmp_path / "cmdmod.py").write_text(SCRIPT)
    caller = subprocess.run(
        [sys.executable, "-c", "import os, sys; from scaletrain.launch.warm.forkserver import run_forked; "
         f"sys.prefix = '/another/venv'; print(run_forked({sock!r}, ['prog', '0'], dict(os.environ), "
         "module='cmdmod'))"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert caller.stdout.strip() == "None", caller.stderr  # nothing forked: the command runs in its own process
    assert "exec: the caller runs another Python (interpreter or environment)" in log.read_text()


def test_a_caller_given_a_module_runs_it_forked_and_dies_as_its_child_died(server, tmp_path):
    """How torchrun's agent starts a worker on a node with a fork server (``--no-python python -u -m forkserver SOCK
    -m scaletrain.launch.torchrun_entry ...``): the module runs forked as ``__main__`` with the arguments; a child
    killed by a signal ends its caller by the same signal, so the agent reads the worker's own death (-9, not
    137)."""
    sock, proc, log, env = server
    (tmp_path / "cmdmod.py").write_text(SCRIPT.replace('if sys.argv[1] == "sleep":',
                                                        'if sys.argv[1] == "die":\n    os.kill(os.getpid(), 9)\n'
                                                        'if sys.argv[1] == "sleep":'))
    for arg, code in (("5", 5), ("die", -signal.SIGKILL)):
        caller = subprocess.run([sys.executable, "-u", "-m", forkserver.MODULE, sock, "-m", "cmdmod", arg, "x"],
                                capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
        assert caller.returncode == code, caller.stderr
        seen = json.loads(caller.stdout)
        assert seen["ppid"] == proc.pid and seen["main"] == "__main__" and seen["argv"] == [arg, "x"]


def test_torchruns_workers_are_forked_where_a_fork_server_answers(server, monkeypatch, classify_cfg, tmp_path):
    from scaletrain.config import validate
    from scaletrain.launch.torchrun_launcher import TorchrunNode

    sock, proc, log, env = server
    cfg = validate({**classify_cfg, "scaling": {"num_workers": 2, "launcher": "torchrun"}})
    monkeypatch.setenv(envvars.SCALETRAIN_FORKSERVER, sock)
    node = TorchrunNode(cfg)
    worker = ["-m", "scaletrain.launch.torchrun_entry", str(node.handoff)]
    assert node.command()[-10:] == ["--max-restarts=0", "--no-python", sys.executable, "-u", "-m", forkserver.MODULE,
                                    sock, *worker]
    agent = [sys.executable, "-m", "scaletrain.launch.torchrun_agent", str(os.getpid())]
    assert node.command()[:5] == [*agent, f"--fork-server={sock}"]  # the agent is forked too
    monkeypatch.setenv(envvars.SCALETRAIN_FORKSERVER, str(tmp_path / "nobody.sock"))  # answers nothing: plain
    assert node.command()[-4:] == ["--max-restarts=0", *worker]
    assert node.command()[:5] == [*agent, "--nnodes=1"]
    node.close()


DRIVER = """import os, subprocess, sys
agent = subprocess.Popen([sys.executable, "-m", "scaletrain.launch.torchrun_agent", str(os.getpid()),
                          f"--fork-server={sys.argv[1]}", "--standalone", "--nproc-per-node=1", "--no-python",
                          "sleep", "600"], start_new_session=True)
print(agent.pid, flush=True)
agent.wait()
"""


def test_a_forked_torchrun_agent_and_its_worker_end_when_the_driver_is_killed(server, tmp_path):
    """torchrun's agent forked by the node's fork server (torchrun_agent --fork-server): the process the driver
    started stands for it, tied to the driver, so the driver's SIGKILL still reaches the agent (a SIGTERM), and
    torchrun stops its worker: nothing is left behind, as with the agent started plainly."""
    import psutil

    sock, proc, log, env = server
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, sock], stdout=subprocess.PIPE, text=True, env=env,
                              cwd=tmp_path, start_new_session=True)
    stub = int(driver.stdout.readline())
    deadline, agent, worker = time.time() + 120, None, None
    while worker is None:
        assert time.time() < deadline and driver.poll() is None, log.read_text()
        forked = [int(pid) for pid in re.findall(r"^forked (\d+)$", log.read_text(), re.M)]
        if forked:
            agent = psutil.Process(forked[0])
            worker = next((p for p in agent.children(recursive=True) if p.name() == "sleep"), None)
        time.sleep(0.1)
    assert agent.ppid() == proc.pid and psutil.Process(stub).ppid() == driver.pid  # forked; its stand-in the driver's
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    _, alive = psutil.wait_procs([agent, worker, psutil.Process(stub)], timeout=40)
    assert not alive, [p.cmdline()[:3] for p in alive]
