#!/usr/bin/env bash
# One prepared GPU check (< 8 minutes on one GPU): LoRA and QLoRA on Llama-3.2-1B's architecture (random weights)
# at sequence lengths 1024 and 4096; prints measured vs planned and writes the `tunebot calibrate import` file.
# Usage: bench/gpu_check/run.sh [--steps N] [--seq-lens 1024,4096] [--out gpu_check_calibration.csv]
# On a machine without CUDA it says so and exits 0.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY="$(command -v python3 || command -v python)"; fi
fi
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec timeout 480 "$PY" bench/gpu_check/gpu_check.py "$@"
