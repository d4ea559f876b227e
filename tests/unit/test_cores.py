"""Each CPU worker's threads on its own block of the node's cores (comm/cores.py): the block chosen for a given
node and worker count, when the plan binds, and the binding itself."""

from __future__ import annotations

import os
import threading

import pytest

from scaletrain.comm.cores import bind_process, binding_note, core_block
from scaletrain.comm.device import Platform
from scaletrain.config import validate
from scaletrain.launch.plan import ClusterPlan, plan_node, with_allocator, with_binding


@pytest.mark.parametrize("cores, workers, threads, blocks", [
    ([0, 1], 2, 1, [(0,), (1,)]),  # this machine: a core each
    ([0, 1, 2, 3], 2, 2, [(0, 1), (2, 3)]),  # neighbours together
    ([0, 1, 2], 2, 1, [(0,), (1,)]),  # the odd core left to the runtime and the driver
    ([5, 4, 7, 6], 2, 2, [(4, 5), (6, 7)]),  # a container's share, in core order
    (list(range(8)), 2, 1, [(0,), (1,)]),  # resources_per_worker {CPU: 1}: one core each, as many as threads
    (list(range(8)), 2, 16, [(0, 1, 2, 3), (4, 5, 6, 7)]),  # never more than the node's share
    ([0], 2, 1, [None, None]),  # fewer cores than workers: no block each, not bound
])
def test_each_worker_gets_its_own_block(cores, workers, threads, blocks):
    assert [core_block(cores, r, workers, threads) for r in range(workers)] == blocks


def test_the_start_line_names_every_block_and_the_way_out():
    note = binding_note([0, 1, 2, 3], 2, 2)
    assert "worker 0: cores 0-1, worker 1: cores 2-3" in note and "scaling.bind_cores=false" in note
    assert "worker 0: core 0, worker 1: core 1" in binding_note([0, 1], 2, 1)
    assert binding_note([0, 1], 1, 2) is None  # one worker: nothing to keep apart
    assert binding_note([0], 2, 1) is None


def _cfg(comm=None, **scaling):
    return validate({"model": {"name_or_path": "builtin:tiny-bert"}, "data": {"train_file": "x"}, "comm": comm or {},
                     "scaling": {"num_workers": 2, "launcher": "torchrun", **scaling}})


def test_the_plan_binds_cpu_workers_only_and_says_so():
    cpu = ClusterPlan(False, "gloo", {"CPU": 1})
    bound = with_binding(cpu, _cfg().scaling, [0, 1], 2)
    assert bound.bind_cores and "worker 1: core 1" in bound.notes[-1]
    assert not with_binding(cpu, _cfg(bind_cores=False).scaling, [0, 1], 2).bind_cores  # the user's way out
    gpu = ClusterPlan(True, "nccl", {"CPU": 8, "GPU": 1})
    assert with_binding(gpu, _cfg().scaling, list(range(16)), 2) == gpu  # a GPU worker's threads are not bound
    assert with_binding(cpu, _cfg().scaling, [0], 2) == cpu  # oversubscribed: nothing to bind


def test_a_torchrun_node_of_cpu_workers_is_bound():
    plan = plan_node(_cfg(), Platform("cpu", 0), 2)
    assert plan.bind_cores and plan.resources_per_worker == {"CPU": 1}
    assert not plan_node(_cfg(num_workers=1), Platform("cpu", 0), 2).bind_cores


def test_binding_moves_every_thread_of_the_process():
    """A Ray worker trains in a thread of its own beside the runtime's: all of them are bound, not the caller."""
    before = os.sched_getaffinity(0)
    target = {min(before)}
    started, done = threading.Event(), threading.Event()
    tids: list[int] = []

    def other():
        tids.append(threading.get_native_id())
        started.set()
        done.wait(10)

    t = threading.Thread(target=other)
    t.start()
    started.wait(10)
    try:
        assert bind_process(target) >= 2
        assert os.sched_getaffinity(tids[0]) == target and os.sched_getaffinity(0) == target
    finally:
        bind_process(before)
        done.set()
        t.join()
    assert os.sched_getaffinity(0) == before


def test_cpu_workers_start_with_the_allocator_setting_unless_the_user_has_one(monkeypatch):
    """glibc's allocator keeps a CPU worker's freed pages for its next step (envvars.CPU_WORKER_ENV_DEFAULTS); a
    GPU worker gets nothing, and a user's GLIBC_TUNABLES or MALLOC_ variable (memory measurement sets
    MALLOC_MMAP_THRESHOLD_) is kept whole, in the shell or in comm.env, under both launchers."""
    from scaletrain import envvars
    from scaletrain.comm.launch_env import torchrun_agent_env, worker_env

    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    for k in [k for k in os.environ if k.startswith("MALLOC_")]:
        monkeypatch.delenv(k)
    ours = envvars.CPU_WORKER_ENV_DEFAULTS
    assert ours == {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "4294967296",
                    "MALLOC_ARENA_MAX": "1"}
    assert not any(":" in v for v in ours.values())  # Ray's runtime_env cuts a value at its first colon
    comm = _cfg().comm

    def given(env):
        return {k: env[k] for k in ours if k in env}

    assert given(worker_env(comm, "cpu", "gloo", "/runs/x", cpu=True)) == ours  # Ray's workers
    assert given(worker_env(comm, "cuda", "nccl", "/runs/x", cpu=False)) == {}
    assert given(torchrun_agent_env(comm, 1, environ={}, cpu=True)) == ours  # torchrun's
    assert given(torchrun_agent_env(comm, 1, environ={}, cpu=False)) == {}
    theirs = torchrun_agent_env(comm, 1, environ={"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, cpu=True)
    assert theirs["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2" and given(theirs) == {}
    measuring = _cfg(comm={"env": {"MALLOC_MMAP_THRESHOLD_": 65536}}).comm
    assert given(torchrun_agent_env(measuring, 1, environ={}, cpu=True)) == {"MALLOC_MMAP_THRESHOLD_": "65536"}
    assert given(worker_env(measuring, "cpu", "gloo", "/runs/x", cpu=True)) == {"MALLOC_MMAP_THRESHOLD_": "65536"}
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=0")  # the driver's shell, under Ray
    assert given(worker_env(comm, "cpu", "gloo", "/runs/x", cpu=True)) == {}


def test_the_allocator_setting_is_said_at_start_unless_the_user_has_one(monkeypatch):
    from scaletrain.launch.plan import plan_scaling

    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    for k in [k for k in os.environ if k.startswith("MALLOC_")]:
        monkeypatch.delenv(k)
    plan = with_allocator(plan_scaling(_cfg().scaling, _cfg().comm, {"CPU": 2.0}, "cpu"), _cfg().comm)  # Ray's
    said = [n for n in plan.notes if "MALLOC_TRIM_THRESHOLD_=" in n]
    assert plan.allocator and len(said) == 1 and "use yours" in said[0]
    assert plan_node(_cfg(), Platform("cpu", 0), 2).allocator  # torchrun's
    assert not plan_node(_cfg(), Platform("cuda", 2), 16).allocator  # GPU workers
    mine = _cfg(comm={"env": {"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"}})
    assert not [n for n in plan_node(mine, Platform("cpu", 0), 2).notes if "MALLOC_TRIM_THRESHOLD_=" in n]
    assert not plan_node(mine, Platform("cpu", 0), 2).allocator


def test_workers_forked_from_the_warm_cluster_are_not_promised_the_allocator_setting(monkeypatch):
    """A worker forked from `scaletrain up`'s server keeps the allocator the server started with: neither the
    variable nor the start line (which would say something that is not so)."""
    from scaletrain.launch import ray_launcher

    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    for k in [k for k in os.environ if k.startswith("MALLOC_")]:
        monkeypatch.delenv(k)
    monkeypatch.setattr(ray_launcher, "node_resources", lambda: [{"CPU": 2.0}])
    launcher = ray_launcher.RayLauncher(_cfg(launcher="ray"), None)
    launcher.resources = {"CPU": 2.0}
    monkeypatch.setattr(launcher, "connect", lambda: [])  # the warm cluster joined
    monkeypatch.setattr(ray_launcher, "_EMBEDDED", [False])
    monkeypatch.setattr(ray_launcher, "_FORKED", [True])
    assert not launcher.plan(Platform("cpu", 0)).allocator
    monkeypatch.setattr(ray_launcher, "_FORKED", [False])
    assert launcher.plan(Platform("cpu", 0)).allocator
