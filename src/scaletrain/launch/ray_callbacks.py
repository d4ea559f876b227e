"""Ray Train controller callbacks (imported only when the Ray launcher runs: importing Ray costs ~1 s)."""

from __future__ import annotations

from ray.train.v2.api.callback import UserCallback  # DeveloperAPI: runs in the Train controller process

from scaletrain.comm.watchdog import diagnose, looks_like_timeout
from scaletrain.launch.failures import format_groups, group_failures
from scaletrain.metrics.logs import EventLog


class FailureEvents(UserCallback):
    """Writes each worker-group failure to main.log: ranks, causes, attempt k of N, what happens next."""

    def __init__(self, run_dir: str, world_size: int, max_failures: int, redactor=None):
        self.run_dir, self.world_size, self.max_failures = run_dir, world_size, max_failures
        self.redactor = redactor
        self.attempt = 0

    def after_exception(self, run_context, worker_exceptions: dict) -> None:
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
