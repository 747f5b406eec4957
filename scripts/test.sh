#!/usr/bin/env bash
# Install everything the tests need, then run the whole suite (slow end-to-end tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# One worker per core, a test file per worker at a time (a file's module fixtures and its order stay whole),
# in collection order: files with slow tests first (tests/conftest.py), not the most numerous first.
.venv/bin/python -m pytest -q -p no:cacheprovider -n auto --dist loadfile --no-loadscope-reorder "$@"
