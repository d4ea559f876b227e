"""Where a run's wall time went (goodput): start-up, productive training, evaluation, checkpoint stalls, restarts
and the work they redid, from the driver's and rank 0's timestamps.

The driver marks its phases in ``timeline.jsonl`` (launch, data prepared, cluster up, end); rank 0 marks each
worker start (a fresh worker group: the first, and every restart) and when its model is ready; metrics.jsonl
already holds every step's time (train records, eval and checkpoint time kept out), each evaluation's and each
checkpoint's. A resumed run appends to the same files, so its account covers every driver session.

Categories (seconds; they add up to the wall time, ``other`` being what none claims: the first step's set-up,
idle waits):
- ``data_prep_s``: launch to data prepared (tokenization, or the cache read), the driver's preflight.
- ``cluster_start_s``: data prepared to the cluster being up (Ray started or joined; torchrun agents).
- ``worker_start_s``: cluster up to the workers' processes running.
- ``model_load_s``: worker start to the model built and its checkpoint restored.
- ``compile_s``: ``train.compile``'s compiling (the first steps' graphs, and any recompile), kept out of the
  step time.
- ``productive_s``: step time of the steps that count (each step once).
- ``sync_s``: GRPO's weight syncs to a separate rollout engine (``time/sync_s``, part of each step), kept out of
  the productive time as the step waits for them.
- ``lost_work_s``: step time of steps trained again after a restart (the work since the last checkpoint).
- ``eval_s``, ``checkpoint_s``: evaluation, and the time steps waited for checkpoint saves.
- ``restart_s``: the last record before a worker restart to the restart's first worker start (detection and
  teardown). Split under ``restarts/`` (parts of the categories, not more of them): ``restarts/detect_s`` (that
  last record to the controller seeing the failure: its ``failure_detected`` mark), ``restarts/worker_start_s``
  (to the new workers running) and ``restarts/restore_s`` (the restarts' model builds and checkpoint restores,
  counted in ``model_load_s``).
- ``finish_s``: the end of training to the end of the session (the final save and the workers' teardown; the
  final evaluation is in ``eval_s``).
Goodput = productive / wall. ETTR (Meta's effective training time ratio) is productive / (wall − time waiting
for resources); a local run waits for none, so here it equals goodput, and the key is kept for clusters.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from scaletrain.metrics.records import read_jsonl
from scaletrain.rundir import RunDir

RESTART_PARTS = ("detect", "worker_start", "restore")
CATEGORIES = ("data_prep", "cluster_start", "worker_start", "model_load", "compile", "productive", "lost_work",
              "sync", "eval", "checkpoint", "restart", "finish", "other")


def young_daly_s(checkpoint_s: float, mtbf_s: float) -> float:
    """The checkpoint interval that loses the least time to checkpoints and failures together: sqrt(2 x C x M) for
    a checkpoint that costs C seconds and a mean time between failures of M seconds (Young 1974; Daly 2006's
    first-order term), valid while C is small against M."""
    return math.sqrt(2 * checkpoint_s * mtbf_s)


def mark(run_dir: str | Path, event: str, at: float | None = None) -> None:
    """Append ``event`` at ``at`` (default now) to the run's timeline: one short line, safe from two writers."""
    line = json.dumps({"time": time.time() if at is None else at, "event": event}) + "\n"
    with open(RunDir(run_dir).timeline, "a") as f:
        f.write(line)


class DriverClock:
    """The driver's phase times, held until the run directory exists (it is made after the data and the cluster
    are ready), then written to its timeline."""

    def __init__(self):
        self.marks: list[tuple[str, float]] = [("launch", time.time())]
        self.run_dir: Path | None = None

    def mark(self, event: str) -> None:
        self.marks.append((event, time.time()))
        if self.run_dir is not None:
            mark(self.run_dir, event, self.marks[-1][1])

    def attach(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        for event, at in self.marks:
            mark(run_dir, event, at)


def account(run_dir: str | Path, now: float | None = None) -> dict:
    """The run's goodput keys (``goodput/*``) over every driver session in its directory. ``now``: a live view
    (``watch``): the session still running is counted up to it."""
    rd = RunDir(run_dir)
    timeline = read_jsonl(rd.timeline)
    records = read_jsonl(rd.metrics)
    total = dict.fromkeys(CATEGORIES, 0.0)
    split = dict.fromkeys(RESTART_PARTS, 0.0)
    wall, sessions, interruptions = 0.0, 0, 0
    starts = [i for i, m in enumerate(timeline) if m["event"] == "launch"]
    for k, begin in enumerate(starts):
        marks = timeline[begin:starts[k + 1] if k + 1 < len(starts) else len(timeline)]
        at = {}
        for m in marks:
            at.setdefault(m["event"], m["time"])
        if "end" not in at and now is not None and k == len(starts) - 1:
            at["end"] = now  # the session running now
        if "end" not in at:
            continue  # a session that did not finish (killed driver): its time is unknown
        sessions += 1
        wall += at["end"] - at["launch"]
        total["data_prep"] += at.get("prepared", at["launch"]) - at["launch"]
        total["cluster_start"] += at.get("cluster", at.get("prepared", at["launch"])) - at.get("prepared",
                                                                                               at["launch"])
        session_records = [r for r in records if at["launch"] <= r.get("time", 0) <= at["end"]]
        interruptions += _session(marks, at, session_records, total, split)
        if "train_end" in at:
            final_eval = sum(r.get("time/final_eval_s", 0.0) for r in session_records)
            total["finish"] += max(0.0, at["end"] - max(m["time"] for m in marks if m["event"] == "train_end")
                                   - final_eval)
    _steps(records, total)
    claimed = sum(v for k, v in total.items() if k != "other")
    total["other"] = max(0.0, wall - claimed)
    out = {f"goodput/{k}_s": v for k, v in total.items()} | {f"restarts/{k}_s": v for k, v in split.items()}
    ratio = total["productive"] / wall if wall else 0.0
    out.update({"goodput/wall_s": wall, "goodput/ratio": ratio, "goodput/ettr": ratio,
                "goodput/interruptions": interruptions, "goodput/sessions": sessions})
    return out


def _session(marks: list[dict], at: dict, records: list[dict], total: dict, split: dict) -> int:
    """Worker starts, model loads and restarts of one driver session; returns its interruptions."""
    previous = at.get("cluster", at.get("prepared", at["launch"]))
    starts = [m["time"] for m in marks if m["event"] == "worker_start"]
    ready = [m["time"] for m in marks if m["event"] == "model_ready"]
    detected = [m["time"] for m in marks if m["event"] == "failure_detected"]
    for i, start in enumerate(starts):
        loaded = next((r for r in ready if r >= start), start)
        if i > 0:  # a restart: detection, teardown and the new group's start, from the failed group's last record
            last = max([r["time"] for r in records if previous <= r["time"] <= start] or [previous])
            total["restart"] += max(0.0, start - last)
            seen = next((d for d in detected if last <= d <= start), last)  # no mark: detection unknown (0)
            split["detect"] += seen - last
            split["worker_start"] += max(0.0, start - seen)
            split["restore"] += loaded - start
        else:
            total["worker_start"] += max(0.0, start - previous)
        total["model_load"] += loaded - start
        previous = loaded
    return max(0, len(starts) - 1)


def _steps(records: list[dict], total: dict) -> None:
    """Productive and lost step time, evaluation and checkpoint stalls, from metrics.jsonl."""
    done = last = 0  # the highest step trained so far: a step at or below it after a restart is trained again
    for r in records:
        kind = r.get("kind")
        if kind == "train":
            step = r["step"]
            n = int(r.get("window_steps", max(1, step - last)))  # the steps this record's times cover
            redone = min(n, max(0, min(step, done) - (step - n)))
            sync = min(r.get("time/sync_s", 0.0), r.get("time/step_s", 0.0))  # GRPO's, inside the step
            per = r.get("time/step_s", 0.0) - sync
            total["sync"] += n * sync
            total["lost_work"] += redone * per
            total["productive"] += (n - redone) * per
            done, last = max(done, step), step
            total["compile"] += r.get("time/compile_s", 0.0)  # train.compile: kept out of the step time
        elif kind == "eval":
            total["eval"] += r.get("time/eval_s", r.get("time/final_eval_s", 0.0))
        elif kind == "checkpoint":
            total["checkpoint"] += r.get("time/checkpoint_s", 0.0)


def one_line(g: dict) -> str:
    """The account in one line (``watch``), its biggest parts first."""
    if not g.get("goodput/wall_s"):
        return "goodput: no session with a start yet"
    parts = sorted(((k.removeprefix("goodput/").removesuffix("_s"), v) for k, v in g.items()
                    if k.endswith("_s") and k not in ("goodput/wall_s", "goodput/productive_s") and v >= 0.05),
                   key=lambda kv: -kv[1])
    rest = ", ".join(f"{name.replace('_', ' ')} {v:.1f} s" for name, v in parts)
    return (f"goodput {g['goodput/ratio']:.0%} of {g['goodput/wall_s']:.0f} s: productive "
            f"{g['goodput/productive_s']:.1f} s" + (f", {rest}" if rest else "")
            + f"; {g['goodput/interruptions']} interruption(s)")
