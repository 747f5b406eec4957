#!/usr/bin/env bash
# The wheels the GPU check needs that a lent GPU machine's image lacks (it has torch, transformers, peft,
# accelerate, triton and the rest; nothing can be fetched there): pydantic (the runner's contract), bitsandbytes
# (QLoRA, both stacks) and liger-kernel (the runner's optional kernels), for its Python (3.12, x86-64).
# Run here, where pip reaches the registry; then carry `.whl` in the device call, and run.sh installs them
# there before anything imports (bench/gpu_check/README.md has the whole call). About 45 MB.
# Usage: bench/gpu_check/wheels.sh [PYTHON_VERSION]   (default 3.12, the device image's)
set -euo pipefail
cd "$(dirname "$0")/../.."
PYVER="${1:-3.12}"
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY="$(command -v python3)"; fi
fi
rm -rf .whl && mkdir -p .whl  # /.whl/ is in .gitignore: it travels only when a call carries it
PLATFORMS=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
  manylinux2014_x86_64 manylinux1_x86_64; do
  PLATFORMS+=(--platform "$p")
done
# pydantic pins its core exactly: the pair is fetched together; the others as tested here
for spec in "pydantic==2.14.4" "pydantic-core==2.50.5" "annotated-types>=0.6" "typing-inspection>=0.4" \
  "bitsandbytes==0.50.2" "liger-kernel==0.8.5"; do
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
    "${PLATFORMS[@]}" -d .whl "$spec"
done
ls -l .whl
du -sh .whl
