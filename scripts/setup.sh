#!/usr/bin/env bash
# Create .venv and install mixln-convert with its test dependencies and lm-evaluation-harness.
# torch: the CUDA build where an NVIDIA GPU is present, else the CPU build (a local CPU wheel
# when pip's find-links has one, its dependencies from PyPI; else PyTorch's CPU index) -- an
# unpinned torch from PyPI is a multi-GB CUDA build that a CPU machine does not need.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=".venv/bin/python -m pip --disable-pip-version-check -q"
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    $PIP install "torch>=2.11"
  elif $PIP install "torch==2.13.0+cpu" 2>/dev/null; then
    :
  else
    $PIP install "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
  fi
fi
$PIP install -e ".[test,eval]"
