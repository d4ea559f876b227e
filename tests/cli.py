"""``scaletrain ARGS`` in the test's own process (torchtune's recipe tests run their CLI the same way): the CLI's
entry, ``scaletrain.cli.main(argv)``, with its stdout and stderr captured, returned as ``subprocess.run`` returns a
child's. A subprocess costs ~5-10 CPU-seconds of imports (torch, transformers, peft) before the command's first
line; here they are imported once for the whole session.

What a process of its own would give, and this must give too, so a test sees the same output and exit code:
- the exit code: ``main``'s return, ``SystemExit``'s code (argparse), and 1 with the traceback on stderr for an
  uncaught exception, as the interpreter does;
- warnings printed to stderr each time (the warning registry is reset and pytest's recording is undone for the
  call), the console's width read from the call's COLUMNS; logging handlers and levels, the environment, the
  working directory, signal handlers and torch's thread count as they were before the call.
A test that checks what only a process shows (an exit on a signal, a kill -9, orphans, the warm cluster's forked
driver: ``main`` with no argv) keeps a subprocess.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import subprocess
import sys
import traceback
import warnings

_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)


def run_cli(*args, cwd=None, env: dict | None = None, timeout: float | None = None) -> subprocess.CompletedProcess:
    """``scaletrain *args`` in this process; ``env`` replaces the environment for the call (as ``subprocess.run``'s
    does); ``timeout`` is accepted for the subprocess helpers' signature (pytest's own timeout bounds the test)."""
    from scaletrain.cli import main

    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    with _as_a_fresh_process(cwd, env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else _print_exit(e.code))
        except BaseException:  # noqa: BLE001 - as the interpreter: the traceback on stderr, exit 1
            traceback.print_exc()
            code = 1
    return subprocess.CompletedProcess(["scaletrain", *argv], int(code or 0), out.getvalue(), err.getvalue())


def _print_exit(message) -> int:
    print(message, file=sys.stderr)
    return 1


@contextlib.contextmanager
def _as_a_fresh_process(cwd, env: dict | None):
    import torch

    root = logging.getLogger()
    loggers = {name: (lg.level, list(lg.handlers), lg.propagate)
               for name, lg in logging.Logger.manager.loggerDict.items() if isinstance(lg, logging.Logger)}
    root_state = (root.level, list(root.handlers))
    environ = dict(os.environ)
    handlers = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    from scaletrain.console import console

    here, threads = os.getcwd(), torch.get_num_threads()
    width = console._width  # a fresh process's console reads COLUMNS when it starts: this one, for the call
    console._width = None
    if env is not None:
        os.environ.clear()
        os.environ.update({k: str(v) for k, v in env.items()})
    if cwd is not None:
        os.chdir(cwd)
    try:
        with warnings.catch_warnings():  # entering resets every module's "shown once" registry
            warnings.resetwarnings()  # the interpreter's defaults, not pytest's recording filters
            warnings.showwarning = warnings._showwarning_orig  # pytest records warnings: print them, as a process
            warnings._showwarnmsg_impl = _print_warning
            for action, category in (("ignore", DeprecationWarning), ("ignore", PendingDeprecationWarning),
                                     ("ignore", ImportWarning), ("ignore", ResourceWarning)):
                warnings.simplefilter(action, category)
            yield
    finally:
        os.chdir(here)
        console._width = width
        os.environ.clear()
        os.environ.update(environ)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        torch.set_num_threads(threads)
        _restore_logging(root, root_state, loggers)


def _print_warning(message: warnings.WarningMessage) -> None:
    sys.stderr.write(warnings._formatwarnmsg(message))


def _restore_logging(root: logging.Logger, root_state, loggers: dict) -> None:
    """Handlers a command added (bound to the captured streams) closed and removed; levels as they were."""
    level, handlers = root_state
    for handler in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(handler)
        handler.close()
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)
    for name, lg in logging.Logger.manager.loggerDict.items():
        if not isinstance(lg, logging.Logger):
            continue
        before_level, before_handlers, propagate = loggers.get(name, (logging.NOTSET, [], True))
        for handler in [h for h in lg.handlers if h not in before_handlers]:
            lg.removeHandler(handler)
            handler.close()
        lg.setLevel(before_level)
        lg.propagate = propagate
