"""Pictures a reader can trust, read from the figures themselves (matplotlib objects, not pixels): whole-number
ticks on the axes that count steps, layers, experts and workers, and no legend over an axis, a label or a title."""

import pytest

from scaletrain.report import plots

STEPS = (5, 6)  # a short range: matplotlib's default locator ticks it 5.0, 5.2, ... 6.0


@pytest.fixture
def figures(monkeypatch):
    """Every figure a plot function saves, drawn and kept open for reading."""
    kept = []

    def keep(fig, path):
        if fig.get_layout_engine() is None:
            fig.tight_layout()
        fig.canvas.draw()
        kept.append(fig)
        return path

    monkeypatch.setattr(plots, "save_figure", keep)
    yield kept
    for fig in kept:
        plots.plt.close(fig)


def _train():
    return [{"step": s, "train/loss": 1.0 / s, "train/grad_norm": 0.5, "throughput/samples_per_s": 10.0 + s,
             "ranks/step_s": [0.1, 0.12], "ranks/rss_gib": [1.0, 1.1], "rewards/chosen": 0.1, "rewards/rejected": -0.1,
             "rewards/margins": 0.2, "rewards/accuracies": 0.6,
             "moe/expert_shares": [[1.2, 0.8, 1.1, 0.9], [1.0, 1.0, 0.7, 1.3]], "moe/expert_share_min": [0.8, 0.7],
             "reward": 0.4 + s / 100, "reward_std": 0.1, "rewards/accuracy/mean": 0.3, "completions/mean_length": 7.5,
             "completions/clipped_ratio": 0.25}
            for s in STEPS]


def _numbers(labels) -> list[float]:
    return [float(t.get_text().replace("\u2212", "-")) for t in labels if t.get_text()]


def _whole(labels) -> bool:
    values = _numbers(labels)
    return bool(values) and all(v.is_integer() for v in values)


def _texts(fig):
    for ax in fig.axes:
        yield from (ax.xaxis.label, ax.yaxis.label, ax.title, *ax.get_xticklabels(), *ax.get_yticklabels())


def _legend_overlaps(fig) -> list[str]:
    renderer = fig.canvas.get_renderer()
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
    out = []
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for text in _texts(fig):
            if text.get_text() and text.get_visible() and box.overlaps(text.get_window_extent(renderer)):
                out.append(text.get_text())
    return out


@pytest.mark.parametrize("draw", ["loss", "throughput", "ranks", "rewards", "experts", "rl"])
def test_step_axes_have_whole_number_ticks(draw, figures, tmp_path):
    fn = getattr(plots, draw)
    if draw in ("ranks", "experts", "throughput", "rl"):
        fn(_train(), tmp_path)
    else:
        fn(_train(), [], tmp_path)
    (fig,) = figures
    step_axes = [ax for ax in fig.axes if ax.get_xlabel() == "step"]
    assert step_axes, [ax.get_xlabel() for ax in fig.axes]
    for ax in step_axes:
        assert _whole(ax.get_xticklabels()), [t.get_text() for t in ax.get_xticklabels()]
    assert _legend_overlaps(fig) == []


def test_the_router_heat_map_ticks_each_layer_and_expert(figures, tmp_path):
    plots.experts(_train(), tmp_path)
    heat = next(ax for ax in figures[0].axes if ax.get_xlabel() == "expert")
    assert _numbers(heat.get_xticklabels()) == [0, 1, 2, 3]
    assert _numbers(heat.get_yticklabels()) == [0, 1]


def test_the_goodput_legend_covers_no_label(figures, tmp_path):
    summary = {"goodput/wall_s": 100.0, "goodput/ratio": 0.6, "goodput/interruptions": 1,
               "goodput/productive_s": 60.0, "goodput/data_prep_s": 10.0, "goodput/worker_start_s": 10.0,
               "goodput/eval_s": 5.0, "goodput/checkpoint_s": 5.0, "goodput/restart_s": 5.0, "goodput/lost_s": 5.0}
    plots.goodput(summary, tmp_path)
    (fig,) = figures
    assert fig.axes[0].get_xlabel() == "seconds" and (fig.legends or fig.axes[0].get_legend())
    assert _legend_overlaps(fig) == []


def test_the_scaling_plot_ticks_the_world_sizes(figures, tmp_path):
    from scaletrain.scaling.sweep import plot_speedup

    plot_speedup([{"workers": 1, "speedup": 1.0}, {"workers": 2, "speedup": 1.9}, {"workers": 4, "speedup": 3.5}],
                 tmp_path)
    (fig,) = figures
    assert _numbers(fig.axes[0].get_xticklabels()) == [1, 2, 4]
    assert _legend_overlaps(fig) == []
