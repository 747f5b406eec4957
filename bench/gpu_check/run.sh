#!/usr/bin/env bash
# One prepared GPU check (< 8 minutes on one H100): the runner against the Hugging Face Trainer (bf16=True,
# PEFT) on Llama-3.2-1B's and Llama-3.1-8B's architectures (random weights, nothing downloaded), LoRA and QLoRA
# at 1,024 and 4,096 tokens: tokens/s, peak memory and the planner's quote side by side (bench/gpu_check/
# versus_trainer.py); writes the table (--out gpu_table.md) and the runner's rows as a `tunebot calibrate
# import` file (--calibration gpu_check_calibration.csv). bench/gpu_check/gpu_check.py is the older
# calibration-only check (each loss at micro-batch 1), run on its own.
# Usage: bench/gpu_check/run.sh [--budget 450] [--out gpu_table.md] [--calibration FILE]
# On a machine without CUDA it says so and exits 0.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY="$(command -v python3 || command -v python)"; fi
fi
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec timeout 480 "$PY" bench/gpu_check/versus_trainer.py "$@"
