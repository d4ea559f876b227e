"""``train.compile``'s parts (#63): what it says, when it cannot compile, the goodput category."""

import json

import pytest

from scaletrain.config import validate
from scaletrain.errors import ConfigError
from scaletrain.metrics.goodput import account
from scaletrain.worker import compile as comp


def test_graph_breaks_are_said_after_the_first_step(monkeypatch):
    monkeypatch.setattr(comp, "_graph_breaks", lambda: ["Dynamic shape operator", "Data dependent operator"])
    done = comp.Compiled(blocks=2)
    assert done.fallback_note() == ("train.compile: nothing compiled, the blocks run eager (dynamo: Dynamic shape "
                                    "operator)")
    assert done.fallback_note() is None  # said once
    partly = comp.Compiled(blocks=2, graphs=3)
    assert partly.fallback_note().startswith("train.compile: 2 graph break(s) in the blocks, those parts run eager")


def test_the_fallback_is_said_once_per_new_graph():
    done = comp.Compiled(blocks=2, checked=True)
    assert done.note().startswith("train.compile: 2 decoder blocks compiled regionally")
    assert done.fallback_note() is None
    done.fallback.append("RuntimeError: no kernel")
    assert done.fallback_note() == ("train.compile: inductor could not compile 1 graph(s), which run eager "
                                    "(RuntimeError: no kernel)")
    assert done.fallback_note() is None


def test_no_cpu_compiler_means_eager_said(monkeypatch):
    import torch

    monkeypatch.setattr(comp.shutil, "which", lambda name: None)
    done = comp.compile_blocks(torch.nn.ModuleList([torch.nn.Linear(2, 2)]), "cpu")
    assert done.blocks == 0 and done.note() == ("train.compile: eager (no C++ compiler (g++ or clang++) for "
                                                "inductor's CPU code)")


def test_torch_too_old_is_one_line(monkeypatch):
    from scaletrain.launch import preflight

    assert comp.torch_too_old("2.3.1+rocm6.0") and not comp.torch_too_old("2.13.0+cpu")
    monkeypatch.setattr(preflight, "torch_version", lambda: "2.3.1")
    cfg = validate({"model": {"name_or_path": "builtin:tiny-llama", "task": "causal-lm"},
                    "data": {"train_file": "x.jsonl"}, "train": {"compile": True}})
    with pytest.raises(ConfigError, match=r"train.compile: torch 2.3.1 is too old .* \(torch >= 2.4\); upgrade"):
        preflight.preflight(cfg)


def test_compile_time_is_its_own_goodput_category(tmp_path):
    (tmp_path / "timeline.jsonl").write_text("\n".join(json.dumps(m) for m in [
        {"time": 0.0, "event": "launch"}, {"time": 1.0, "event": "prepared"}, {"time": 1.0, "event": "cluster"},
        {"time": 2.0, "event": "worker_start"}, {"time": 3.0, "event": "model_ready"},
        {"time": 30.0, "event": "end"}]))
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"time": 20.0, "kind": "train", "step": 1, "window_steps": 1, "time/step_s": 0.5, "time/compile_s": 16.0},
        {"time": 21.0, "kind": "train", "step": 2, "window_steps": 1, "time/step_s": 0.5}]))
    g = account(tmp_path)
    assert g["goodput/compile_s"] == 16.0 and g["goodput/productive_s"] == 1.0
    assert g["goodput/wall_s"] == 30.0
