"""The per-step agreement of all ranks: is some rank's loss non-finite, did some rank see the stop file."""

from __future__ import annotations

import math
import os

from scaletrain.config.schema import Config
from scaletrain.errors import TrainingError
from scaletrain.metrics.alerts import Alert, write_alert
from scaletrain.rundir import RunDir
from scaletrain.worker.parallel import all_reduce_max_async
from scaletrain.worker.spec import JobSpec


def due(every: int, step: int) -> bool:
    """A schedule of every ``every`` steps (0: never)."""
    return bool(every) and step % every == 0


class StepCheck:
    """Every rank takes the same decision at the same step on (some rank's loss is NaN/Inf, some rank saw the
    stop file), agreed with a two-float all-reduce.

    The all-reduce of step N finishes in the background while step N+1 computes and is read after it: waiting
    for it every step cost 7% of throughput with 2 gloo workers (benchmarks/step_check_cost.py). A step that
    writes anything (metrics, eval, checkpoint) or ends the run waits for its own answer, so nothing is
    written from a step whose loss some rank saw diverge."""

    def __init__(self, run_dir: str, device: str):
        self.stop_file, self.device = RunDir(run_dir).stop, device
        self._pending = None  # (step, this rank's loss, result of the all-reduce)

    def advance(self, step: int, loss: float, wait: bool) -> tuple[tuple[int, float] | None, bool]:
        """Read the previous step's answer, post this step's (and read it too with ``wait``).

        Returns ((step, this rank's loss) of the first non-finite step read, or None; stop requested)."""
        answers = [self._read()] if self._pending else []
        bad = 0.0 if math.isfinite(loss) else 1.0
        seen = 1.0 if os.path.exists(self.stop_file) else 0.0
        self._pending = (step, loss, all_reduce_max_async([bad, seen], self.device))
        if wait:
            answers.append(self._read())
        first_bad = next(((s, loss_s) for s, loss_s, b, _ in answers if b), None)
        return first_bad, any(stop for *_, stop in answers)

    def _read(self) -> tuple[int, float, bool, bool]:
        step, loss, result = self._pending
        self._pending = None
        bad, seen = result()
        return step, loss, bad > 0, seen > 0


def writes_at(step: int, cfg: Config, spec: JobSpec, metrics) -> bool:
    """Whether the loop writes a metric record, evaluates or checkpoints after ``step`` (or the run ends)."""
    return (metrics.record_due(step) or metrics.probe_due(step) or step >= spec.total_steps
            or due(cfg.train.eval_steps, step) or due(cfg.checkpoint.save_steps, step))


def non_finite_loss(run_dir: str, step: int, loss: float, rank: int, events, step_tokens: int | None = None,
                    saved: list[str] | None = None, resume: str | None = None) -> TrainingError:
    """The error (and the alert) of a non-finite loss: the advice names a data cause when the step shows one
    (``step_tokens``: this rank's target tokens in the step, causal LM) and a checkpoint only if one exists
    (``saved``: the checkpoints' names, when they are not in ``run_dir``; ``resume``: what to resume, when not
    ``run_dir``: a run on object storage)."""
    from scaletrain.checkpoint import list_checkpoints
    from scaletrain.rundir import RunDir

    mine = "" if math.isfinite(loss) else f" (rank {rank}: {loss})"
    alert = Alert("non_finite_loss", f"loss is not finite at step {step}{mine}; the run stops before saving anything "
                                     f"from this step", step=step, rank=rank, severity="error")
    if rank == 0:
        write_alert(run_dir, alert)
        events("alert", f"{alert.rule}: {alert.message}")
    if step_tokens == 0:
        advice = ("this step's batches hold no target token (every label is prompt or padding): raise "
                  "data.max_length (cutoff_len) or fix the data")
    else:
        advice = "lower train.learning_rate, set train.max_grad_norm, or check the data"
    saved = saved if saved is not None else [p.name for p in list_checkpoints(RunDir(run_dir).checkpoints)]
    where = (f"the last checkpoint, {saved[-1]}, is intact: scaletrain train --resume {resume or run_dir}" if saved
             else "no checkpoint was saved before it")
    return TrainingError(f"{alert.message}; {advice} ({where})")
