"""scaletrain where `import ray` fails (the GPU machine this project borrows has no Ray): the commands that need
no Ray cluster work, torchrun trains, and what would need Ray says so in one line."""

import json
import re
import subprocess
import sys

import pytest

from tests.conftest import write_config

pytestmark = pytest.mark.slow  # subprocesses of the CLI or whole runs: make test-loop's budget, not test-fast's

BLOCK_RAY = '''
import sys

class _NoRay:
    def find_spec(self, name, path=None, target=None):
        if name == "ray" or name.startswith("ray."):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, _NoRay())
'''


@pytest.fixture(scope="module")
def no_ray_env(tmp_path_factory):
    """This environment with `import ray` failing (a sitecustomize that blocks it), checked once for the module."""
    import os

    site = tmp_path_factory.mktemp("site")
    (site / "sitecustomize.py").write_text(BLOCK_RAY)
    env = {**os.environ, "PYTHONPATH": str(site) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    check = subprocess.run([sys.executable, "-c", "import ray"], env=env, capture_output=True, text=True)
    assert check.returncode != 0 and "No module named 'ray'" in check.stderr  # the block is in place
    scaletrain_env = subprocess.run([sys.executable, "-m", "scaletrain", "env"], env=env, capture_output=True,
                                    text=True, timeout=300)
    assert scaletrain_env.returncode == 0 and "ray" not in scaletrain_env.stderr.lower()
    return env


@pytest.fixture
def no_ray(no_ray_env, tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "scaletrain", *map(str, args)], capture_output=True, text=True,
                              env=no_ray_env, timeout=300, cwd=tmp_path)

    return run


# Several commands in one interpreter where `import ray` fails, each as tests/cli.py runs a command (its own output,
# exit code, environment and working directory): one import of torch and transformers for all of them.
IN_ONE = """
import json, sys
from tests.cli import run_cli

done = [run_cli(*args) for args in json.loads(sys.argv[1])]
print("RESULTS " + json.dumps([[p.returncode, p.stderr] for p in done]))
"""


@pytest.fixture
def no_ray_in_one(no_ray_env, tmp_path):
    import os
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**no_ray_env, "PYTHONPATH": no_ray_env["PYTHONPATH"] + os.pathsep + str(root)}

    def run(*commands) -> list[subprocess.CompletedProcess]:
        proc = subprocess.run([sys.executable, "-c", IN_ONE, json.dumps([list(map(str, c)) for c in commands])],
                              capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULTS ")), None)
        assert proc.returncode == 0 and line, proc.stderr[-3000:]
        return [subprocess.CompletedProcess(c, code, "", err)
                for c, (code, err) in zip(commands, json.loads(line[len("RESULTS "):]), strict=True)]

    return run


def test_the_commands_that_need_no_ray_run_without_it(no_ray, no_ray_in_one, classify_cfg, tmp_path):
    cfg = write_config(tmp_path / "c.yaml", {**classify_cfg, "scaling": {"launcher": "torchrun", "num_workers": 2}})
    for proc in no_ray_in_one(("topo",), ("plan", cfg, "--device", "h100"), ("doctor", cfg, "--no-smoke")):
        assert proc.returncode == 0, (proc.args, proc.stderr[-1500:])
    train = no_ray("train", cfg, "output.run_name=tr", "--no-progress")
    assert train.returncode == 0, train.stderr[-2000:]
    run = tmp_path / "runs" / "tr"
    assert (run / "summary.json").is_file() and (run / "final").is_dir()
    # start-up said as it happens: the config line first, then each phase with the seconds since the command began
    phases = re.findall(r"^\s*([\d.]+) s (config checked|data and model checked|cluster ready \(torchrun|"
                        r"workers starting|workers started|model built and restored|training: step \d+ logged)",
                        train.stderr, flags=re.M)
    assert train.stderr.lstrip().startswith(phases[0][0]) and phases[0][1] == "config checked"
    assert [p for _, p in phases] == ["config checked", "data and model checked", "cluster ready (torchrun",
                                      "workers starting", "workers started", "model built and restored",
                                      "training: step 2 logged"]
    times = [float(t) for t, _ in phases]
    assert times == sorted(times)
    assert (run / "logs" / "main.log").read_text().count("] phase: ") == 7
    # the whole process tree's peak memory beside the workers': the driver, the torchrun agent, its 2 workers
    summary = json.loads((run / "summary.json").read_text())
    assert summary["memory/tree_peak_processes"] >= 4
    assert summary["memory/tree_peak_bytes"] > sum(summary["memory/peak_bytes_per_rank"])
    # the default launcher (auto) trains a single local worker in the command's own process, and says so
    single = write_config(tmp_path / "one.yaml", classify_cfg)
    report, auto = no_ray_in_one(("report", run), ("train", single, "output.run_name=one", "--no-progress"))
    assert report.returncode == 0, report.stderr[-1500:]
    assert auto.returncode == 0, auto.stderr[-2000:]
    assert "1 worker on this machine and no restarts asked: it runs in this process" in auto.stderr
    one = tmp_path / "runs" / "one"
    assert "launcher: local" in (one / "config.resolved.yaml").read_text()
    summary = json.loads((one / "summary.json").read_text())
    assert summary["memory/tree_peak_processes"] == 1 and summary["steps"] == 12 and (one / "final").is_dir()


@pytest.mark.parametrize("args, what", [(("train", "{cfg}"), "scaling.launcher=ray"),
                                        (("commbench", "-n", "2"), "scaletrain commbench"),
                                        (("up",), "scaletrain up")])
def test_what_needs_ray_says_so_in_one_line(no_ray, classify_cfg, tmp_path, args, what):
    # restarts: Ray's (the default launcher, auto, runs workers that fit this machine under torchrun, without Ray)
    cfg = write_config(tmp_path / "c.yaml", {**classify_cfg, "scaling": {"num_workers": 2},
                                             "fault_tolerance": {"max_failures": 1}})
    proc = no_ray(*(a.format(cfg=cfg) for a in args))
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr[-1500:]
    assert lines[0].startswith(f"error: {what} needs Ray, which is not installed") and "launcher=torchrun" in lines[0]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
