#!/usr/bin/env bash
# Install tunebot with the runner and dev extras into .venv. On a machine without a GPU the CPU
# build of torch goes in first, so that no multi-GB CUDA build is pulled by a plain requirement.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# torch is looked up and pinned by its installed metadata, never imported here: importing it before numpy is
# installed (numpy comes with the extras below) prints "Failed to initialize NumPy" on every fresh install.
if ! .venv/bin/python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)"; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    .venv/bin/pip install -q "torch>=2.3"
  else
    .venv/bin/pip install -q torch==2.13.0 || .venv/bin/pip install -q torch --index-url https://download.pytorch.org/whl/cpu
  fi
fi
# Pin the torch that is now installed, so that resolving the extras never swaps it for another build.
.venv/bin/python -c "import importlib.metadata as m; print('torch==' + m.version('torch'))" > .venv/torch-constraint.txt
.venv/bin/pip install -q -c .venv/torch-constraint.txt -e ".[runner,dev]"
