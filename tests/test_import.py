import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_import_is_light() -> None:
    code = (
        "import sys, ampdiag\n"
        "heavy = [m for m in ('torch', 'matplotlib', 'pandas', 'hta', 'tensorboard', 'jinja2')"
        " if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True
    )
    assert r.stdout.strip() == ""


def test_diagnose_does_not_initialise_cuda() -> None:
    code = (
        "import torch, ampdiag\n"
        "d = ampdiag.diagnose(profile=False, report=False)\n"
        "print(torch.cuda.is_initialized())\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True
    )
    assert r.stdout.strip() == "False"
