"""The driver's console: a live progress bar fed by rank 0's metrics.jsonl, and the final summary table.

Reading the file rather than a Ray channel keeps the progress view the same for every launcher.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

console = Console(stderr=True)

# Third-party warnings that scaletrain's own calls trigger and that tell the user nothing they can act on: (message
# regex, category). Matched by message, so a library's warning about something the user wrote still shows; worker
# processes keep them in their logs (only the command's own process filters them).
LIBRARY_NOISE = (
    # peft's PeftModel reads model.is_gradient_checkpointing, deprecated in transformers 5 (eval, chat, export, train)
    (r"`is_gradient_checkpointing` is deprecated", FutureWarning),
)
# Loggers whose import-time warnings say nothing to act on: with torchao installed (the QLoRA extra), transformers
# imports it in every process; it warns that its CUDA-only extensions do not load on this build, and torch that
# torchao registers enums the old way.
NOISY_LOGGERS = ("torchao", "torch.utils._pytree")


def quiet_library_warnings() -> None:
    """Filter LIBRARY_NOISE in this process (the CLI calls it once, before any command runs)."""
    import logging
    import warnings

    for message, category in LIBRARY_NOISE:
        warnings.filterwarnings("ignore", message=message, category=category)
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


class ProgressView:
    """The live progress bar: step/total, loss, aggregated samples/s, the slowest rank, ETA."""

    def __init__(self, total_steps: int):
        self.progress = Progress(
            TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), console=console, transient=False,
        )
        self.task = self.progress.add_task("train", total=total_steps, info="starting workers")

    def show(self, r: dict) -> None:
        info = f"loss {r['train/loss']:.4f}  {r['throughput/samples_per_s']:.1f} samples/s"
        times = r.get("ranks/step_s")
        if times and len(times) > 1:
            slow = max(range(len(times)), key=times.__getitem__)
            info += f"  slowest rank {slow} ({times[slow]:.2f} s/step)"
        self.progress.update(self.task, completed=r["step"], info=info)

    def start(self) -> None:
        self.progress.start()

    def stop(self) -> None:
        self.progress.stop()


def summary_table(summary: dict, run_dir: str | Path) -> Table:
    t = Table(title=f"scaletrain run {Path(run_dir).name}", show_header=False)
    t.add_column("key", style="bold")
    t.add_column("value")
    rows = [
        ("model", f"{summary['model']} ({summary['task']}, {summary['finetuning_type']})"),
        ("workers", f"{summary['world_size']} x {summary['device']} ({summary['backend']}, {summary['strategy']})"),
        ("global batch", str(summary["global_batch_size"])),
        ("steps", str(summary["steps"])),
        ("train time", f"{summary['train_time_s']:.1f} s"),
        ("eval time", f"{summary['eval_time_s']:.1f} s"),
        ("throughput", f"{summary['throughput/samples_per_s']:.1f} samples/s"),
    ]
    rows += [(k, f"{v:.4f}" if isinstance(v, float) else str(v)) for k, v in summary.get("final", {}).items()]
    rows.append(("run directory", str(run_dir)))
    for k, v in rows:
        t.add_row(k, v)
    return t
