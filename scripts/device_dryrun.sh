#!/usr/bin/env bash
# The GPU check's dry run, here: scripts/device_check.sh against a simulated CUDA machine.
#
#   bash scripts/device_dryrun.sh [PYTHON]      (PYTHON: an environment with ampdiag's deps,
#                                                default /work/main/.venv/bin/python, else python3)
#
# The simulated machine is a fresh venv whose python3 sees the packages of PYTHON's environment
# except ampdiag and its own other dependencies (msgspec, isal): torch, numpy, markupsafe,
# matplotlib, tensorboard, pytest are there, as on the H200 machine. It is put first on PATH;
# `device_check.sh --prepare` fills .device-wheels/ (with the registry), then
# `device_check.sh` runs with PIP_NO_INDEX=1 and every proxy pointed at a closed port, so any
# install step that reached for the network fails. Passes when: ampdiag imports, the
# CUDA-marked tests are collected, and the check ends "done (no GPU)".
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=${1:-/work/main/.venv/bin/python}
[ -x "$SRC" ] || SRC=python3
SIM=$(mktemp -d /tmp/ampdiag-sim-XXXX)
trap 'rm -rf "$SIM"' EXIT
"$SRC" -m venv --without-pip "$SIM/machine"
SITE=$("$SIM/machine/bin/python3" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
"$SRC" - "$SITE" <<'PYEOF'
import os, sys, sysconfig
dst = sys.argv[1]
src = sysconfig.get_paths()["purelib"]
hidden = ("msgspec", "isal", "ampdiag", "__editable__", "_ampdiag")
for name in os.listdir(src):
    if name.lower().startswith(hidden) or "ampdiag" in name.lower():
        continue
    os.symlink(os.path.join(src, name), os.path.join(dst, name))
PYEOF
export PATH="$SIM/machine/bin:$PATH"
"$SIM/machine/bin/python3" -c "import torch, numpy, markupsafe, matplotlib, tensorboard, pytest, pip"
if "$SIM/machine/bin/python3" -c "import msgspec" 2>/dev/null \
  || "$SIM/machine/bin/python3" -c "import isal" 2>/dev/null; then
  echo "dry run: the simulated machine must lack msgspec and isal" >&2; exit 1
fi
bash scripts/device_check.sh --prepare
DEST="$SIM/out"
env -u PYTHONPATH PIP_NO_INDEX=1 PIP_FIND_LINKS= http_proxy=http://127.0.0.1:9 \
  https_proxy=http://127.0.0.1:9 HTTP_PROXY=http://127.0.0.1:9 HTTPS_PROXY=http://127.0.0.1:9 \
  DEVICE_SITE="$SIM/site" bash scripts/device_check.sh "$DEST"
grep -q "^ampdiag " "$DEST/device_check.log"
grep -Eq "[0-9]+ tests? collected|[0-9]+/[0-9]+ tests collected" "$DEST/device_check.log"
grep -q "done (no GPU)" "$DEST/device_check.log"
echo "dry run passed: $(grep -E 'collected' "$DEST/device_check.log" | tail -1)"
