#!/usr/bin/env bash
# Creates .venv with ampdiag and everything its tests need (idempotent; safe to re-run).
# torch is installed first and pinned to 2.13.0, the CPU build that pip finds on this
# project's machines; the project's range (torch>=2.4,<3) then installs nothing more.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/pip install -q "torch==2.13.0"
.venv/bin/pip install -q -e ".[dev,hta,frameworks]"
# The browser test drives Debian's chromium through playwright (no browser download).
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium) \
      >/tmp/ampdiag-apt.log 2>&1 || echo "warning: chromium not installed (see /tmp/ampdiag-apt.log); browser tests will skip"
  else
    echo "warning: chromium missing and not root; browser tests will skip"
  fi
fi
