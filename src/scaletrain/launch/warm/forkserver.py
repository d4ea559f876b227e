"""Fresh Ray worker processes without the import bill: a fork server for the warm local cluster.

`scaletrain up` starts, beside the Ray head, one process that imports what the processes of a scaletrain job
import (torch, transformers, scaletrain's worker loop, Ray Train's third-party dependencies; not Ray itself, see
PRELOAD) and then waits on a Unix socket. The driver of a job on that cluster names this module as Ray's
``py_executable``; each worker process Ray starts then asks the server for a child: the server forks (a few
milliseconds instead of seconds of imports on every worker), the child takes the worker's stdio, environment,
working directory and command line and runs Ray's ``default_worker.py`` as ``__main__``, and the caller relays
the child's exit status to Ray. The driver of `train`/`scale`/`commbench` is itself forked the same way
(``run_forked`` with ``module="scaletrain"``).

Every child serves one Ray worker and the server itself never runs job code, so a worker is still a fresh
process per run: what it shares with an exec'd worker is only what imports leave behind. Where that could
differ, the caller runs the plain interpreter instead (and the server's log says why): an environment whose
import-time variables (``envvars.FORK_MATCHED_PREFIXES``) differ from the server's, or a preloaded module whose source
changed on disk since the server imported it (a stale import would run old code).

The same pattern is Python's ``multiprocessing`` forkserver with preloaded modules, which cannot serve here:
it forks only the ``Process`` objects of a Python parent that asks it, and Ray's raylet starts its worker
processes itself, by exec'ing an interpreter command line (``py_executable``), so the server must answer a
command line, with the caller's stdio, environment and directory handed over.
"""

from __future__ import annotations

import json
import os
import socket
import sys

from scaletrain import envvars, forked

# Not Ray: its C++ core reads its RAY_* configuration (the worker's job id among it) once, when first used, so
# a worker must import Ray itself; Ray Train's own dependencies are imported here (they halve what is left of
# importing it: 1.0 -> 0.4 s per process). The model families the docs and tests name are imported up front
# (transformers imports a model's module when the model is first built).
PRELOAD = ("torch", "transformers", "peft", "scaletrain.worker.loop", "scaletrain.model.build",
           "transformers.models.auto.modeling_auto", "transformers.models.bert.modeling_bert",
           "transformers.models.llama.modeling_llama", "transformers.models.qwen2.modeling_qwen2",
           "transformers.models.mistral.modeling_mistral", "transformers.models.gemma.modeling_gemma",
           "pandas", "pyarrow", "requests", "google.protobuf", "jsonschema", "click", "colorful", "msgpack",
           "pydantic", "aiohttp", "attr", "dateutil")
READY = "ready"
MODULE = forked.CALLER_MODULE  # what `python -m` runs: the server, or a caller Ray started

def fork_mismatch(requested: dict[str, str], server: dict[str, str],
                  set_by_imports: dict[str, str] | None = None) -> str | None:
    """Why a worker with environment ``requested`` cannot be forked from a server started with ``server``.

    A variable the server's own imports set (``set_by_imports``: torch's TORCHINDUCTOR_CACHE_DIR) matches when the
    caller holds the same value: a process that inherited it from a forked one (a forked driver's Ray workers) is
    the process that the same imports would make."""
    set_by_imports = set_by_imports or {}
    for name in sorted(set(requested) | set(server)):
        if (name.startswith(envvars.FORK_MATCHED_PREFIXES) and name not in envvars.FORK_UNMATCHED
                and not name.startswith(envvars.FORK_UNMATCHED_PREFIXES) and requested.get(name) != server.get(name)
                and not (name in set_by_imports and requested.get(name) == set_by_imports[name])):
            return f"{name} differs from the fork server's"  # never the values: they may be secrets
    return None


def command(sock_path: str) -> str:
    """The ``py_executable`` for Ray's runtime_env: Ray appends default_worker.py and its arguments."""
    import shlex

    return f"{shlex.quote(sys.executable)} -m {MODULE} {shlex.quote(sock_path)}"


def answers(sock_path: str, timeout_s: float = 0.5) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout_s)
    try:
        s.connect(sock_path)
        return True
    except OSError:
        return False
    finally:
        s.close()


# --- the caller: the process Ray starts for a worker --------------------------------------------------------

def _exec_plain(argv: list[str]) -> None:
    os.execv(sys.executable, [sys.executable, *argv])


def _readline(f) -> dict:
    line = f.readline()
    return json.loads(line) if line else {}


def run_forked(sock_path: str, argv: list[str], env: dict[str, str], module: str | None = None) -> int | None:
    """Have the server fork a child running ``argv`` (a script, or ``module`` as ``__main__``) with this process's
    stdio and directory and environment ``env``; wait for it and return its exit status in the shell's convention
    (128 + N for a child killed by signal N), passing it the signals this process gets. None (nothing started)
    when no server answers or it says a fork would not be the same process."""
    code = _run_forked(sock_path, argv, env, module)
    return code if code is None or code >= 0 else 128 - code


def _run_forked(sock_path: str, argv: list[str], env: dict[str, str], module: str | None) -> int | None:
    """``run_forked``, the child's status as ``os.waitstatus_to_exitcode`` gives it (-N: killed by signal N)."""
    import signal

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(sock_path)
    except OSError:
        s.close()
        return None
    request = json.dumps({"argv": argv, "env": env, "cwd": os.getcwd(), "module": module,
                          "python": [sys.executable, sys.prefix], "unbuffered": _unbuffered()}).encode()
    socket.send_fds(s, [len(request).to_bytes(8, "big")], [0, 1, 2])
    s.sendall(request)
    f = s.makefile("r")
    reply = _readline(f)
    if "pid" not in reply:
        s.close()
        return None
    child = reply["pid"]

    def forward(signum, _frame):
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    return _readline(f).get("exit", 1)  # EOF: the server died, and took the child with it


def _unbuffered() -> bool:  # ``python -u`` or PYTHONUNBUFFERED: the child's output is unbuffered too
    import io

    return not isinstance(getattr(sys.stdout, "buffer", None), io.BufferedWriter)


def call(sock_path: str, argv: list[str]) -> int:
    """The process Ray (or torchrun's agent) starts for a worker, ``argv`` as ``python`` takes it (a script or
    ``-m MODULE``, and arguments): a forked child runs it and this process ends as the child did (by the same
    signal), or it execs the plain interpreter (no return)."""
    import signal

    module = argv[1] if argv[:1] == ["-m"] and len(argv) > 1 else None
    code = _run_forked(sock_path, [module, *argv[2:]] if module else argv, envvars.snapshot(), module)
    if code is None:
        _exec_plain(argv)
    if code < 0:  # this process forwards signals (SIGKILL's handler cannot be changed): not this one
        if -code != signal.SIGKILL:
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


# --- the server ---------------------------------------------------------------------------------------------

def _module_files() -> dict[str, float]:
    files = {}
    for mod in list(sys.modules.values()):
        path = getattr(mod, "__file__", None)
        if path and path.endswith(".py"):
            try:
                files[path] = os.stat(path).st_mtime
            except OSError:
                pass
    return files


def _stale(files: dict[str, float]) -> str | None:
    for path, mtime in files.items():
        try:
            if os.stat(path).st_mtime != mtime:
                return path
        except OSError:
            return path
    return None


def _run_child(request: dict, fds: list[int]) -> None:
    """In the forked child: become the worker Ray asked for, then exit with its status (never returns)."""
    import atexit
    import runpy
    import signal
    import traceback

    code = 1
    try:
        os.setpgid(0, 0)  # Ray stops a worker by signalling its process group: one group per worker, as Ray makes
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.set_wakeup_fd(-1)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        envvars.replace_all(request["env"])
        os.chdir(request["cwd"])
        argv = request["argv"]
        extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
        sys.argv = list(argv)
        # buffered as a fresh interpreter would (by line on a terminal; not at all for a caller run with -u)
        sys.stdout.reconfigure(line_buffering=os.isatty(1), write_through=bool(request.get("unbuffered")))
        sys.stderr.reconfigure(write_through=bool(request.get("unbuffered")))
        if request.get("module"):
            sys.path[:0] = [os.getcwd(), *extra]
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        else:
            sys.path[:0] = [os.path.dirname(os.path.abspath(argv[0])), *extra]
            runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - the child's own error, printed as an interpreter would
        traceback.print_exc()
    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _kill(pid: int) -> None:
    """A child and its process group (not made yet by a child that has only just been forked)."""
    import signal

    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class ForkServer:
    """The server's event loop: ``accept`` a caller (fork its child, or refuse), ``reap`` children that
    exited (their callers get the status), ``hang_up`` for a caller that left (its child goes with it)."""

    def __init__(self, sock_path: str, base_env: dict[str, str], imported_env: dict[str, str]):
        import selectors
        import signal

        self.sock_path, self.base_env, self.imported_env = sock_path, base_env, imported_env
        self.files = _module_files()
        if os.path.exists(sock_path):
            os.unlink(sock_path)
        old_umask = os.umask(0o077)  # only this user may ask for workers
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(sock_path)
        os.umask(old_umask)
        self.listener.listen(64)
        self.wake_r, wake_w = os.pipe()
        self.wake_w = wake_w
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, self._stop)
        self.children: dict[int, socket.socket] = {}  # pid -> its caller
        self.callers: dict[int, int] = {}  # pid -> its caller's pid
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.listener, selectors.EVENT_READ, "accept")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "child")

    def _stop(self, _signum, _frame):  # `scaletrain down`: the workers this server forked go with it
        for pid in self.children:
            _kill(pid)
        os._exit(0)

    def run(self) -> None:
        print(READY, flush=True)
        while True:
            for key, _ in self.sel.select():
                if key.data == "accept":
                    self.accept()
                elif key.data == "child":
                    self.reap()
                else:
                    self.hang_up(key.data)

    def accept(self) -> None:
        import selectors

        conn, _ = self.listener.accept()
        try:
            request, fds = _receive(conn)
        except (OSError, ValueError):
            conn.close()
            return
        why = self._why_not(request)
        if why or len(fds) != 3:
            for fd in fds:
                os.close(fd)
            _refuse(conn, why or "the caller's stdio did not arrive")
            if _stale(self.files) and not self.children:  # start over with the new code (meanwhile: plain starts)
                print("restarting to import the changed modules", flush=True)
                self.listener.close()
                os.execve(sys.executable, [sys.executable, "-m", MODULE, "--serve", self.sock_path],
                          self.base_env)
            return
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            for f in (self.listener, conn, *self.children.values()):
                f.close()
            os.close(self.wake_r)
            os.close(self.wake_w)
            _run_child({**request, "env": {**self.imported_env, **request["env"]}}, fds)
        for fd in fds:
            os.close(fd)
        print(f"forked {pid}", flush=True)
        self.children[pid] = conn
        self.callers[pid] = _caller_pid(conn)
        if self.callers[pid]:  # for what follows the caller's process tree (forked.py)
            forked.note(self.sock_path, self.callers[pid], pid)
        self.sel.register(conn, selectors.EVENT_READ, pid)
        if not _send(conn, {"pid": pid}):
            _kill(pid)  # reaped, and its connection closed, with the other exits

    def _why_not(self, request: dict) -> str | None:
        """Why a fork would not be the process the caller would have started, or None."""
        if request.get("python") != [sys.executable, sys.prefix]:
            return "the caller runs another Python (interpreter or environment)"
        if why := fork_mismatch(request["env"], self.base_env, self.imported_env):
            return why
        stale = _stale(self.files)
        return f"{stale} changed since the fork server imported it" if stale else None

    def reap(self) -> None:
        try:
            os.read(self.wake_r, 4096)
        except BlockingIOError:
            pass
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            self._forget(pid)
            code = os.waitstatus_to_exitcode(status)
            print(f"exited {pid} {code}", flush=True)
            if conn is not None:
                self.sel.unregister(conn)
                _send(conn, {"exit": code})
                conn.close()

    def hang_up(self, pid: int) -> None:
        """A caller hung up (Ray killed the process it started): its worker goes with it."""
        conn = self.children.pop(pid, None)
        self._forget(pid)
        print(f"caller of {pid} hung up", flush=True)
        if conn is not None:
            self.sel.unregister(conn)
            conn.close()
            _kill(pid)

    def _forget(self, pid: int) -> None:
        if caller := self.callers.pop(pid, 0):
            forked.forget(self.sock_path, caller)


def _caller_pid(conn: socket.socket) -> int:
    """The pid of the process at the other end of ``conn`` (the kernel's SO_PEERCRED), 0 where it cannot say."""
    import struct

    try:
        return struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[0]
    except (OSError, AttributeError):
        return 0


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    head, fds, _, _ = socket.recv_fds(conn, 8, 3)
    size = int.from_bytes(head, "big")
    body = b""
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise OSError("caller hung up")
        body += chunk
    return json.loads(body), fds


def _send(conn: socket.socket, reply: dict) -> bool:
    try:
        conn.sendall(json.dumps(reply).encode() + b"\n")
        return True
    except OSError:  # the caller is gone already: the server carries on
        return False


def _refuse(conn: socket.socket, why: str) -> None:
    print(f"exec: {why}", flush=True)
    _send(conn, {"exec": why})
    conn.close()


def serve(sock_path: str, preload: tuple[str, ...] = PRELOAD) -> None:
    """Import ``preload``, then fork one child per caller until killed. Prints READY once it listens."""
    import importlib

    base_env = envvars.snapshot()  # what an exec'd worker's environment would hold before its imports
    for name in preload:
        importlib.import_module(name)
    # what the imports set in the environment (torch: TORCHINDUCTOR_CACHE_DIR), as they would in a worker
    imported_env = {k: v for k, v in envvars.snapshot().items() if base_env.get(k) != v}
    ForkServer(sock_path, base_env, imported_env).run()


def main(args: list[str]) -> int:
    if args[:1] == ["--serve"]:
        serve(args[1])
        return 0
    return call(args[0], args[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
