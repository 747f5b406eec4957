#!/usr/bin/env bash
# One prepared GPU check (< 8 minutes on one GPU): LoRA and QLoRA on a ~0.5B random-weight Llama at seq 2048.
# Usage: bench/gpu_check/run.sh [--steps N] [--json out.json]; on a machine without CUDA it says so and exits 0.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY="$(command -v python3 || command -v python)"; fi
fi
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec timeout 480 "$PY" bench/gpu_check/gpu_check.py "$@"
