"""Alert rules: small objects fed metric records, each returning the alerts it raises.

A rule fires once when its condition starts and re-arms once the condition has been clear for ``REARM``
records in a row, so a slow rank (or a value hovering at the threshold) produces one alert, not one per logging
step. Rates are judged over the last ``WINDOW`` records (one slow step is jitter, five are a drop) and within
one scale: an elastic resize (``scaling/workers``) starts a new baseline.
Thresholds come from ``monitor.alerts``; 0 disables a rule.
NaN/Inf loss is checked in the workers every step (it must stop the run before anything is saved).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path

from scaletrain.config.schema import AlertsConfig
from scaletrain.rundir import RunDir


@dataclass(frozen=True)
class Alert:
    rule: str
    message: str
    step: int | None = None
    rank: int | None = None
    severity: str = "warning"
    time: float = field(default_factory=time.time)


REARM = 5  # clear records in a row before a rule that fired can fire again
WINDOW = 5  # records a rate is judged over


class Episode:
    """One condition's state: ``starts(True)`` is True when an episode begins; it ends after REARM clear
    records."""

    def __init__(self):
        self.active, self.clear = False, 0

    def starts(self, condition: bool) -> bool:
        if condition:
            self.clear = 0
            begun, self.active = not self.active, True
            return begun
        self.clear += 1
        if self.clear >= REARM:
            self.active = False
        return False


class Rule:
    name = "rule"

    def observe(self, record: dict) -> list[Alert]:
        raise NotImplementedError


class LowGpuUtil(Rule):
    name = "low_gpu_util"

    def __init__(self, min_pct: float, intervals: int):
        self.min_pct, self.intervals = min_pct, intervals
        self.below: dict[int, int] = {}

    def observe(self, r: dict) -> list[Alert]:
        if not self.min_pct or r.get("kind") != "system" or "gpu/util_pct" not in r:
            return []
        rank = r["rank"]
        if r["gpu/util_pct"] >= self.min_pct:
            self.below[rank] = 0
            return []
        self.below[rank] = self.below.get(rank, 0) + 1
        if self.below[rank] != self.intervals:
            return []
        return [Alert(self.name, f"rank {rank}: GPU utilisation {r['gpu/util_pct']:.0f}% is below "
                                 f"{self.min_pct:.0f}% for {self.intervals} samples in a row; the GPU waits on "
                                 f"input, communication or the host", rank=rank)]


class Straggler(Rule):
    """A rank that reaches the gradient sync later than the others (``ranks/ready_s``: its own work of the step;
    in synchronous training every rank's step time is the slowest one's, so step times cannot tell), named with
    its node, what the others wait, and the cause: its data (more tokens than the others: padding imbalance), its
    input pipeline (it waits for batches), its host (its process gets less CPU than the others': other processes
    compete) or else its device (the same work takes it longer). A rank is a straggler once it has been late for
    ``records`` train records in a row: one late step (a collector pause, a busy host for a moment) is noise."""

    name = "straggler"

    def __init__(self, factor: float, records: int = 3):
        self.factor, self.records = factor, records
        self.episodes: dict[int, Episode] = {}
        self.late: dict[int, int] = {}  # each rank's train records in a row above the threshold

    def observe(self, r: dict) -> list[Alert]:
        times = r.get("ranks/ready_s") or r.get("ranks/step_s")
        if not self.factor or r.get("kind") != "train" or not times or len(times) < 2:
            return []
        median = statistics.median(times)
        out = []
        for rank, t in enumerate(times):
            self.late[rank] = self.late.get(rank, 0) + 1 if median > 0 and t > self.factor * median else 0
            if self.episodes.setdefault(rank, Episode()).starts(self.late[rank] >= self.records):
                nodes = r.get("ranks/node") or []
                where = f" on node {nodes[rank]}" if rank < len(nodes) else ""
                step_s = r.get("time/step_s") or 0.0
                waited = (f"; the other ranks wait {t - median:.3f} s of each {step_s:.3f} s step "
                          f"({(t - median) / step_s:.0%})" if step_s else "")
                what = "reaches the gradient sync after" if "ranks/ready_s" in r else "takes"
                out.append(Alert(self.name, f"rank {rank}{where} is a straggler: it {what} {t:.3f} s vs the "
                                            f"median rank's {median:.3f} s ({t / median:.1f}x, threshold "
                                            f"{self.factor:g}x, {self.records} records in a row){waited}"
                                            f"{self._cause(r, rank)}",
                                 step=r.get("step"), rank=rank))
        return out


    @staticmethod
    def _cause(r: dict, rank: int) -> str:
        """Data (more tokens), input (waiting for batches), host (less CPU) or device: the first that fits."""
        def ratio(key: str) -> float | None:
            values = r.get(key)
            if not values or len(values) <= rank:
                return None
            median = statistics.median(values)
            return values[rank] / median if median > 0 else None

        tokens, wait, cpu = ratio("ranks/tokens"), r.get("ranks/data_wait_s"), ratio("ranks/cpu_pct")
        times = r.get("ranks/ready_s") or r.get("ranks/step_s")
        late = times[rank] - statistics.median(times)
        if tokens is not None and tokens > 1.2:
            return (f"; cause: data, padding imbalance: it had {tokens:.1f}x the median rank's tokens (keep "
                    f"data.balance_ranks=true or set data.packing=true)")
        others = [w for i, w in enumerate(wait or []) if i != rank]
        if others and len(wait) > rank and wait[rank] - statistics.median(others) >= 0.5 * late:
            return (f"; cause: input, it waits {wait[rank]:.3f} s a step for batches (raise data.loader_workers; "
                    f"check its node's disk)")
        if cpu is not None and cpu < 0.6:
            return (f"; cause: host, its process gets {cpu:.0%} of the median rank's CPU: other processes compete "
                    f"for its node's cores")
        if "ranks/ready_s" in r:
            return ("; cause: device, the same work takes it longer (a slow, throttled or faulty device: check its "
                    "clocks and errors, nvidia-smi -q -d PERFORMANCE / amd-smi metric)")
        return ""


class ThroughputDrop(Rule):
    name = "throughput_drop"
    warmup = 3  # records before the running median means anything

    def __init__(self, pct: float):
        self.pct = pct
        self.history: list[float] = []
        self.recent: deque[float] = deque(maxlen=WINDOW)
        self.episode = Episode()
        self.scale = None

    def observe(self, r: dict) -> list[Alert]:
        value = r.get("throughput/samples_per_s")
        if not self.pct or r.get("kind") != "train" or value is None:
            return []
        if r.get("scaling/workers") != self.scale:  # another number of workers: another normal speed
            self.scale, self.history, self.episode = r.get("scaling/workers"), [], Episode()
            self.recent.clear()
        self.recent.append(value)
        out = []
        if len(self.history) >= self.warmup and len(self.recent) == WINDOW:
            median, now = statistics.median(self.history), statistics.median(self.recent)
            if self.episode.starts(now < median * self.pct / 100):
                out.append(Alert(self.name, f"throughput fell to {now:.1f} samples/s (median of the last {WINDOW} "
                                            f"records), below {self.pct:.0f}% of its running median {median:.1f}",
                                 step=r.get("step")))
        self.history.append(value)
        return out


class MemoryGrowth(Rule):
    """Steady growth: over at least ``min_samples`` samples, 80% of the changes are increases and the
    total growth since the first sample exceeds ``pct`` percent. Samples count only once training has
    logged its first step: loading the model and the first batches grow memory legitimately."""

    name = "memory_growth"
    min_samples = 8

    def __init__(self, pct: float):
        self.pct = pct
        self.series: dict[int, list[float]] = {}
        self.fired: set[int] = set()
        self.training = False

    def observe(self, r: dict) -> list[Alert]:
        if r.get("kind") == "train":
            self.training = True
        if not self.pct or not self.training or r.get("kind") != "system" or r["rank"] in self.fired:
            return []
        key = "memory/allocated_gib" if "memory/allocated_gib" in r else "memory/rss_gib"
        s = self.series.setdefault(r["rank"], [])
        s.append(r[key])
        if len(s) < self.min_samples or s[0] <= 0:
            return []
        deltas = [b - a for a, b in zip(s, s[1:])]
        growth = (s[-1] - s[0]) / s[0] * 100
        if sum(d > 0 for d in deltas) >= 0.8 * len(deltas) and growth > self.pct:
            self.fired.add(r["rank"])
            return [Alert(self.name, f"rank {r['rank']}: {key} grew steadily by {growth:.0f}% over {len(s)} samples "
                                     f"({s[0]:.2f} -> {s[-1]:.2f} GiB): a leak trend (tensors kept across steps?)",
                          rank=r["rank"])]
        return []


class DataWait(Rule):
    name = "data_wait"

    def __init__(self, pct: float):
        self.pct = pct
        self.episode = Episode()
        self.recent: deque[tuple[float, float]] = deque(maxlen=WINDOW)

    def observe(self, r: dict) -> list[Alert]:
        wait, step = r.get("time/data_wait_s"), r.get("time/step_s")
        if not self.pct or r.get("kind") != "train" or wait is None or not step:
            return []
        self.recent.append((wait, step))
        if len(self.recent) < WINDOW:
            return []
        share = sum(w for w, _ in self.recent) / sum(s for _, s in self.recent) * 100
        out = []
        if self.episode.starts(share > self.pct):
            out.append(Alert(self.name, f"data wait is {share:.0f}% of step time over the last {WINDOW} records "
                                        f"(threshold {self.pct:.0f}%): the input "
                                        f"pipeline is the bottleneck; raise data.loader_workers or prefetch",
                             step=r.get("step")))
        return out


class GradNormSpike(Rule):
    """The gradient norm is not finite, or jumps above ``factor`` x its running median: the multi-GPU blow-ups
    users report show here first, steps before the loss diverges (LLaMA-Factory#7890)."""

    name = "grad_norm_spike"
    warmup = 3  # records before the running median means anything

    def __init__(self, factor: float):
        self.factor = factor
        self.history: list[float] = []

    def observe(self, r: dict) -> list[Alert]:
        norm = r.get("train/grad_norm")
        if not self.factor or r.get("kind") != "train" or norm is None:
            return []
        if not math.isfinite(norm):
            return [Alert(self.name, f"gradient norm is not finite ({norm}) at step {r.get('step')}; the next "
                                     f"steps will diverge: lower train.learning_rate or check the data",
                          step=r.get("step"), severity="error")]
        out = []
        if len(self.history) >= self.warmup:
            median = statistics.median(self.history[-50:])
            if median > 0 and norm > self.factor * median:
                out.append(Alert(self.name, f"gradient norm {norm:.4g} at step {r.get('step')} is {norm / median:.0f}x "
                                            f"its running median {median:.4g} (threshold {self.factor:g}x)",
                                 step=r.get("step")))
        self.history.append(norm)
        return out


class PreferenceHealth(Rule):
    """Preference tuning that learns nothing (rewards/accuracies at chance for ``stuck`` records in a row: swapped
    or near-identical pairs, a learning rate or beta too small) or runs away (the reward margin's size above
    ``margin_max``: the policy far from its reference, the usual start of reward hacking and degenerate text)."""

    name = "preference"

    def __init__(self, stuck: int, margin_max: float):
        self.stuck, self.margin_max = stuck, margin_max
        self.at_chance = 0
        self.runaway = Episode()

    def observe(self, r: dict) -> list[Alert]:
        accuracy, margin = r.get("rewards/accuracies"), r.get("rewards/margins")
        if r.get("kind") != "train" or accuracy is None:
            return []
        out = []
        self.at_chance = self.at_chance + 1 if 0.45 <= accuracy <= 0.55 else 0
        if self.stuck and self.at_chance == self.stuck:
            out.append(Alert(self.name, f"rewards/accuracies has been at chance ({accuracy:.2f}) for {self.stuck} "
                                        f"records: the policy does not tell chosen from rejected; check the pairs "
                                        f"(swapped or near-identical?), raise train.learning_rate or "
                                        f"train.pref_beta", step=r.get("step")))
        if self.margin_max and margin is not None and self.runaway.starts(abs(margin) > self.margin_max):
            out.append(Alert(self.name, f"rewards/margins is {margin:.3g}, beyond {self.margin_max:g}: the policy "
                                        f"runs away from its reference; lower train.learning_rate or raise "
                                        f"train.pref_beta", step=r.get("step")))
        return out


class ExpertStarved(Rule):
    """An MoE expert that the router sends under ``share`` of its fair share of a layer's tokens for ``records``
    train records in a row (moe/expert_shares: 1.0 is fair): it stops learning, and its capacity is lost."""

    name = "expert_starved"

    def __init__(self, share: float, records: int):
        self.share, self.records = share, records
        self.low: dict[tuple[int, int], int] = {}
        self.episodes: dict[tuple[int, int], Episode] = {}

    def observe(self, r: dict) -> list[Alert]:
        shares = r.get("moe/expert_shares")
        if not self.share or r.get("kind") != "train" or not shares:
            return []
        out = []
        for layer, row in enumerate(shares):
            for expert, value in enumerate(row):
                key = (layer, expert)
                self.low[key] = self.low.get(key, 0) + 1 if value < self.share else 0
                episode = self.episodes.setdefault(key, Episode())
                if episode.starts(self.low[key] >= self.records):
                    out.append(Alert(self.name, f"MoE layer {layer} expert {expert} receives {value:.2f}x its fair "
                                                f"share of tokens ({len(row)} experts) for {self.low[key]} records: "
                                                f"it is starving; raise train.moe_aux_loss_coef (the load-balancing "
                                                f"loss) or lower the learning rate of the router",
                                     step=r.get("step")))
        return out


def build_rules(cfg: AlertsConfig) -> list[Rule]:
    return [LowGpuUtil(cfg.gpu_util_min_pct, cfg.gpu_util_intervals),
            Straggler(cfg.straggler_factor, cfg.straggler_records),
            ThroughputDrop(cfg.throughput_drop_pct), MemoryGrowth(cfg.memory_growth_pct), DataWait(cfg.data_wait_pct),
            GradNormSpike(cfg.grad_norm_spike), PreferenceHealth(cfg.pref_accuracy_stuck, cfg.pref_margin_max),
            ExpertStarved(cfg.expert_starved_share, cfg.expert_starved_records)]


def write_alert(run_dir: str | Path, alert: Alert) -> None:
    with open(RunDir(run_dir).alerts, "a") as f:
        f.write(json.dumps(asdict(alert)) + "\n")
