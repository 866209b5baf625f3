#!/usr/bin/env bash
# The test command (README, and what CI runs): sets up .venv, then lint, types and tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
.venv/bin/ruff check ampdiag tests benchmarks scripts notebooks
.venv/bin/ruff format --check ampdiag tests benchmarks scripts
.venv/bin/mypy
# the docs (docs/, mkdocs.yml): a broken link or a page outside the nav fails the build
.venv/bin/python -m mkdocs build --strict -q
.venv/bin/python -m pytest -q -ra "$@"
