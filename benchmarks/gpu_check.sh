#!/usr/bin/env bash
# One prepared command for a machine with a GPU (under 9 minutes): what only a GPU can tell, every figure written
# to files in OUT_DIR (the folder that comes back from the GPU machine) and a table at the end.
#   env, topo          the NVML / amd-smi readers against the real device
#   models             a ~0.9B Llama and a 128k-vocabulary Llama built from a config and saved in bf16 first
#   full, lora         1 GPU, bf16: tokens/s, MFU, peak memory vs the plan, the dtypes held, final/'s dtype
#   padded, packed     LoRA on records of mixed lengths: packing with per-example attention vs padding
#   plain-loss, chunked-loss   the 128k-vocabulary model: the whole logits vs the chunked loss (peak, step)
#   fsdp               FSDP2 with its bf16 mixed-precision policy under torchrun with NCCL on 1 GPU
#   qlora, compile     LoRA on the 1B with an NF4 base (torchao; peak memory against lora's), and with
#                      train.compile (tokens/s against lora's, the cold compile time)
#   fp8                LoRA on the 1B with its base's matmuls in FP8 (model.fp8_base; a GPU with FP8 units)
#   plain-loop         the LoRA step in a plain PyTorch + PEFT loop: scaletrain's tokens/s over it (>= 0.97)
#   commbench          when there are 2 or more GPUs
#   context-parallel   when there are 2 or more GPUs: LoRA with each sequence split over 2 (scaling.context_parallel)
# Each part has its own timeout (and all of them a deadline); a failed part is named and the check goes on.
# Usage (repo root, torch with CUDA/ROCm installed): bash benchmarks/gpu_check.sh [OUT_DIR]
# OUT_DIR defaults to a new gpu_check_out/DATE-TIME; an OUT_DIR that holds an earlier check is refused.
# GPU_CHECK_TRAIN_ARGS adds key=value overrides to every training run and GPU_CHECK_SMALL=1 builds the models at a
# test's size (the suite runs this script on CPU, so that the one GPU session it gets is not spent on a broken
# script). GPU_CHECK_PARTS="full lora" runs only the named parts (env, topo and the models always run): the suite runs
# one part end to end and checks the others' configs in its own process (tests/integration/test_gpu_check.py).
set -uo pipefail
OUT=${1:-gpu_check_out/$(date +%Y%m%d-%H%M%S)}
if [ -e "$OUT/env.txt" ]; then
  echo "error: $OUT holds an earlier gpu_check (env.txt); pass a new OUT_DIR (nothing is overwritten)" >&2
  exit 2
fi
mkdir -p "$OUT"
PY=${PY:-python3}
DEADLINE=${GPU_CHECK_DEADLINE_S:-530}  # seconds for the whole check: each part gets at most what is left
TABLE="$OUT/figures.tsv"
printf 'part\tstatus\tfigures\n' > "$TABLE"
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
left() { local l=$((DEADLINE - SECONDS)); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
failed() { printf '%s\tFAILED\t%s\n' "$1" "$2" >> "$TABLE"; echo "== $1: FAILED ($2)"; }
# wanted PART: whether GPU_CHECK_PARTS (unset: every part) names it; a part left out is said, not silent.
wanted() {
  [ -z "${GPU_CHECK_PARTS:-}" ] && return 0
  case " ${GPU_CHECK_PARTS//,/ } " in *" $1 "*) return 0 ;; esac
  echo "== $1: skipped, not in GPU_CHECK_PARTS"
  return 1
}

echo "== env";  st env | tee "$OUT/env.txt"
echo "== topo"; st topo | tee "$OUT/topo.txt"
GPUS=$($PY -c "import torch; print(torch.cuda.device_count())")
echo "== GPUs: $GPUS"

# Records generated, never downloaded: long ones (every row full at 1024 tokens) and mixed lengths (packing).
export DEMO_DATA="$OUT/data"
$PY - <<'PY'
import json, os, random
out = os.environ["DEMO_DATA"]; os.makedirs(out, exist_ok=True)
words = "the model reads long sequences of ordinary words to keep the accelerator busy".split()
rng = random.Random(0)
for name, lengths in (("long", lambda: 1200), ("mixed", lambda: rng.choice([40, 120, 300, 700]))):
    with open(f"{out}/{name}.jsonl", "w") as f:
        for _ in range(600):
            f.write(json.dumps({"instruction": "Continue the text.", "input": "",
                                "output": " ".join(rng.choice(words) for _ in range(lengths()))}) + "\n")
with open(f"{out}/sums.jsonl", "w") as f:  # GRPO's prompts: TRL's prompt-only rows with an answer column
    for _ in range(400):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        f.write(json.dumps({"prompt": [{"role": "user", "content": f"What is {a}+{b}?"}], "answer": str(a + b)}) + "\n")
PY

echo "== models: built from a config, saved in bf16"
MODELS="$OUT/models"
if timeout "$(left 120)" $PY benchmarks/gpu_models.py "$MODELS" ${GPU_CHECK_SMALL:+--small} | tee "$OUT/models.txt"; then
  printf 'models\tok\t%s\n' "$(tr '\n' ';' < "$OUT/models.txt")" >> "$TABLE"
else
  failed models "exit $?"
fi

# train PART TIMEOUT key=value...: one run; its figures printed, kept in OUT/PART.txt and the table.
train() {
  local part=$1 limit=$2; shift 2
  wanted "$part" || return 0
  echo "== $part"
  timeout "$(left "$limit")" $PY -m scaletrain train benchmarks/gpu_check.yaml output.output_dir="$OUT/runs" \
    output.run_name="$part" --no-progress "$@" ${GPU_CHECK_TRAIN_ARGS:-} > "$OUT/$part.log" 2>&1
  local rc=$?
  tail -8 "$OUT/$part.log"
  if [ "$rc" -ne 0 ] || [ ! -f "$OUT/runs/$part/metrics.jsonl" ]; then
    failed "$part" "exit $rc; see $part.log"
    return
  fi
  $PY benchmarks/gpu_figures.py "$OUT/runs/$part" "$part" "$TABLE" | tee "$OUT/$part.txt"
}

train full 150 model.name_or_path="$MODELS/llama-1b"
cp "$OUT/runs/full/metrics.jsonl" "$OUT/metrics.jsonl" 2>/dev/null
train lora 110 model.name_or_path="$MODELS/llama-1b" model.finetuning_type=lora
train padded 80 model.name_or_path="$MODELS/llama-1b" model.finetuning_type=lora data.train_file="$DEMO_DATA/mixed.jsonl"
train packed 80 model.name_or_path="$MODELS/llama-1b" model.finetuning_type=lora data.train_file="$DEMO_DATA/mixed.jsonl" \
  data.packing=true
if $PY -c "import flash_attn" 2>/dev/null; then  # said, not measured: scaletrain has no option for it yet
  echo "== flash-attention is installed; packing here runs per-example SDPA (no flash varlen option in scaletrain yet)"
  printf 'flash-attn\tnot measured\tinstalled; no scaletrain option selects its varlen path yet\n' >> "$TABLE"
fi
train plain-loss 70 model.name_or_path="$MODELS/llama-128k" train.loss_chunk_tokens=0 data.max_length=2048 \
  train.per_device_train_batch_size=4
train chunked-loss 70 model.name_or_path="$MODELS/llama-128k" data.max_length=2048 train.per_device_train_batch_size=4
train fsdp 80 model.name_or_path="$MODELS/llama-1b" model.finetuning_type=lora train.strategy=fsdp train.max_steps=10
train qlora 80 model.name_or_path="$MODELS/llama-1b" model.finetuning_type=lora model.quantization_bit=4 \
  model.quantization_method=torchao train.max_steps=15
train compile 120 model.name_or_path="$MODELS/llama-1b" model.finetuning_type=lora train.compile=true
# GRPO (#61): LoRA, 4 completions a prompt, the hf engine colocated (no Ray here: a separate engine's sync time is
# measured where Ray is, tests/integration/test_rollout_ray.py); rollout/reference/train split and rollout tokens/s
train grpo 120 model.name_or_path="$MODELS/llama-1b" model.finetuning_type=lora train.stage=grpo \
  data.train_file="$DEMO_DATA/sums.jsonl" data.formatting=messages data.eval_ratio=0 data.max_length=64 \
  train.per_device_train_batch_size=16 train.max_steps=20 train.logging_steps=2 train.learning_rate=5e-5 \
  'rl.reward_funcs=[accuracy,length]' rl.num_generations=4 rl.max_completion_length=128
if [ "$GPUS" -ge 1 ]; then  # (train says when GPU_CHECK_PARTS leaves it out)
  train fp8 80 model.name_or_path="$MODELS/llama-1b" model.finetuning_type=lora model.fp8_base=true
else
  echo "== fp8: skipped, no GPU (FP8 matmuls need FP8 units: H100/H200, MI300X and newer)"
fi

PLAIN_ARGS=${GPU_CHECK_PLAIN_ARGS:-"1024 8 20"}
plain_loop() {
  echo "== plain-loop: the LoRA step in a plain PyTorch + PEFT loop"
  timeout "$(left 90)" $PY benchmarks/gpu_plain_loop.py "$MODELS/llama-1b" "$DEMO_DATA/long.jsonl" $PLAIN_ARGS \
    > "$OUT/plain-loop.txt" 2>&1
  local rc=$?
  if [ "$rc" -ne 0 ]; then
    failed plain-loop "exit $rc; see plain-loop.txt"
    return
  fi
  tail -1 "$OUT/plain-loop.txt"
  $PY - "$OUT" "$TABLE" <<'PY'
import re, sys
from pathlib import Path
out, table = Path(sys.argv[1]), sys.argv[2]
plain = float(re.search(r"plain tokens/s \(median\): (\d+)", (out / "plain-loop.txt").read_text()).group(1))
lora = out / "lora.txt"
ours = re.search(r"lora tokens/s: (\d+)", lora.read_text()) if lora.is_file() else None
ratio = f"{float(ours.group(1)) / plain:.3f}" if ours and plain else "n/a (no lora figure)"
print(f"scaletrain lora / plain loop tokens/s: {ratio} (target >= 0.97)")
with open(table, "a") as f:
    f.write(f"plain-loop\tok\tplain tokens/s {plain:.0f}; scaletrain/plain {ratio}\n")
PY
}
if wanted plain-loop; then plain_loop; fi

if [ "$GPUS" -ge 2 ]; then
  echo "== commbench: $GPUS GPUs"
  if timeout "$(left 200)" $PY -m scaletrain commbench -n "$GPUS" -c all_reduce,all_gather -b 1M -e 1G -f 4 \
      | tee "$OUT/commbench.txt"; then
    printf 'commbench\tok\tsee commbench.txt\n' >> "$TABLE"
  else
    failed commbench "exit $?"
  fi
else
  echo "== commbench: skipped, $GPUS GPU(s) (a collective needs 2 ranks)"
fi

if [ "$GPUS" -ge 2 ]; then  # context parallelism: each sequence split over 2 GPUs (ulysses; the 1B's 32 heads divide)
  train context-parallel 90 model.name_or_path="$MODELS/llama-1b" model.finetuning_type=lora train.strategy=fsdp \
    scaling.num_workers=2 scaling.launcher=torchrun scaling.context_parallel=2 train.max_steps=10
else
  echo "== context-parallel: skipped, $GPUS GPU(s) (a sequence split needs 2)"
fi

echo "== summary ($SECONDS s; every figure is in $OUT)"
column -t -s "$(printf '\t')" "$TABLE" 2>/dev/null || cat "$TABLE"
