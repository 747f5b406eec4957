#!/usr/bin/env bash
# Install everything the tests need, then run the whole suite (slow end-to-end tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# One worker per core (pytest-xdist; TUNEBOT_TEST_WORKERS=N to choose, 0 for one process); tests steal work
# from each other so the long end-to-end tests do not all land at the end of one worker.
.venv/bin/python -m pytest -q -p no:cacheprovider -n "${TUNEBOT_TEST_WORKERS:-auto}" --dist worksteal "$@"
