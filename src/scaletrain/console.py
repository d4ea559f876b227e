"""The driver's console: a live progress bar fed by rank 0's metrics.jsonl, and the final summary table.

Reading the file rather than a Ray channel keeps the progress view the same for every launcher.
"""

from __future__ import annotations

import threading
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from scaletrain.metrics.records import read_jsonl

console = Console(stderr=True)


class LiveProgress:
    """Context manager: polls ``metrics.jsonl`` and shows step/total, loss, samples/s and ETA."""

    def __init__(self, run_dir: str | Path, total_steps: int, interval_s: float = 0.5):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.total, self.interval = total_steps, interval_s
        self._stop = threading.Event()
        self.progress = Progress(
            TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), console=console, transient=False,
        )
        self.task = self.progress.add_task("train", total=total_steps, info="starting workers")

    def _poll(self) -> None:
        while not self._stop.wait(self.interval):
            self.refresh()

    def refresh(self) -> None:
        records = [r for r in read_jsonl(self.path) if r.get("kind") == "train"]
        if records:
            r = records[-1]
            info = f"loss {r['train/loss']:.4f}  {r['throughput/samples_per_s']:.1f} samples/s"
            self.progress.update(self.task, completed=r["step"], info=info)

    def __enter__(self) -> "LiveProgress":
        self.progress.start()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.refresh()
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
