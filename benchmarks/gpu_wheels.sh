#!/usr/bin/env bash
# The wheels the borrowed GPU machine lacks (it has torch, transformers, peft, pyarrow, pandas, rich, psutil,
# nvidia-ml-py, but no pydantic, no datasets, no torchao (QLoRA, FP8), no Ray: /work/.library/device/KINDS.md), for CPython 3.12 on
# manylinux x86-64, downloaded on a machine that reaches the registry into .whl/ (git-ignored). The versions are
# this venv's, so the GPU run uses what the tests here ran with. gpu_check.sh installs them, when present, into
# a temporary target before anything else. Ray is not among them: its wheel alone is over the 64 MiB that
# travels with the tree, and the check trains with the torchrun launcher.
# Usage (repo root): bash benchmarks/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
NAMES="pydantic pydantic-core annotated-types typing-inspection datasets dill multiprocess torchao"
mkdir -p .whl
for name in $NAMES; do
  version=$($PY -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p')
  if [ -z "$version" ]; then
    echo "error: $name is not installed in $PY's environment; run make install first" >&2
    exit 2
  fi
  if ls .whl/ | grep -qi "^$(echo "$name" | tr - _)-$version-"; then
    continue
  fi
  # pip matches the platform tag exactly: the tags manylinux wheels of these packages use
  $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "$name==$version"
done
total=$(du -cb .whl/*.whl | tail -1 | cut -f1)
ls -1 .whl/*.whl
echo "total: $((total / 1024 / 1024)) MiB in $(ls .whl/*.whl | wc -l) wheels (the tree that travels is limited to 64 MiB)"
