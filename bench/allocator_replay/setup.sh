#!/usr/bin/env bash
# Installs torchtune 0.1.1 and the torchao 0.1 it pins (PyPI) into bench/allocator_replay/.deps, next to
# the project's own torch (no torch download: --no-deps). Only trace.py's `recipe` and `profile` modes need it.
set -euo pipefail
cd "$(dirname "$0")"
PY="${PYTHON:-../../.venv/bin/python}"
"$PY" -m pip install -q --no-deps --target .deps torchtune==0.1.1 torchao==0.1 omegaconf==2.3.0 \
  antlr4-python3-runtime==4.9.3 "setuptools<70" sentencepiece tiktoken regex
# torchtune 0.1.1 imports `datasets` at import time; nothing here loads a dataset.
mkdir -p .deps/_stubs && echo 'def load_dataset(*a, **k): raise RuntimeError("no datasets in the bench")' > .deps/_stubs/datasets.py
echo "ok: $(ls .deps | grep -c dist-info) packages in bench/allocator_replay/.deps"
