#!/usr/bin/env bash
# Install everything the tests need, then run the whole suite (slow end-to-end tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# Bytecode caches written (some machines set PYTHONDONTWRITEBYTECODE): the suite starts some 300 Python
# processes (CLI commands, serve, runners, fake hosts), and each would compile the project's modules again.
unset PYTHONDONTWRITEBYTECODE
# One worker per core, a test file per worker at a time (a file's module fixtures and its order stay whole),
# in collection order: files with slow tests first (tests/conftest.py), not the most numerous first.
# Then the tests marked `alone`, one at a time with nothing else of the suite on the cores: they hold a quote
# against the wall clock of the runs it priced, which the other worker's runners would slow by a share no
# quote made before they started can know (a sweep spent 2.1x its quote beside them, 1.3x alone).
# Exit status 5 is "no test selected" (a path with none of one kind): not a failure.
status=0
.venv/bin/python -m pytest -q -p no:cacheprovider -n auto --dist loadfile --no-loadscope-reorder \
  -m "not alone" "$@" || { rc=$?; [ "$rc" -eq 5 ] || status=$rc; }
.venv/bin/python -m pytest -q -p no:cacheprovider -m alone "$@" || { rc=$?; [ "$rc" -eq 5 ] || status=$rc; }
exit "$status"
