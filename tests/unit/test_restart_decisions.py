"""A Ray run's restart decisions without a cluster (Ray Train's own tests drive its controller's decisions the same
way: a fake worker group, the real policy). The drills that kill real processes run once each under a real Ray
(tests/integration/test_reliability.py: kill -9 and resume; test_two_nodes.py: a lost node and its return); here,
in milliseconds, the decisions those drills rest on: which failures are retried (fault_tolerance.max_failures as
scaletrain hands it to Ray), which size a restart asks for (scaling.num_workers' range, whole context-parallel
groups), and which checkpoint the restarted workers resume from (the newest usable one)."""

import json
import os

import pytest


class _FailingGroup:
    """A worker group whose attempt ``i`` fails with a worker error while ``i`` is in ``failing`` (the ranks' errors
    as Ray gathers them), then finishes."""

    def __init__(self, failing: set[int]):
        self.failing, self.attempts = failing, 0

    def run(self):
        from ray.train.v2.api.exceptions import WorkerGroupError

        self.attempts += 1
        if self.attempts in self.failing:
            return WorkerGroupError("rank 1 died", {1: RuntimeError("SIGKILL")})
        return None


def _controller(failure_config, group: _FailingGroup) -> list[str]:
    """Ray Train's controller loop, reduced to its decision: run the group; on a failure ask the failure policy
    Ray builds from the run's FailureConfig; retry or raise."""
    from ray.train.v2._internal.execution.failure_handling.default import DefaultFailurePolicy
    from ray.train.v2._internal.execution.failure_handling.failure_policy import FailureDecision

    policy, decisions = DefaultFailurePolicy(failure_config), []
    while (error := group.run()) is not None:
        decision = policy.make_decision(error)
        decisions.append(decision.value)
        if decision != FailureDecision.RETRY:
            break
    return decisions


def _failure_config_of(max_failures: int, monkeypatch):
    """The FailureConfig scaletrain's Ray launcher gives the trainer for ``fault_tolerance.max_failures``."""
    import ray.train.torch

    from scaletrain.config import validate
    from scaletrain.launch import ray_launcher
    from scaletrain.launch.plan import ClusterPlan

    seen = {}

    class Trainer:
        def __init__(self, **kwargs):
            seen.update(kwargs)

        def fit(self):
            return None

    monkeypatch.setattr(ray.train.torch, "TorchTrainer", Trainer)
    monkeypatch.setattr(ray_launcher, "_lean_trainer", lambda cls, **kw: cls)
    cfg = validate({"model": {"name_or_path": "builtin:tiny-bert"}, "data": {"train_file": "x.jsonl"},
                    "scaling": {"num_workers": 2}, "fault_tolerance": {"max_failures": max_failures}})
    before = dict(os.environ)  # prepare_ray_driver sets Ray's driver defaults: as they were after the call
    try:
        ray_launcher._fit(print, {}, cfg.scaling, ClusterPlan(False, "gloo", {"CPU": 1}), {}, "/tmp", 60,
                          cfg.fault_tolerance.max_failures, ())
    finally:
        os.environ.clear()
        os.environ.update(before)
    return seen["run_config"].failure_config


@pytest.mark.parametrize("max_failures,failing,decisions", [
    (0, {1}, ["RAISE"]),  # the default: the first failure ends the run
    (2, {1, 2}, ["RETRY", "RETRY"]),  # two failures, two restarts, then it finishes
    (2, {1, 2, 3}, ["RETRY", "RETRY", "RAISE"]),  # a third is one too many
    (-1, set(range(1, 40)), ["RETRY"] * 39),  # unlimited
])
def test_failures_are_retried_as_max_failures_says(max_failures, failing, decisions, monkeypatch):
    config = _failure_config_of(max_failures, monkeypatch)
    assert config.max_failures == max_failures
    assert _controller(config, _FailingGroup(failing)) == decisions


def test_a_restart_asks_for_the_size_the_free_resources_allow_in_whole_groups():
    """After a node is lost the elastic policy counts what is free: the range's top at most, the bottom at least,
    whole context-parallel groups (ray_policy.py)."""
    from ray.train import ScalingConfig

    from scaletrain.launch.ray_policy import WholeGroupsPolicy

    policy = WholeGroupsPolicy(ScalingConfig(num_workers=(1, 2), resources_per_worker={"CPU": 1}), 1)
    assert policy._count_possible_workers({"a": {"CPU": 1.0}, "b": {"CPU": 1.0}}) == 2  # both nodes
    assert policy._count_possible_workers({"a": {"CPU": 1.0}}) == 1  # one node lost: shrink
    grouped = WholeGroupsPolicy(ScalingConfig(num_workers=(2, 4), resources_per_worker={"CPU": 1}), 2)
    assert grouped._count_possible_workers({"a": {"CPU": 3.0}}) == 2  # Ray's own policy: 3, no data x CP mesh
    # Ray's controller actor gets the policy serialized: by reference to its module, the same counting there
    from ray import cloudpickle

    there = cloudpickle.loads(cloudpickle.dumps(grouped))
    assert type(there) is WholeGroupsPolicy and there._count_possible_workers({"a": {"CPU": 5.0}}) == 4


def test_the_restarted_workers_resume_from_the_newest_usable_checkpoint(tmp_path):
    from scaletrain.launch.job import _resume_notes

    run = tmp_path / "run"
    for step, files in ((2, {}), (4, {}), (6, None)):  # step-6: no manifest (killed while writing)
        d = run / "checkpoints" / f"step-{step}"
        d.mkdir(parents=True)
        if files is not None:
            (d / "manifest.json").write_text(json.dumps({"files": files}))
    assert _resume_notes(run) == ["resuming from step-4: the newer checkpoint(s) are unusable (step-6: no manifest "
                                  "(partial write))"]


@pytest.mark.parametrize("hang_retries,failures,decisions", [
    (0, ["hang"], ["raise"]),  # no retries: the first hang ends the run (its error: the crash path's)
    (1, ["hang", "hang"], ["retry", "raise"]),  # the default: one retry, the second hang ends it
    (-1, ["hang"] * 5, ["retry"] * 5),  # always
    (2, ["crash"], ["raise"]),  # a crash is Ray's to retry (max_failures), never the hang policy's
])
def test_a_hang_is_retried_as_hang_retries_says(hang_retries, failures, decisions):
    """The policy job.py's hang loop asks after each failed attempt (test_reliability.py drills the default: a real
    hang, detected, named, retried from the newest checkpoint)."""
    from scaletrain.launch.failures import HangRetryPolicy

    policy, used, said = HangRetryPolicy(hang_retries), 0, []
    for failure in failures:
        decision = policy.decide(failure == "hang", used).value
        said.append(decision)
        used += decision == "retry"
    assert said == decisions
