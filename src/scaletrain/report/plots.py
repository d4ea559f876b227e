"""PNG plots of a run (matplotlib, headless). Each function writes one file and returns its path, or None
when the run has no data for it yet."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

from scaletrain.rundir import RunDir

FIGSIZE, DPI = (9, 5), 100  # 900 x 500 pixels
FILES = RunDir.PLOTS  # named by the run directory's owner (trackers upload them without importing this module)
LOSS, THROUGHPUT, RANKS, UTILIZATION, REWARDS, GOODPUT, EXPERTS, RL = FILES


def save_figure(fig, path: Path) -> Path:
    """Lay the figure out, write it, close it. Every plot of the project goes through here (the tests read the
    figures' ticks, labels and legends here, before they are closed)."""
    if fig.get_layout_engine() is None:  # a constrained figure lays itself out (a legend outside the axes)
        fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def whole_numbers(*axes, axis: str = "x") -> None:
    """Steps, layers, experts and workers are whole numbers: ticks at integers only (matplotlib's default locator
    puts 5.0, 5.2, ... on a short range)."""
    for ax in axes:
        getattr(ax, f"{axis}axis").set_major_locator(MaxNLocator(integer=True))


def each_index(ax, count: int, axis: str) -> None:
    """A heat map's rows or columns (layers, experts): a tick at each index up to 16, else whole numbers only."""
    if count <= 16:
        getattr(ax, f"set_{axis}ticks")(range(count))
    else:
        whole_numbers(ax, axis=axis)


def _mark_pauses(ax, evals: list[dict], checkpoints: list[dict]) -> None:
    """Dashed lines where the run evaluated, dotted where it checkpointed (their time is not training time)."""
    for i, r in enumerate(evals):
        ax.axvline(r["step"], color="tab:green", linestyle="--", linewidth=0.8, label="eval" if i == 0 else None)
    for i, r in enumerate(checkpoints):
        ax.axvline(r["step"], color="tab:gray", linestyle=":", linewidth=0.8, label="checkpoint" if i == 0 else None)


def loss(train: list[dict], evals: list[dict], out: Path, checkpoints: list[dict] = ()) -> Path | None:
    if not train:
        return None
    fig, ax = plt.subplots(figsize=FIGSIZE)
    ax.plot([r["step"] for r in train], [r["train/loss"] for r in train], label="train loss")
    ev = [r for r in evals if "eval/loss" in r]
    if ev:
        ax.plot([r["step"] for r in ev], [r["eval/loss"] for r in ev], "o-", label="eval loss")
    _mark_pauses(ax, [], list(checkpoints))
    ax.set(xlabel="step", ylabel="loss", title="Loss and gradient norm")
    whole_numbers(ax)
    norms = [r for r in train if "train/grad_norm" in r]
    lines, labels = ax.get_legend_handles_labels()
    if norms:  # the number dashboards show first after the loss: spikes come before divergence
        ax2 = ax.twinx()
        ax2.plot([r["step"] for r in norms], [r["train/grad_norm"] for r in norms], color="tab:red", alpha=0.6,
                 label="grad norm (before clipping)")
        ax2.set_ylabel("gradient norm")
        more = ax2.get_legend_handles_labels()
        lines, labels = lines + more[0], labels + more[1]
    ax.legend(lines, labels)
    return save_figure(fig, out / LOSS)


def rewards(train: list[dict], evals: list[dict], out: Path) -> Path | None:
    """Preference tuning: the chosen and rejected rewards and their margin, with the reward accuracy beside."""
    rows = [r for r in train if "rewards/margins" in r]
    if not rows:
        return None
    fig, (a, b) = plt.subplots(1, 2, figsize=FIGSIZE)
    steps = [r["step"] for r in rows]
    for key in ("rewards/chosen", "rewards/rejected", "rewards/margins"):
        a.plot(steps, [r[key] for r in rows], label=key.split("/")[1])
    b.plot(steps, [r["rewards/accuracies"] for r in rows], label="train")
    ev = [r for r in evals if "eval/rewards/accuracies" in r]
    if ev:
        b.plot([r["step"] for r in ev], [r["eval/rewards/accuracies"] for r in ev], "o-", label="eval")
    b.axhline(0.5, color="tab:gray", linestyle=":", linewidth=0.8, label="chance")
    a.set(xlabel="step", ylabel="reward (beta x log-ratio)", title="Rewards and margin")
    b.set(xlabel="step", ylabel="share of pairs", title="Reward accuracy", ylim=(0, 1.05))
    whole_numbers(a, b)
    a.legend()
    b.legend()
    return save_figure(fig, out / REWARDS)


def rl(train: list[dict], out: Path) -> Path | None:
    """GRPO: the mean reward (with its std, and each reward function's mean) and the completions' length over the
    steps."""
    rows = [r for r in train if "reward" in r]
    if not rows:
        return None
    fig, (a, b) = plt.subplots(1, 2, figsize=FIGSIZE)
    steps = [r["step"] for r in rows]
    mean, std = [r["reward"] for r in rows], [r.get("reward_std", 0.0) for r in rows]
    a.plot(steps, mean, label="reward")
    a.fill_between(steps, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)], alpha=0.2)
    for key in sorted({k for r in rows for k in r if k.startswith("rewards/") and k.endswith("/mean")}):
        a.plot(steps, [r.get(key) for r in rows], "--", linewidth=0.8, label=key.split("/")[1])
    b.plot(steps, [r.get("completions/mean_length", 0.0) for r in rows], label="mean length (tokens)")
    b2 = b.twinx()
    b2.plot(steps, [r.get("completions/clipped_ratio", 0.0) for r in rows], color="tab:red", alpha=0.6,
            label="share truncated")
    b2.set(ylabel="share truncated", ylim=(0, 1.05))
    a.set(xlabel="step", ylabel="reward", title="Reward (mean, std band; each function's mean)")
    b.set(xlabel="step", ylabel="tokens", title="Completion length")
    whole_numbers(a, b)
    a.legend(fontsize="small")
    lines, labels = b.get_legend_handles_labels()
    more = b2.get_legend_handles_labels()
    b.legend(lines + more[0], labels + more[1], fontsize="small")
    return save_figure(fig, out / RL)


def experts(train: list[dict], out: Path) -> Path | None:
    """MoE: each expert's share of its layer's tokens relative to a fair share (1.0), layer x expert, over the
    run's records (their mean), beside the smallest share per layer through the run."""
    rows = [r["moe/expert_shares"] for r in train if r.get("moe/expert_shares")]
    if not rows:
        return None
    layers, count = len(rows[-1]), len(rows[-1][0])
    mean = [[sum(r[i][j] for r in rows) / len(rows) for j in range(count)] for i in range(layers)]
    fig, (a, b) = plt.subplots(1, 2, figsize=FIGSIZE)
    image = a.imshow(mean, aspect="auto", cmap="viridis", vmin=0)
    fig.colorbar(image, ax=a, label="share of tokens / fair share")
    a.set(xlabel="expert", ylabel="layer", title="Router: tokens per expert (mean over the run)")
    each_index(a, count, "x")
    each_index(a, layers, "y")
    steps = [r["step"] for r in train if r.get("moe/expert_share_min")]
    lows = [r["moe/expert_share_min"] for r in train if r.get("moe/expert_share_min")]
    for i in range(layers):
        b.plot(steps, [low[i] for low in lows], label=f"layer {i}" if layers <= 8 else None)
    b.axhline(1.0, color="tab:gray", linestyle=":", linewidth=0.8, label="fair share")
    b.set(xlabel="step", ylabel="smallest expert share / fair share", title="Least-used expert per layer",
          ylim=(0, None))
    whole_numbers(b)
    b.legend()
    return save_figure(fig, out / EXPERTS)


def goodput(summary: dict, out: Path) -> Path | None:
    """One stacked bar: the run's wall time by where it went (metrics/goodput.py)."""
    from scaletrain.metrics.goodput import CATEGORIES

    if not summary.get("goodput/wall_s"):
        return None
    # constrained layout with the legend "outside lower center": the legend gets its own room under the axis
    # label (placed by hand under the axes, it covered "seconds")
    fig, ax = plt.subplots(figsize=(FIGSIZE[0], 3.2), layout="constrained")
    left = 0.0
    for name in CATEGORIES:
        seconds = summary.get(f"goodput/{name}_s", 0.0)
        if seconds > 0:
            ax.barh(0, seconds, left=left, label=f"{name.replace('_', ' ')} {seconds:.1f} s")
            left += seconds
    ax.set(yticks=[], xlabel="seconds", title=f"Where the wall time went: goodput {summary['goodput/ratio']:.0%}, "
                                              f"{summary.get('goodput/interruptions', 0)} interruption(s)")
    fig.legend(ncol=4, fontsize="small", loc="outside lower center")
    return save_figure(fig, out / GOODPUT)


def throughput(train: list[dict], out: Path, evals: list[dict] = (), checkpoints: list[dict] = ()) -> Path | None:
    if not train:
        return None
    fig, ax = plt.subplots(figsize=FIGSIZE)
    ax.plot([r["step"] for r in train], [r["throughput/samples_per_s"] for r in train], label="samples/s")
    _mark_pauses(ax, [r for r in evals if "time/eval_s" in r], list(checkpoints))
    ax.set(xlabel="step", ylabel="samples/s", title="Throughput (all ranks; eval and checkpoint time excluded)")
    whole_numbers(ax)
    ax.legend()
    return save_figure(fig, out / THROUGHPUT)


def ranks(train: list[dict], out: Path) -> Path | None:
    rows = [r for r in train if r.get("ranks/step_s")]
    if not rows:
        return None
    fig, (a, b) = plt.subplots(1, 2, figsize=FIGSIZE)
    steps = [r["step"] for r in rows]
    for rank in range(len(rows[-1]["ranks/step_s"])):
        a.plot(steps, [r["ranks/step_s"][rank] for r in rows], label=f"rank {rank}")
        b.plot(steps, [r["ranks/rss_gib"][rank] for r in rows], label=f"rank {rank}")
    a.set(xlabel="step", ylabel="s/step", title="Step time per rank")
    b.set(xlabel="step", ylabel="GiB", title="Host memory (RSS) per rank")
    whole_numbers(a, b)
    a.legend()
    return save_figure(fig, out / RANKS)


def utilization(system: list[dict], out: Path) -> Path | None:
    if not system:
        return None
    t0 = min(r["time"] for r in system)
    fig, ax = plt.subplots(figsize=FIGSIZE)
    for rank in sorted({r["rank"] for r in system}):
        mine = [r for r in system if r["rank"] == rank]
        ax.plot([r["time"] - t0 for r in mine], [r["system/cpu_pct"] for r in mine], label=f"rank {rank} CPU %")
        if any("gpu/util_pct" in r for r in mine):
            ax.plot([r["time"] - t0 for r in mine if "gpu/util_pct" in r],
                    [r["gpu/util_pct"] for r in mine if "gpu/util_pct" in r], "--", label=f"rank {rank} GPU %")
    ax.set(xlabel="seconds since the first sample", ylabel="%", title="CPU and GPU utilisation")
    ax.legend()
    return save_figure(fig, out / UTILIZATION)
