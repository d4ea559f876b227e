#!/usr/bin/env bash
# LLaMA-Factory 0.9.5 in a venv of its own (it pins transformers <= 5.6, accelerate <= 1.11, trl <= 0.24: not
# scaletrain's), with the same torch 2.13.0 CPU build, for benchmarks/vs_llamafactory.py:
#
#     bash benchmarks/llamafactory_env.sh /tmp/lf-venv
#     python benchmarks/vs_llamafactory.py --llamafactory /tmp/lf-venv --rounds 3
#
# Its requirements torchaudio, torchvision, av and gradio serve audio, images, video and the web UI, which a text
# SFT run does not use; torchaudio's newest release (2.11) pins torch 2.11, so they are left out (--no-deps for
# llamafactory itself, then the rest of its requirements as it states them; a stand-in for torchaudio's import).
set -euo pipefail
VENV=${1:-/tmp/lf-venv}
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q torch==2.13.0
"$VENV/bin/pip" install -q --no-deps llamafactory==0.9.5
"$VENV/bin/pip" install -q "transformers>=4.55.0,<=5.6.0,!=4.57.0,!=4.52.0" "datasets>=2.16.0,<=4.0.0" \
    "accelerate>=1.3.0,<=1.11.0" "peft>=0.18.0,<=0.18.1" "trl>=0.18.0,<=0.24.0" "tyro<0.9.0" \
    "torchdata>=0.10.0,<=0.11.0" einops fire modelscope omegaconf packaging pandas protobuf pydantic pyyaml \
    safetensors scipy sentencepiece tiktoken matplotlib numpy psutil
# LLaMA-Factory's multimodal plugin imports torchaudio at module level and no torchaudio release matches torch
# 2.13.0: a stand-in module that fails only if audio is used (a text SFT run never calls it).
SP=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
mkdir -p "$SP/torchaudio"
cat > "$SP/torchaudio/__init__.py" <<'PY'
# A stand-in written by scaletrain's benchmarks/llamafactory_env.sh (no torchaudio release matches torch 2.13.0).
def __getattr__(name):
    raise ImportError(f"torchaudio.{name}: torchaudio is a stand-in in this benchmark venv (no audio support)")
PY
(cd "$VENV" && "$VENV/bin/llamafactory-cli" version >/dev/null)  # not from /tmp: Ray's /tmp/ray would shadow ray
echo "LLaMA-Factory ready in $VENV"
