#!/usr/bin/env bash
# The GPU check, for a CUDA machine that reaches no package registry: one command, < 5 minutes.
#
#   bash scripts/device_check.sh --prepare   here, with the registry: downloads the wheels of
#                                            ampdiag's dependencies that such a machine lacks
#                                            (msgspec, isal: native code, so manylinux x86_64
#                                            wheels for CPython 3.10-3.13) into .device-wheels/
#                                            (ignored by git; carried with the working tree)
#   bash scripts/device_check.sh [DEST]      there: DEST defaults to $OUT, else ./device-check
#
# There it uses that machine's own python3 and its torch as they are (PYTHONPATH), installs the
# carried wheels and ampdiag itself with --no-index (no network is ever asked for), runs the
# CUDA-marked tests and `ampdiag demo --device cuda`, records a CUDA memory snapshot, a trace and
# the CUDA autocast policy, and copies at most 8 small files into DEST: device_check.log,
# session.json, report.html, demo.pt.trace.json.gz, snapshot.pickle, autocast_policy.json.
# Without a GPU (the dry run, scripts/device_dryrun.sh) the CUDA steps say so and are skipped.
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS=.device-wheels
PY=${DEVICE_PYTHON:-python3}

if [ "${1:-}" = "--prepare" ]; then
  mkdir -p "$WHEELS"
  for v in 3.10 3.11 3.12 3.13; do
    "$PY" -m pip download -q --no-deps --only-binary=:all: --implementation cp --python-version "$v" \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 -d "$WHEELS" "msgspec>=0.18" "isal>=1.6" || exit 1
  done
  ls -la "$WHEELS"
  exit 0
fi

DEST=${1:-${OUT:-device-check}}
mkdir -p "$DEST"
LOG="$DEST/device_check.log"
: >"$LOG"
log() { echo "[device_check] $*" | tee -a "$LOG"; }
fail() { log "FAILED: $*"; exit 1; }

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version \
  --format=csv 2>&1 | tee -a "$LOG"
# That machine's python3 is itself a venv (the one holding torch): a --system-site-packages venv
# made from it would see the base interpreter's packages, not torch. So its python3 is used as it
# is, and what it lacks goes to a folder of our own on PYTHONPATH.
VPY=$PY
SITE=${DEVICE_SITE:-/tmp/ampdiag-device-site}
mkdir -p "$SITE"
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$VPY" -c "import torch, numpy, matplotlib, markupsafe, tensorboard, pytest" 2>&1 | tee -a "$LOG"
[ "${PIPESTATUS[0]}" = 0 ] || fail "$PY lacks one of torch, numpy, matplotlib, markupsafe, tensorboard, pytest"
missing=$("$VPY" - <<'PYEOF'
import importlib.util
print(" ".join(m for m in ("msgspec", "isal") if importlib.util.find_spec(m) is None))
PYEOF
)
if [ -n "$missing" ]; then
  log "installing carried wheels for: $missing"
  [ -d "$WHEELS" ] || fail "no $WHEELS/: run 'bash scripts/device_check.sh --prepare' first"
  # shellcheck disable=SC2086
  "$VPY" -m pip install -q --no-index --no-deps --find-links "$WHEELS" --no-cache-dir \
    --no-compile --upgrade --target "$SITE" $missing 2>&1 | tee -a "$LOG"
  [ "${PIPESTATUS[0]}" = 0 ] || fail "installing $missing from $WHEELS"
fi
# ampdiag itself: no dependencies, no index, no build isolation (nothing to download); where the
# machine's setuptools cannot build it, the working tree on PYTHONPATH is the same code
"$VPY" -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --no-compile \
  --target "$SITE/ampdiag-pkg" . >>"$LOG" 2>&1 \
  && log "ampdiag installs with no deps and no index (the checks run the working tree)" \
  || log "ampdiag not installed by pip here; imported from the working tree"
"$VPY" -c "import ampdiag, ampdiag.cli, ampdiag.sources.traces, msgspec, isal; print('ampdiag', ampdiag.__version__, 'from', ampdiag.__file__)" \
  2>&1 | tee -a "$LOG"
[ "${PIPESTATUS[0]}" = 0 ] || fail "ampdiag does not import"
"$VPY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'available', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')" \
  2>&1 | tee -a "$LOG"
if ! "$VPY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  log "no CUDA device: the CUDA-marked tests are only collected, the CUDA recordings skipped"
  timeout 120 "$VPY" -m pytest -q -m cuda --collect-only -p no:cacheprovider 2>&1 | tail -5 \
    | tee -a "$LOG"
  [ "${PIPESTATUS[0]}" = 0 ] || fail "collecting the CUDA-marked tests"
  log "done (no GPU)"
  exit 0
fi

log "CUDA-marked tests"
timeout 150 "$VPY" -m pytest -q -m cuda -ra -p no:cacheprovider 2>&1 | tail -30 | tee -a "$LOG"

log "demo on CUDA"
rm -rf reports/demo-cuda
timeout 90 "$VPY" -m ampdiag demo --device cuda --out reports/demo-cuda 2>&1 | tail -20 | tee -a "$LOG"
cp reports/demo-cuda/session.json "$DEST/session.json" 2>/dev/null
cp reports/demo-cuda/report.html "$DEST/report.html" 2>/dev/null
trace=$(ls -t reports/demo-cuda/trace/*.pt.trace.json* 2>/dev/null | head -1)
[ -n "$trace" ] && cp "$trace" "$DEST/demo.pt.trace.json.gz"

log "CUDA memory snapshot and autocast policy"
timeout 60 "$VPY" - "$DEST" <<'EOF' 2>&1 | tee -a "$LOG"
import json, pickle, sys
import torch
from ampdiag.compat.memory import cuda_snapshot, start_cuda_history, stop_cuda_history
dest = sys.argv[1]
assert start_cuda_history(20000), "no CUDA allocator history in this torch"
model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda()
opt = torch.optim.AdamW(model.parameters())
for _ in range(3):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(torch.randn(64, 512, device="cuda")).float().square().mean()
    loss.backward(); opt.step(); opt.zero_grad()
snap = cuda_snapshot()
stop_cuda_history()
with open(f"{dest}/snapshot.pickle", "wb") as fh:
    pickle.dump(snap, fh)
policy = {}
x = torch.randn(8, 8, device="cuda")
with torch.autocast("cuda", dtype=torch.float16):
    for name, fn in {"mm": lambda: x @ x, "softmax": lambda: x.softmax(-1), "add": lambda: x + x,
                     "layer_norm": lambda: torch.nn.functional.layer_norm(x, (8,)),
                     "exp": lambda: x.exp(), "sum": lambda: x.sum()}.items():
        policy[name] = str(fn().dtype)
json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(0),
           "capability": list(torch.cuda.get_device_capability(0)), "fp16_autocast": policy},
          open(f"{dest}/autocast_policy.json", "w"), indent=1)
print("snapshot + policy written", policy)
EOF
ls -la "$DEST" | tee -a "$LOG"
log "done"
