"""LR scaling, step planning, run-dir naming, cluster planning and failure grouping: no cluster needed."""

import math

import pytest

from scaletrain.config import validate
from scaletrain.config.batch import global_batch, scaled_learning_rate, steps_per_epoch, total_steps
from scaletrain.errors import ConfigError, LaunchError, TrainingError
from scaletrain.launch.failures import group_failures
from scaletrain.launch.plan import plan_scaling
from scaletrain.rundir import create_run_dir, default_run_name


def cfg_with(**train):
    return validate({"model": {"name_or_path": "builtin:tiny-bert"}, "data": {"train_file": "x.jsonl"},
                     "train": {"per_device_train_batch_size": 8, "learning_rate": 1e-4, **train}})


def test_global_batch():
    c = cfg_with(gradient_accumulation_steps=4)
    assert global_batch(c.train, 1) == 32 and global_batch(c.train, 8) == 256


@pytest.mark.parametrize("rule,workers,expected", [
    ("none", 8, 1e-4), ("linear", 1, 1e-4), ("linear", 4, 4e-4), ("sqrt", 4, 2e-4), ("sqrt", 2, 1e-4 * math.sqrt(2)),
])
def test_lr_scaling_relative_to_one_worker(rule, workers, expected):
    assert scaled_learning_rate(cfg_with(lr_scaling=rule).train, workers) == pytest.approx(expected)


def test_lr_scaling_with_stated_reference():
    c = cfg_with(lr_scaling="linear", lr_reference_batch=32)
    assert scaled_learning_rate(c.train, 2) == pytest.approx(1e-4 * 16 / 32)


def test_steps_per_epoch_and_total():
    c = cfg_with(gradient_accumulation_steps=2, num_train_epochs=1.5)
    # 100 samples, 2 ranks -> 50 per rank -> 6 micro-batches of 8 -> 3 windows of 2
    assert steps_per_epoch(100, c.train, 2) == 3
    assert total_steps(100, c, 2) == 5  # ceil(1.5 * 3)
    assert total_steps(100, cfg_with(max_steps=7), 2) == 7


def test_dataset_smaller_than_global_batch_is_an_error():
    with pytest.raises(ConfigError, match="fewer than one global batch of 64"):
        total_steps(50, cfg_with(), 8)


def test_run_dir_is_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    d = create_run_dir("runs", "x", "exp.yaml")
    assert d.is_absolute() and d == tmp_path / "runs" / "x"


def test_run_dir_never_reused(tmp_path):
    a = create_run_dir(tmp_path, None, "exp.yaml", now=0)
    b = create_run_dir(tmp_path, None, "exp.yaml", now=0)
    assert a != b and a.name == default_run_name("exp.yaml", 0) and b.name == a.name + "-2"
    assert (a.stat().st_mode & 0o007) == 0  # not world-accessible
    named = create_run_dir(tmp_path, "mine", "exp.yaml")
    (named / "keep.txt").write_text("precious")
    with pytest.raises(LaunchError, match=r"output.run_name=mine: .* already exists .* --resume"):
        create_run_dir(tmp_path, "mine", "exp.yaml")
    assert (named / "keep.txt").read_text() == "precious"


def test_plan_cluster_counts_cpus_and_gpus():
    c = validate({"model": {"name_or_path": "builtin:tiny-bert"}, "data": {"train_file": "x"},
                  "scaling": {"num_workers": 4}})
    with pytest.raises(LaunchError, match=r"scaling.num_workers=4 needs 4 CPUs .* the cluster has 2; lower "
                                          r"scaling.num_workers to 2"):
        plan_scaling(c.scaling, c.comm, {"CPU": 2.0}, "cpu")
    plan = plan_scaling(c.scaling, c.comm, {"CPU": 64.0, "GPU": 8.0}, "rocm")
    # a GPU worker's host side gets its node's cores / the node's GPUs
    assert plan.use_gpu and plan.backend == "nccl" and plan.resources_per_worker == {"CPU": 8, "GPU": 1}
    with pytest.raises(LaunchError, match=r"needs 4 GPUs .* the cluster has 2"):
        plan_scaling(c.scaling, c.comm, {"CPU": 64.0, "GPU": 2.0}, "cuda")
    cpu_plan = plan_scaling(c.scaling, c.comm, {"CPU": 8.0}, "cpu")
    assert not cpu_plan.use_gpu and cpu_plan.backend == "gloo"
    assert cpu_plan.resources_per_worker == {"CPU": 2} and "2 CPU(s) per worker" in cpu_plan.notes[0]


@pytest.mark.parametrize("nodes, workers, gpu, cpus", [
    ([{"CPU": 2}], 1, False, 2),  # one worker on a 2-core box: both cores (it used one)
    ([{"CPU": 2}], 2, False, 1),
    ([{"CPU": 16}], 3, False, 5),  # never oversubscribed: 3 x 5 <= 16
    ([{"CPU": 8}, {"CPU": 4}], 4, False, 2),  # PACK: 2 a node, the smaller node decides
    ([{"CPU": 128, "GPU": 8}], 8, True, 16),  # GPU workers: the node's cores / its GPUs
    ([{"CPU": 1}], 4, False, 1),
])
def test_every_core_is_used_and_none_oversubscribed(nodes, workers, gpu, cpus):
    from scaletrain.launch.plan import cpus_per_worker

    assert cpus_per_worker(nodes, workers, gpu) == cpus


def test_an_explicit_cpu_count_wins():
    c = validate({"model": {"name_or_path": "builtin:tiny-bert"}, "data": {"train_file": "x"},
                  "scaling": {"num_workers": 1, "resources_per_worker": {"CPU": 1}}})
    plan = plan_scaling(c.scaling, c.comm, {"CPU": 8.0}, "cpu")
    assert plan.resources_per_worker == {"CPU": 1} and not any("CPU(s) per worker" in n for n in plan.notes)


def test_plan_cluster_nccl_without_gpus():
    c = validate({"model": {"name_or_path": "builtin:tiny-bert"}, "data": {"train_file": "x"},
                  "comm": {"backend": "nccl"}})
    with pytest.raises(LaunchError, match="comm.backend=nccl needs a GPU"):
        plan_scaling(c.scaling, c.comm, {"CPU": 2.0}, "cpu")


def test_failures_grouped_by_rank():
    class Wrapped(Exception):
        def __init__(self, cause):
            super().__init__("wrapped")
            self.cause = cause

    failures = {3: Wrapped(ValueError("bad batch")), 0: Wrapped(ValueError("bad batch")), 1: RuntimeError("oom")}
    groups, user = group_failures(failures)
    assert ([0, 3], "ValueError: bad batch") in groups and ([1], "RuntimeError: oom") in groups
    assert user is None
    _, user = group_failures({0: Wrapped(TrainingError("x")), 1: Wrapped(TrainingError("x"))})
    assert isinstance(user, TrainingError)


def test_a_separate_rollout_engine_gets_devices_of_its_own():
    """GRPO's rollout actors (rollout.placement: separate): a CPU core each beside CPU workers (the workers' share
    of the cores leaves them one), a GPU each beside GPU workers, and one line when they do not fit."""
    c = cfg_with()
    plan = plan_scaling(c.scaling, c.comm, {"CPU": 4.0}, "cpu", rollout_actors=1)
    assert plan.resources_per_worker["CPU"] == 2  # 4 cores / (1 worker + 1 actor)
    assert any("1 rollout actor(s), a CPU each" in n for n in plan.notes)
    two = c.scaling.model_copy(update={"num_workers": 2})
    with pytest.raises(LaunchError, match=r"rollout.num_workers=2 rollout actors need a GPU each beside the 2 of "
                                          r"scaling.num_workers=2, 4 in all, but the cluster has 3"):
        plan_scaling(two, c.comm, {"CPU": 16.0, "GPU": 3.0}, "nvidia", rollout_actors=2)
    assert plan_scaling(two, c.comm, {"CPU": 16.0, "GPU": 4.0}, "nvidia", rollout_actors=2).use_gpu
