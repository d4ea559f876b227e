"""train/grad_norm: the norm clip_grad_norm_ computes (before clipping), logged; alerts on spikes and NaN/Inf;
throughput measures training only (no dip after an eval or a checkpoint); each rank's CPU share is its window's."""

import copy
import math

import pytest

from scaletrain.comm.context import DistContext
from scaletrain.comm.watchdog import Heartbeat
from scaletrain.config.schema import AlertsConfig
from scaletrain.data import Collator, load_split
from scaletrain.launch.local import run_in_process
from scaletrain.metrics.alerts import GradNormSpike, build_rules
from scaletrain.metrics.records import read_jsonl
from scaletrain.worker.step import train_step
from scaletrain.worker.trainer import build_trainer
from tests.conftest import local_spec


def test_logged_grad_norm_is_the_norm_before_clipping(classify_cfg, tmp_path):
    classify_cfg["train"].update(max_grad_norm=0.01, max_steps=2)  # clipping on: the logged norm is the raw one
    classify_cfg["model"]["dropout"] = 0.0  # the reference forward must draw no other dropout mask
    cfg, _, spec = local_spec(classify_cfg, tmp_path / "run")
    ctx = DistContext(world_rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0, device="cpu",
                      backend="gloo")
    beat = Heartbeat(spec.run_dir, 0, stall_s=60)
    t = build_trainer(ctx, spec, cfg, beat)
    data = load_split(spec.train_path)
    batch = Collator(spec.pad_token_id)([data[i] for i in range(8)])
    reference = copy.deepcopy(t.model)
    reference(**{k: v for k, v in batch.items() if k not in ("num_tokens", "num_examples")}).loss.backward()
    expected = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in reference.parameters() if p.grad is not None))
    train_step(t, [batch], step=1)
    assert t.grad_norm == pytest.approx(expected, rel=1e-5) and expected > 0.01
    beat.close(clean=True)


def test_grad_norm_spike_and_non_finite_alerts():
    rule = GradNormSpike(10.0)
    healthy = [{"kind": "train", "step": s, "train/grad_norm": 1.0 + 0.1 * (s % 3)} for s in range(1, 20)]
    assert [a for r in healthy for a in rule.observe(r)] == []
    (spike,) = rule.observe({"kind": "train", "step": 20, "train/grad_norm": 25.0})
    assert "25" in spike.message and "10x" in spike.message
    (nan,) = GradNormSpike(10.0).observe({"kind": "train", "step": 3, "train/grad_norm": float("nan")})
    assert nan.severity == "error" and "not finite" in nan.message


@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
@pytest.mark.loop
def test_mid_run_evals_and_checkpoints_stay_out_of_step_time_and_throughput(classify_cfg, tmp_path):
    classify_cfg["train"].update(max_steps=24, logging_steps=2, eval_steps=4, per_device_eval_batch_size=4)
    classify_cfg["data"]["eval_ratio"] = 0.5  # a long eval: without the exclusion the next window's rate halves
    classify_cfg["checkpoint"] = {"save_steps": 6}
    _, _, spec = local_spec(classify_cfg, tmp_path / "run")
    run_in_process(spec)
    records = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    rules = build_rules(AlertsConfig())
    alerts = [a for r in records for rule in rules for a in rule.observe(r)]
    assert [a.rule for a in alerts if a.rule == "grad_norm_spike"] == []  # a healthy run
    # A window that held an eval or a checkpoint: its step time is training alone. Checked against the window's
    # own wall time (between its record and the one before), not against other windows' step times, which a
    # loaded 2-core machine spreads 50x (0.007-0.36 s measured under make test): the steps take the wall time less
    # the pause, so less than the wall time less 0.8 x the pause (with the pause in them they would take it all).
    pauses = 0.0
    checked = []
    last = None
    for r in records:
        if r["kind"] in ("eval", "checkpoint"):
            pauses += r.get("time/eval_s", 0.0) + r.get("time/checkpoint_s", 0.0)
        elif r["kind"] == "train":
            if last is not None and pauses > 0:
                wall = r["time"] - last["time"]
                checked.append((r["step"], r["time/step_s"] * r["window_steps"], wall, pauses))
            last, pauses = r, 0.0
    assert len(checked) >= 4, checked
    assert all(steps < wall - 0.8 * pause for _, steps, wall, pause in checked), checked
    kinds = {r["kind"] for r in records}
    assert {"eval", "checkpoint"} <= kinds and all("train/grad_norm" in r for r in records if r["kind"] == "train")


@pytest.mark.slow  # a whole run or several seconds: make test, not make test-fast
@pytest.mark.loop
def test_a_training_ranks_cpu_share_is_read_over_its_records_window(classify_cfg, tmp_path):
    """The share that names a straggler's host cause: a rank that trains is busy in every record, however often the
    system sampler's thread reads psutil meanwhile (every 1 ms here: a reading taken just after it covered
    microseconds and read 0%, CI stop 56)."""
    classify_cfg["train"].update(max_steps=12, logging_steps=1)
    classify_cfg["monitor"] = {"interval_s": 0.001}
    _, _, spec = local_spec(classify_cfg, tmp_path / "run")
    run_in_process(spec)
    train = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"]
    shares = [r["ranks/cpu_pct"][0] for r in train]
    assert len(shares) == 12 and all(s > 20 for s in shares), shares
    assert all(r["system/cpu_pct"] == r["ranks/cpu_pct"][0] for r in train)
