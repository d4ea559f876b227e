"""scaling.launcher: auto: a single local worker with nothing of Ray's asked runs under torchrun, said in a line;
everything else (and an explicit choice) keeps its launcher."""

import pytest

from scaletrain.config import validate
from scaletrain.launch.launcher import TORCHRUN_NOTE, choose_launcher


def _cfg(classify_cfg, **sections):
    cfg = {**classify_cfg, **{k: {**classify_cfg.get(k, {}), **v} for k, v in sections.items()}}
    return validate(cfg)


@pytest.fixture(autouse=True)
def no_cluster(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr("scaletrain.launch.warm.cluster.current", lambda: None)
    monkeypatch.setattr("scaletrain.launch.launcher.ray_running", lambda: False)  # (the suite's shared Ray)


def test_one_local_worker_runs_under_torchrun_and_says_so(classify_cfg):
    cfg = _cfg(classify_cfg)
    assert cfg.scaling.launcher == "auto"
    chosen, note = choose_launcher(cfg)
    assert chosen.scaling.launcher == "torchrun" and note == TORCHRUN_NOTE
    assert "scaling.launcher=ray forces Ray" in note
    assert chosen.model_dump()["train"] == cfg.model_dump()["train"]  # nothing else changes


@pytest.mark.parametrize("sections", [
    {"scaling": {"num_workers": 2}},
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


@pytest.mark.parametrize("launcher", ["ray", "torchrun"])
def test_an_explicit_launcher_is_kept(classify_cfg, launcher):
    chosen, note = choose_launcher(_cfg(classify_cfg, scaling={"launcher": launcher}))
    assert chosen.scaling.launcher == launcher and note is None
