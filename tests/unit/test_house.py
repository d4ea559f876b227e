"""House rules that keep the code base one shape: each shared name has one owner (checked on the source)."""

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "scaletrain"


def _sources(exclude: tuple[str, ...] = ()):
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if not rel.startswith(exclude):
            yield rel, path.read_text()


@pytest.mark.parametrize("name", ["summary.json", "metrics.jsonl", "config.resolved.yaml", "alerts.jsonl",
                                  "main.log", "launch.json", "heartbeat", "checkpoints"])
def test_run_directory_names_are_spelled_only_in_rundir(name):
    offenders = []
    for rel, text in _sources(exclude=("rundir.py",)):
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.strip("/") in (
                    name, f"logs/{name}"):
                offenders.append(f"{rel}:{node.lineno}")
    assert offenders == [], f"{name!r} spelled outside rundir.py: {offenders}"


def test_only_the_registry_reads_or_changes_the_environment():
    pattern = re.compile(r"\bos\.(environ|getenv|putenv|unsetenv)\b")
    offenders = [f"{rel}:{n}" for rel, text in _sources(exclude=("envvars.py",))
                 for n, line in enumerate(text.splitlines(), 1) if pattern.search(line)]
    assert offenders == []


def test_nothing_outside_the_registry_names_a_communication_variable():
    # NCCL_*, RCCL_*, HSA_*, MASTER_PORT ... are named in envvars.py and used through its constants.
    pattern = re.compile(r"[\"'](?:NCCL|RCCL|TORCH_NCCL|HSA|GLOO|MASTER|RAY)_[A-Z_]+[\"']")
    offenders = [f"{rel}:{n}" for rel, text in _sources(exclude=("envvars.py",))
                 for n, line in enumerate(text.splitlines(), 1) if pattern.search(line)]
    assert offenders == []


def test_the_registry_is_the_ground_floor():
    """envvars.py imports no scaletrain module but credentials.py (itself importing none): config/ and every
    other layer may use it without importing comm/."""
    tree = ast.parse((SRC / "envvars.py").read_text())
    own = {n.module for n in ast.walk(tree)
           if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("scaletrain")}
    assert own == {"scaletrain.credentials"}
    cred = ast.parse((SRC / "credentials.py").read_text())
    assert not [n for n in ast.walk(cred)
                if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("scaletrain")]


def test_no_import_circle_between_checkpointing_and_the_trainer():
    offenders = [rel for rel, text in _sources() if rel.startswith("checkpoint/") and "scaletrain.worker" in text]
    assert offenders == []


def test_the_worker_loop_reads_in_one_screen():
    tree = ast.parse((SRC / "worker" / "loop.py").read_text())
    run_loop = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run_loop")
    assert run_loop.end_lineno - run_loop.lineno < 30
    sizes = {n.name: n.end_lineno - n.lineno for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    assert max(sizes.values()) < 60, sizes


@pytest.mark.loop
def test_importing_a_launcher_sets_no_environment_variable():
    import os
    import subprocess
    import sys

    code = ("import os; before = dict(os.environ); import scaletrain.launch.ray_launcher, "
            "scaletrain.launch.torchrun_launcher, scaletrain.launch.job; print(dict(os.environ) == before)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={
        k: v for k, v in os.environ.items() if k != "RAY_TRAIN_V2_ENABLED"}, timeout=120)
    assert out.stdout.strip() == "True", out.stderr
