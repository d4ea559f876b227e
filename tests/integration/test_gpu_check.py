"""benchmarks/gpu_check.sh on CPU with a tiny model, so that a GPU session is not spent on a broken script.

One run of the script end to end (as the GPU machine is: no Ray, the torchrun launcher) with one training part and
the plain loop: every section runs or says why not, the summary parses the run's metrics, what a CPU cannot measure
says n/a. Every other part's command line is checked in this process: its overrides load against the check's YAML
and pass the same preflight `train` runs before any worker starts (a misspelt key, a combination the config or the
data refuses). Each part's feature is trained by its own tests (QLoRA, compile, GRPO, FSDP, packing, the chunked
loss)."""

import json
import os
import re
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tests.loop.test_without_ray import BLOCK_RAY

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
TINY = ("train.bf16=false train.max_steps=6 train.logging_steps=2 data.max_length=64 data.max_truncated_ratio=1 "
        "train.per_device_train_batch_size=4")
PARTS = ("models", "full", "lora", "padded", "packed", "plain-loss", "chunked-loss", "fsdp", "qlora", "compile",
         "grpo", "fp8", "plain-loop")
RUN = ("full", "plain-loop")  # the parts the script runs here: one training run, and the plain PyTorch loop


@pytest.fixture(scope="module")
def check(tmp_path_factory):
    """The script run once, into a fresh directory: (its directory, its output, its environment)."""
    tmp = tmp_path_factory.mktemp("gpu-check")
    out, site = tmp / "gc", tmp / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCK_RAY)
    env = {**os.environ, "PY": sys.executable, "GPU_CHECK_TRAIN_ARGS": TINY, "GPU_CHECK_SMALL": "1",
           "GPU_CHECK_PLAIN_ARGS": "64 4 6", "GPU_CHECK_PARTS": " ".join(RUN),
           "PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(["bash", str(SCRIPT), str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=400)
    return out, proc, env


def test_gpu_check_script_on_cpu(check):
    out, proc, env = check
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    for section in ("== env", "== topo", "== GPUs: 0", "== models", "== full", "== plain-loop",
                    "== commbench: skipped, 0 GPU(s)", "== lora: skipped, not in GPU_CHECK_PARTS",
                    "== grpo: skipped, not in GPU_CHECK_PARTS", "== fp8: skipped, no GPU"):
        assert section in text, section
    import torch

    assert f"torch: {torch.__version__}" in (out / "env.txt").read_text()  # whatever torch this venv has
    tokens_per_s = float(re.search(r"full tokens/s: (\d+)", text).group(1))
    step_s = float(re.search(r"full step_s: ([\d.]+)", text).group(1))
    assert "full mfu: n/a (unknown device)" in text  # a CPU has no peak in the table: never a guessed MFU
    assert "full peak_gib: n/a" in text
    # every part that ran is in the table at the end (figures.tsv)
    table = [line.split("\t") for line in (out / "figures.tsv").read_text().splitlines()[1:]]
    assert [row[0] for row in table] == ["models", *RUN] and all(row[1] == "ok" for row in table), table
    assert "bf16" in (out / "models.txt").read_text() and (out / "models" / "llama-128k" / "config.json").is_file()
    assert json.loads((out / "models" / "llama-1b" / "config.json").read_text())["dtype"] == "bfloat16"
    assert "full final_dtype: bfloat16" in text  # a bf16 checkpoint's final/ is bf16 again
    # no lora part ran: the ratio says so instead of a number
    assert "scaletrain lora / plain loop tokens/s: n/a (no lora figure) (target >= 0.97)" in text
    assert re.search(r"plain tokens/s \(median\): \d+", (out / "plain-loop.txt").read_text())
    assert "== summary (" in text
    train = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"]
    assert len(train) == 3  # 6 steps logged every 2
    # The summary is the median over the logged intervals after the first (warm-up) one.
    assert tokens_per_s == round(statistics.median(r["throughput/tokens_per_s"] for r in train[1:]))
    assert step_s == round(statistics.median(r["time/step_s"] for r in train[1:]), 4)
    before = (out / "env.txt").read_text()
    again = subprocess.run(["bash", str(SCRIPT), str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=60)  # a second check into the same directory is refused at once
    assert again.returncode == 2 and f"error: {out} holds an earlier gpu_check" in again.stderr
    assert (out / "env.txt").read_text() == before


def script_parts(models: Path, data: Path) -> dict[str, list[str]]:
    """Each `train PART LIMIT key=value...` line of the script: PART -> its overrides, $MODELS and $DEMO_DATA
    expanded."""
    text = SCRIPT.read_text().replace("\\\n", " ")
    parts = {}
    for line in text.splitlines():
        words = shlex.split(line.strip(), comments=True) if line.strip().startswith("train ") else []
        if len(words) >= 3 and words[2].isdigit():
            parts[words[1]] = [w.replace("$MODELS", str(models)).replace("$DEMO_DATA", str(data)) for w in words[3:]]
    return parts


def test_every_part_of_the_check_passes_the_preflight_train_runs(check, monkeypatch):
    """What the GPU session would run for each part, up to where the workers would start: the config with the
    part's overrides (and the suite's tiny settings), then train's preflight: its model, data and settings."""
    from scaletrain.config import load_config
    from scaletrain.launch.preflight import preflight

    out, _, _ = check
    parts = script_parts(out / "models", out / "data")
    assert sorted(parts) == sorted([*(p for p in PARTS if p not in ("models", "plain-loop")), "context-parallel"])
    monkeypatch.setenv("DEMO_DATA", str(out / "data"))  # the check's YAML reads it
    for part, overrides in parts.items():
        cfg = load_config(ROOT / "benchmarks" / "gpu_check.yaml",
                          [*overrides, *TINY.split(), f"output.output_dir={out / 'runs'}", f"output.run_name={part}"])
        pre = preflight(cfg)
        assert pre.data.train is not None and len(pre.data.train) > 0, part
