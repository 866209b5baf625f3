#!/usr/bin/env bash
# The GPU check, for a CUDA machine: one command, under 5 minutes.
#   bash scripts/device_check.sh [DEST]      (DEST defaults to $OUT, else ./device-check)
# Installs what it needs (a venv with ampdiag and the CUDA build of torch the machine offers),
# runs the CUDA-marked tests and `ampdiag demo` on CUDA, and copies small recordings into DEST:
# session.json, the trace, report.html, and (when the memory collector wrote them) the memory
# snapshot as JSON (at most 8 files: the device tool brings back 8), to be committed under tests/data/cuda/ as fixtures for CPU tests.
set -uo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-${OUT:-device-check}}
mkdir -p "$DEST"
log() { echo "[device_check] $*" | tee -a "$DEST/device_check.log"; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee -a "$DEST/device_check.log"
if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
# A CUDA machine may already have a CUDA torch system-wide; otherwise pip's default is a CUDA build.
.venv/bin/python -c "import torch; assert torch.cuda.is_available()" 2>/dev/null \
  || .venv/bin/pip install -q "torch>=2.4,<3" 2>&1 | tail -2
.venv/bin/pip install -q -e ".[dev]" 2>&1 | tail -2
.venv/bin/python -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')" | tee -a "$DEST/device_check.log"

log "CUDA-marked tests"
timeout 150 .venv/bin/python -m pytest -q -m cuda -ra 2>&1 | tail -30 | tee -a "$DEST/device_check.log"

log "demo on CUDA"
rm -rf reports/demo-cuda
timeout 120 .venv/bin/python -m ampdiag demo --device cuda --out reports/demo-cuda 2>&1 | tail -20 | tee -a "$DEST/device_check.log"
cp reports/demo-cuda/session.json "$DEST/session.json" 2>/dev/null
cp reports/demo-cuda/report.html "$DEST/report.html" 2>/dev/null
trace=$(ls -t reports/demo-cuda/trace/*.pt.trace.json.gz 2>/dev/null | head -1)
[ -n "$trace" ] && cp "$trace" "$DEST/demo.pt.trace.json.gz"
for f in reports/demo-cuda/memory/*.json; do [ -f "$f" ] && cp "$f" "$DEST/"; done
ls -la "$DEST" | tee -a "$DEST/device_check.log"
