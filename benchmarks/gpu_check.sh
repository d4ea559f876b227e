#!/usr/bin/env bash
# One prepared command for a machine with a GPU (about 10 minutes at most): env and topology, single-GPU
# training throughput and MFU of a ~0.9B Llama in bf16, and commbench on the GPUs that are there.
# Usage (repo root, torch with CUDA/ROCm already installed): bash benchmarks/gpu_check.sh [OUT_DIR]
# OUT_DIR defaults to a new gpu_check_out/DATE-TIME; an OUT_DIR that holds an earlier check is refused.
# GPU_CHECK_TRAIN_ARGS adds key=value overrides to the training run (the tests use it to run this script on CPU
# with a tiny model, so that the one GPU session it gets is not spent on a broken script).
set -uo pipefail
OUT=${1:-gpu_check_out/$(date +%Y%m%d-%H%M%S)}
if [ -e "$OUT/env.txt" ]; then
  echo "error: $OUT holds an earlier gpu_check (env.txt); pass a new OUT_DIR (nothing is overwritten)" >&2
  exit 2
fi
mkdir -p "$OUT"
PY=${PY:-python3}
# The wheels the GPU machine lacks (pydantic, datasets: benchmarks/gpu_wheels.sh put them in .whl/), first, where
# they are missing (a machine that has them keeps its own).
if ls .whl/*.whl >/dev/null 2>&1 && ! $PY -c "import pydantic, datasets" 2>/dev/null; then
  SITE=$(mktemp -d /tmp/scaletrain-site-XXXX)
  $PY -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/*.whl || exit 3
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  echo "== wheels: $(ls .whl/*.whl | wc -l) from .whl/ installed into $SITE"
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
st() { $PY -m scaletrain "$@"; }

echo "== env";  st env | tee "$OUT/env.txt"
echo "== topo"; st topo | tee "$OUT/topo.txt"
GPUS=$($PY -c "import torch; print(torch.cuda.device_count())")
echo "== GPUs: $GPUS"

# Long-ish SFT records so sequences reach ~1024 tokens (generated, never downloaded).
export DEMO_DATA="$OUT/data"
$PY - <<'PY'
import json, os, random
out = os.environ["DEMO_DATA"]; os.makedirs(out, exist_ok=True)
words = "the model reads long sequences of ordinary words to keep the accelerator busy".split()
rng = random.Random(0)
with open(f"{out}/long.jsonl", "w") as f:
    for _ in range(600):
        f.write(json.dumps({"instruction": "Continue the text.", "input": "",
                            "output": " ".join(rng.choice(words) for _ in range(1200))}) + "\n")
PY

echo "== train: 1 GPU, bf16, llama-1b"
timeout 420 $PY -m scaletrain train benchmarks/gpu_check.yaml output.output_dir="$OUT/runs" --no-progress \
  ${GPU_CHECK_TRAIN_ARGS:-} 2>&1 | tail -25
RUN=$(ls -d "$OUT"/runs/gpu_check-* 2>/dev/null | tail -1)
if [ -n "$RUN" ]; then
  $PY - "$RUN" <<'PY'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
train = [r for r in recs if r["kind"] == "train"][1:]
if train:
    print("tokens/s (median):", round(statistics.median(r["throughput/tokens_per_s"] for r in train)))
    print("step time s (median):", round(statistics.median(r["time/step_s"] for r in train), 4))
    mfus = [r["perf/mfu"] for r in train if "perf/mfu" in r]
    print("MFU (median):", f"{statistics.median(mfus):.1%}" if mfus else "n/a (unknown device)")
    peaks = [r["memory/peak_gib"] for r in recs if "memory/peak_gib" in r]
    print("peak memory GiB:", round(max(peaks), 2) if peaks else "n/a (no GPU memory statistics)")
try:
    s = json.load(open(sys.argv[1] + "/summary.json"))
    p = s.get("memory/predicted", {})
    print("plan vs measured peak: predicted", round((p.get("peak", 0) - p.get("overhead", 0)) / 2**30, 2),
          "GiB (+", round(p.get("overhead", 0) / 2**30, 2), "GiB runtime), measured",
          round(s["memory/peak_bytes"] / 2**30, 2), "GiB,", s.get("memory/measured_as"), "; ratio",
          round(s["memory/predicted_over_measured"], 3) if s.get("memory/predicted_over_measured") else "n/a")
    print("precision:", ", ".join(f"{k.removeprefix('precision/')} {v}" for k, v in s.items()
                                  if k.startswith("precision/")))
    for what, key in (("parameters", "memory/param_bytes_per_rank"), ("optimizer", "memory/optimizer_bytes_per_rank")):
        held = max(s.get(key) or [0])
        print(f"{what} held per rank {held / 2**30:.2f} GiB, plan {p.get(what, 0) / 2**30:.2f} GiB")
except (OSError, KeyError, ValueError) as e:
    print("plan vs measured peak: n/a", type(e).__name__, e)
PY
  cp "$RUN/metrics.jsonl" "$OUT/metrics.jsonl" 2>/dev/null
fi

if [ "$GPUS" -ge 2 ]; then
  echo "== commbench: $GPUS GPUs"
  timeout 240 $PY -m scaletrain commbench -n "$GPUS" -c all_reduce,all_gather -b 1M -e 1G -f 4 | tee "$OUT/commbench.txt"
else
  echo "== commbench: skipped, $GPUS GPU(s) (a collective needs 2 ranks)"
fi
