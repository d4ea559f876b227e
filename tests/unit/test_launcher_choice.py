"""scaling.launcher: auto: with nothing of Ray's asked, one worker runs in this process and more that fit on this
machine under torchrun, said in a line; everything else (and an explicit choice) keeps its launcher."""

import pytest

from scaletrain.comm.device import Platform
from scaletrain.config import validate
from scaletrain.launch.launcher import auto_note, choose_launcher


def _cfg(classify_cfg, **sections):
    cfg = {**classify_cfg, **{k: {**classify_cfg.get(k, {}), **v} for k, v in sections.items()}}
    return validate(cfg)


@pytest.fixture(autouse=True)
def no_cluster(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr("scaletrain.launch.warm.cluster.current", lambda: None)
    monkeypatch.setattr("scaletrain.launch.launcher.ray_running", lambda: False)  # (the suite's shared Ray)
    monkeypatch.setattr("scaletrain.launch.launcher.os.cpu_count", lambda: 4)  # a 4-core CPU box
    monkeypatch.setattr("scaletrain.launch.launcher.GPU_DEVICE_FILES", ())


def test_one_local_worker_runs_in_this_process_and_says_so(classify_cfg, monkeypatch):
    monkeypatch.delenv("SCALETRAIN_FAULTS", raising=False)
    cfg = _cfg(classify_cfg)
    assert cfg.scaling.launcher == "auto"
    chosen, note = choose_launcher(cfg)
    assert chosen.scaling.launcher == "local" and note == auto_note("local", 1)
    assert note.startswith("1 worker on this machine") and "in this process" in note
    assert "scaling.launcher=torchrun gives it a process of its own" in note and "=ray forces Ray" in note
    assert chosen.model_dump()["train"] == cfg.model_dump()["train"]  # nothing else changes
    # a drill of injected faults kills a worker process, not the command
    monkeypatch.setenv("SCALETRAIN_FAULTS", "kill:0:3")
    assert choose_launcher(cfg)[0].scaling.launcher == "torchrun"


@pytest.mark.parametrize("workers", [2, 4])
def test_workers_that_fit_this_cpu_box_run_under_torchrun(classify_cfg, workers):
    chosen, note = choose_launcher(_cfg(classify_cfg, scaling={"num_workers": workers}))
    assert chosen.scaling.launcher == "torchrun" and note == auto_note("torchrun", workers)
    assert note.startswith(f"{workers} workers on this machine") and "under torchrun" in note


def test_on_a_gpu_machine_the_gpus_count(classify_cfg, monkeypatch):
    monkeypatch.setattr("scaletrain.launch.launcher.GPU_DEVICE_FILES", (__file__,))  # a file that exists
    monkeypatch.setattr(Platform, "detect", classmethod(lambda cls: Platform("cuda", 8, "2.13.0")))
    monkeypatch.setattr("scaletrain.launch.launcher.os.cpu_count", lambda: 64)
    assert choose_launcher(_cfg(classify_cfg, scaling={"num_workers": 8}))[0].scaling.launcher == "torchrun"
    assert choose_launcher(_cfg(classify_cfg))[0].scaling.launcher == "local"  # 1 GPU worker
    assert choose_launcher(_cfg(classify_cfg, scaling={"num_workers": 16}))[0].scaling.launcher == "ray"  # 2 nodes
    # CPU workers asked for on a GPU machine: a core each
    cpu = _cfg(classify_cfg, scaling={"num_workers": 16, "use_gpu": False})
    assert choose_launcher(cpu)[0].scaling.launcher == "torchrun"


@pytest.mark.parametrize("sections", [
    {"scaling": {"num_workers": 5}},  # more than the 4 cores
    {"scaling": {"placement_strategy": "SPREAD", "num_workers": 2}},
    {"scaling": {"resources_per_worker": {"CPU": 1, "accelerator_type:A100": 0.01}}},
    {"scaling": {"num_workers": [1, 2]}},
    {"fault_tolerance": {"max_failures": 1}},
    {"scaling": {"address": "head:6379"}},
    {"output": {"output_dir": "s3://bucket/runs"}},
])
def test_what_asks_for_ray_gets_ray(classify_cfg, sections):
    chosen, note = choose_launcher(_cfg(classify_cfg, **sections))
    assert chosen.scaling.launcher == "ray" and note is None


def test_an_address_a_warm_cluster_or_a_running_ray_gets_ray(classify_cfg, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "head:6379")
    assert choose_launcher(_cfg(classify_cfg))[0].scaling.launcher == "ray"
    monkeypatch.delenv("RAY_ADDRESS")
    monkeypatch.setattr("scaletrain.launch.launcher.ray_running", lambda: True)
    assert choose_launcher(_cfg(classify_cfg))[0].scaling.launcher == "ray"
    monkeypatch.setattr("scaletrain.launch.launcher.ray_running", lambda: False)
    monkeypatch.setattr("scaletrain.launch.warm.cluster.current", lambda: object())
    assert choose_launcher(_cfg(classify_cfg))[0].scaling.launcher == "ray"


@pytest.mark.parametrize("launcher", ["ray", "torchrun", "local"])
def test_an_explicit_launcher_is_kept(classify_cfg, launcher):
    chosen, note = choose_launcher(_cfg(classify_cfg, scaling={"launcher": launcher}))
    assert chosen.scaling.launcher == launcher and note is None


def test_local_is_one_worker(classify_cfg):
    from scaletrain.errors import ConfigError

    with pytest.raises((ConfigError, ValueError), match="scaling.launcher=local runs 1 worker in this process"):
        _cfg(classify_cfg, scaling={"launcher": "local", "num_workers": 2})


@pytest.mark.parametrize("scaling,ft,expected", [
    ({"num_workers": 2, "launcher": "torchrun"}, {}, False), ({"num_workers": 2}, {}, False),  # auto: torchrun
    ({"num_workers": 2}, {"max_failures": 1}, True), ({"num_workers": 2, "launcher": "ray"}, {}, True)])
def test_parity_starts_ray_only_for_runs_that_would_run_on_it(classify_cfg, scaling, ft, expected):
    """`parity` starts a Ray for its two runs only where they need one (it started one always, and its runs then
    went to it: ~20 CPU-seconds and another launcher than `train` chooses for the same config)."""
    from scaletrain.launch.launcher import runs_on_ray

    assert runs_on_ray(_cfg(classify_cfg, scaling=scaling, fault_tolerance=ft)) is expected
