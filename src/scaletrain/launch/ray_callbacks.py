"""Ray Train controller callbacks (imported only when the Ray launcher runs: importing Ray costs ~1 s)."""

from __future__ import annotations

# ControllerCallback is Ray Train's DeveloperAPI too: its ``on_controller_start_worker_group`` is the one hook that
# sets where a (re)started worker group is placed, called before every start, restarts included.
from ray.train.v2._internal.execution.callback import ControllerCallback
from ray.train.v2.api.callback import UserCallback  # DeveloperAPI: runs in the Train controller process

from scaletrain.comm.watchdog import diagnose, looks_like_timeout
from scaletrain.launch.failures import format_groups, group_failures
from scaletrain.metrics.goodput import mark
from scaletrain.metrics.gpu import faulty_nodes
from scaletrain.metrics.logs import EventLog


class FailureEvents(UserCallback):
    """Writes each worker-group failure to main.log: ranks, causes, attempt k of N, what happens next."""

    def __init__(self, run_dir: str, world_size: int, max_failures: int, redactor=None):
        self.run_dir, self.world_size, self.max_failures = run_dir, world_size, max_failures
        self.redactor = redactor
        self.attempt = 0

    def after_exception(self, run_context, worker_exceptions: dict) -> None:
        mark(self.run_dir, "failure_detected")  # the goodput account splits a restart's time at it
        self.attempt += 1
        groups, _ = group_failures(worker_exceptions)
        allowed = "unlimited" if self.max_failures < 0 else str(self.max_failures)
        restart = self.max_failures < 0 or self.attempt <= self.max_failures
        hang = diagnose(self.run_dir, self.world_size) if looks_like_timeout(m for _, m in groups) else None
        text = f"failure {self.attempt} (max_failures={allowed}): {format_groups(groups)}"
        if hang:
            text += f"; {hang.message(0).split('; rank(s)')[0]}"
        text += "; restarting the worker group from the newest checkpoint" if restart else "; no restarts left"
        EventLog(self.run_dir, "controller", self.redactor)("failure", text)


NODE_ID_LABEL = "ray.io/node-id"  # the label Ray gives every node: its id


class NodeExclusion(ControllerCallback):
    """Leaves the nodes of likely hardware faults out of the restarted worker group: a failed worker whose GPU's
    uncorrectable errors rose marks its node in its exception's notes (worker/loop.py); when the controller
    restarts (or, elastic, reschedules) after that failure, the new group gets a label selector excluding every
    such node of the run. An elastic run goes on with the nodes left; a fixed-size one waits for a replacement."""

    def __init__(self, run_dir: str, redactor=None):
        self.run_dir, self.redactor = run_dir, redactor
        self.excluded: dict[str, str] = {}  # node id -> why

    def after_controller_state_update(self, previous_state, current_state) -> None:
        error = getattr(current_state, "training_failed_error", None)
        failures = getattr(error, "worker_failures", None) or {}
        for rank, exc in failures.items():
            for node in faulty_nodes(failure_text(exc)):
                if node not in self.excluded:
                    self.excluded[node] = f"rank {rank}"
                    EventLog(self.run_dir, "controller", self.redactor)(
                        "exclude", f"node {node[:12]} (a likely hardware fault on rank {rank}'s GPU) is left out "
                                   f"of the restarted worker group")

    def on_controller_start_worker_group(self, *, scaling_config, num_workers: int) -> dict[str, str] | None:
        return exclusion_selector(self.excluded)


def failure_text(exc) -> str:
    """All a worker's failure says: its message, its notes (which pickling keeps) and, when Ray wrapped it, the
    traceback text Ray kept (which shows the notes too)."""
    parts = [str(exc), *getattr(exc, "__notes__", ())]
    base = getattr(exc, "_base_exc", None)
    if base is not None:
        parts += getattr(base, "__notes__", ())
    return "\n".join(parts)


def exclusion_selector(nodes) -> dict[str, str] | None:
    """Ray's label selector for "any node but these" (``!in(a,b)``), or None when there are none."""
    return {NODE_ID_LABEL: f"!in({','.join(sorted(nodes))})"} if nodes else None
