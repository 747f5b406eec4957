#!/usr/bin/env bash
# Install everything the tests need, then run the whole suite (slow end-to-end tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# Two workers: the end-to-end tests spend much of their time waiting on runner processes and servers, so
# two of them overlap well on CI's 2 cores (17.8 min in one process here, see README).
.venv/bin/python -m pytest -q -p no:cacheprovider -n 2 --dist worksteal "$@"
