"""A CPU run's fixes are CPU code: FP16 autocast on the CPU without a GradScaler, loss x 1e-6.

The loop (`tests.scenarios.underflow`) trains on the CPU under ``torch.autocast("cpu",
dtype=torch.float16)`` with no GradScaler, so most of the gradient entering FP16 underflows
(counted by the loop against its FP32 replay). Every fix ampdiag gives it -- the GradScaler,
the loss scale, the precision advice -- is code the user pastes into this loop: it must name
the device the loop ran on (the parameters' device, read by the loop), never CUDA.

What must hold: ``grad-scaler-missing`` with the measured underflow, whose fix builds
``GradScaler("cpu")`` and enters ``torch.autocast('cpu', ...)``; every device named in any
fix's code (``autocast(...)``, ``GradScaler(...)``, ``.to(...)``) is the CPU, in at least two
findings.
"""

from __future__ import annotations

import re
from pathlib import Path

from ampdiag.session import Session
from tests.scenarios.harness import Expect, Scenario, Truth
from tests.scenarios.underflow import run_underflow, truth

#: Device code in a fix: the device type it names.
DEVICE_CODE = re.compile(
    r"autocast\(\s*(?:device_type=)?['\"](\w+)['\"]|GradScaler\(\s*['\"](\w+)['\"]"
    r"|\.to\(\s*['\"](\w+)['\"]"
)


def devices_in_fixes(session: Session) -> dict[str, set[str]]:
    """Per finding id, the device types its fix's code names."""
    out: dict[str, set[str]] = {}
    for f in session.all_findings():
        named = {next(g for g in m.groups() if g) for m in DEVICE_CODE.finditer(f.fix or "")}
        if named:
            out.setdefault(f.id, set()).update(named)
    return out


def run(out: Path) -> tuple[Session, Truth]:
    session, measured = run_underflow(out, 1e-6, None)
    assert measured["boundary_lost_fraction"] > 0.5, measured  # the fault is real
    device = "cpu"  # models.train enters torch.autocast("cpu", ...) on CPU tensors
    frac = measured["underflow_fraction"]

    def fixes_name_the_device(s: Session) -> str | None:
        named = devices_in_fixes(s)
        wrong = {fid: d for fid, d in named.items() if d != {device}}
        if wrong:
            return f"fixes name another device than {device!r}: {wrong}"
        if len(named) < 2:
            return f"only {sorted(named)} carry device code"
        missing = next(f for f in s.all_findings() if f.id == "grad-scaler-missing")
        code = missing.fix or ""
        if f"GradScaler({device!r}" not in code or f"autocast(device_type={device!r}" not in code:
            return f"grad-scaler-missing's fix is not {device} code: {code!r}"
        return None

    t = truth(
        measured, Expect("grad-scaler-missing", evidence={"underflow_fraction": (frac, 0.03)})
    )
    t.checks["fix-device-cpu"] = fixes_name_the_device
    t.measured["device"] = device
    return session, t


SCENARIO = Scenario(
    "device-cpu-advice",
    "FP16 autocast on the CPU without a GradScaler: every fix is torch.autocast('cpu', ...) code.",
    run,
)
