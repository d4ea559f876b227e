"""benchmarks/gpu_check.sh end to end on CPU with a tiny model, so that a GPU session is not spent on a broken
script: every section runs, the summary parses the run's metrics, and what a CPU cannot measure says n/a."""

import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

from tests.loop.test_without_ray import BLOCK_RAY

ROOT = Path(__file__).resolve().parents[2]
TINY = ("train.bf16=false train.max_steps=6 train.logging_steps=2 data.max_length=64 data.max_truncated_ratio=1 "
        "train.per_device_train_batch_size=4")
PARTS = ("models", "full", "lora", "padded", "packed", "plain-loss", "chunked-loss", "fsdp", "qlora", "compile",
         "grpo", "plain-loop")


def test_gpu_check_script_on_cpu(tmp_path):
    """As the GPU machine is: no Ray (import ray fails), the torchrun launcher."""
    out = tmp_path / "gc"
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCK_RAY)
    env = {**os.environ, "PY": sys.executable, "GPU_CHECK_TRAIN_ARGS": TINY, "GPU_CHECK_SMALL": "1",
           "GPU_CHECK_PLAIN_ARGS": "64 4 6",
           "PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(["bash", "benchmarks/gpu_check.sh", str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=400)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    for section in ("== env", "== topo", "== GPUs: 0", "== models", "== full", "== lora", "== fsdp", "== plain-loop",
                    "== commbench: skipped, 0 GPU(s)", "== qlora", "== compile", "== grpo", "== fp8: skipped, no GPU"):
        assert section in text, section
    import torch

    assert f"torch: {torch.__version__}" in (out / "env.txt").read_text()  # whatever torch this venv has
    tokens_per_s = float(re.search(r"full tokens/s: (\d+)", text).group(1))
    step_s = float(re.search(r"full step_s: ([\d.]+)", text).group(1))
    assert "full mfu: n/a (unknown device)" in text  # a CPU has no peak in the table: never a guessed MFU
    assert "full peak_gib: n/a" in text
    # every part ran and is in the table at the end (figures.tsv), with its own file
    table = [line.split("\t") for line in (out / "figures.tsv").read_text().splitlines()[1:]]
    assert [row[0] for row in table] == list(PARTS) and all(row[1] == "ok" for row in table), table
    assert "bf16" in (out / "models.txt").read_text() and (out / "models" / "llama-128k" / "config.json").is_file()
    assert json.loads((out / "models" / "llama-1b" / "config.json").read_text())["dtype"] == "bfloat16"
    assert "full final_dtype: bfloat16" in text  # a bf16 checkpoint's final/ is bf16 again
    assert re.search(r"scaletrain lora / plain loop tokens/s: [\d.]+ \(target >= 0.97\)", text)
    assert re.search(r"grpo rollout_s: [\d.]+", text) and re.search(r"grpo rollout_tokens_per_s: [\d.]+", text)
    assert "== summary (" in text
    train = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"]
    assert len(train) == 3  # 6 steps logged every 2
    # The summary is the median over the logged intervals after the first (warm-up) one.
    assert tokens_per_s == round(statistics.median(r["throughput/tokens_per_s"] for r in train[1:]))
    assert step_s == round(statistics.median(r["time/step_s"] for r in train[1:]), 4)
    before = (out / "env.txt").read_text()
    again = subprocess.run(["bash", "benchmarks/gpu_check.sh", str(out)], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=60)  # a second check into the same directory is refused at once
    assert again.returncode == 2 and f"error: {out} holds an earlier gpu_check" in again.stderr
    assert (out / "env.txt").read_text() == before
