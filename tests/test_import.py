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


def test_diagnose_does_not_initialize_cuda() -> None:
    code = (
        "import torch, ampdiag\n"
        "d = ampdiag.diagnose(profile=False, report=False)\n"
        "print(torch.cuda.is_initialized())\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True
    )
    assert r.stdout.strip() == "False"


def test_the_public_surface_is_exported_and_import_stays_light() -> None:
    code = (
        "import sys, ampdiag\n"
        "names = ['InputError', 'OutputError', 'DiagnoseConfig', 'analyze', 'load']\n"
        "got = [getattr(ampdiag, n) for n in names]\n"
        "print('torch' in sys.modules)\n"
        "print(ampdiag.analyze.__module__, ampdiag.OutputError.__mro__[1].__name__)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True
    )
    assert r.stdout.split() == ["False", "ampdiag.analysis", "InputError"]
    import ampdiag

    assert ampdiag.Collector.__name__ == "Collector" and ampdiag.RunContext.__name__ == "RunContext"
    assert set(ampdiag.__all__) >= {"Collector", "DiagnoseConfig", "analyze", "InputError"}


def test_integrations_import_their_framework_only_when_imported() -> None:
    code = (
        "import sys, ampdiag, ampdiag.integrations\n"
        "d = ampdiag.diagnose(out='unused', steps=(2, 4))\n"
        "print([m for m in ('transformers', 'lightning') if m in sys.modules])\n"
        "import ampdiag.integrations.lightning\n"
        "print('lightning' in sys.modules)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True
    )
    assert r.stdout.split("\n")[:2] == ["[]", "True"]
