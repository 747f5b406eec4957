#!/usr/bin/env bash
# One prepared GPU check (< 8 minutes on one H100): the runner against the Hugging Face Trainer (bf16=True,
# PEFT) on Llama-3.2-1B's and Llama-3.1-8B's architectures (random weights, nothing downloaded), LoRA and QLoRA
# at 1,024 and 4,096 tokens: tokens/s, peak memory and the planner's quote side by side (bench/gpu_check/
# versus_trainer.py); writes the table (--out gpu_table.md) and the runner's rows as a `tunebot calibrate
# import` file (--calibration gpu_check_calibration.csv). bench/gpu_check/gpu_check.py is the older
# calibration-only check (each loss at micro-batch 1), run on its own.
# Usage: bench/gpu_check/run.sh [--budget 450] [--out gpu_table.md] [--calibration FILE] [--cpu-plumbing]
# On a machine without CUDA it says so and exits 0.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY="$(command -v python3 || command -v python)"; fi
fi
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# A lent GPU machine fetches nothing: the wheels bench/gpu_check/wheels.sh fetched here travel as `.whl`
# (carried by the device call) and are installed beside its own packages, before anything imports.
if compgen -G ".whl/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu-check-site \
    .whl/*.whl
  export PYTHONPATH="/tmp/gpu-check-site${PYTHONPATH:+:$PYTHONPATH}"
fi
"$PY" -c "import torch; print(f'torch {torch.__version__}, CUDA {torch.cuda.is_available()}')"
exec timeout 480 "$PY" bench/gpu_check/versus_trainer.py "$@"
