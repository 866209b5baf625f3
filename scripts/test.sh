#!/usr/bin/env bash
# The test command (README, and what CI runs): sets up .venv, then lint, types and tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
.venv/bin/ruff check ampdiag tests benchmarks scripts notebooks
.venv/bin/ruff format --check ampdiag tests benchmarks scripts
.venv/bin/mypy
.venv/bin/python -m pytest -q -ra "$@"
