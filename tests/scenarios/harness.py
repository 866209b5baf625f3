"""The scenario corpus's harness: faults with measured truth, and how a diagnosis is scored.

A `Scenario` trains a small model a few steps on the CPU under ``ampdiag.diagnose()`` while
measuring its own truth *without ampdiag* (it counts the zero gradients itself against a
higher-precision reference, records the step and module where it injected a NaN, ...). Its
``run(out)`` returns the Session and a `Truth`: the findings that must appear (`Expect`, with
the module, step and numbers they must name, each number with a tolerance), the ids that must
not, and the raw measurements (for the scorecard and for debugging).

`score` compares a Session with a Truth, per finding id:

* true positive (TP): an expected id is present and one of its findings names the expected
  module, step and evidence numbers;
* false negative (FN): an expected id is absent, or present but wrong in a detail (the reason
  says which);
* false positive (FP): a forbidden id is present;
* true negative (TN): a forbidden id is absent (the silence a healthy run must keep).

Ids neither expected nor forbidden are not scored. ``Session.all_findings()`` is used, so a
finding merged into a recommendation (say ``fp16-grad-underflow`` under ``prefer-bf16``)
counts.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import ampdiag
from ampdiag.session import Finding, Session
from tests.conftest import QUIET

#: Findings about numerics (range, NaN, scaler behavior): silent on a healthy run.
NUMERICS_IDS = frozenset(
    {
        "fp16-grad-underflow",
        "loss-scale-collapse",
        "skipped-steps",
        "activation-overflow",
        "nonfinite-origin",
        "diverged",
        "stalled",
    }
)
#: Findings about misuse of the AMP API: silent on a correct run.
MISUSE_IDS = frozenset(
    {
        "grad-scaler-missing",
        "grad-scaler-disabled",
        "clip-before-unscale",
        "scaler-step-bypassed",
        "low-precision-params",
        "low-precision-inactive",
        "grad-accumulation-broken",
        "accumulation-loss-not-averaged",
        "grads-not-zeroed",
        "grad-scaler-config",
    }
)
#: Recommendations that only follow from numerics or misuse findings. (``prefer-bf16`` and its
#: siblings also follow from the measured precision A/B -- BF16 is much faster than FP16 on a
#: CPU -- so healthy runs check them with `measured_precision_advice` instead.)
ADVICE_IDS = frozenset({"tune-grad-scaler"})
#: The precision advice that may rest on the A/B alone.
PRECISION_ADVICE_IDS = frozenset({"prefer-bf16", "prefer-fp32", "prefer-fp16"})
#: What a healthy control forbids.
HEALTHY_FORBID = NUMERICS_IDS | MISUSE_IDS | ADVICE_IDS


@dataclass(frozen=True)
class Expect:
    """A finding that must appear.

    Attributes:
        id: The finding id.
        module: The module it must name (``evidence["module"]``), if it names one.
        step: The step it must name (``evidence["step"]``, else ``evidence["first_step"]``).
        evidence: ``{key: (value, tolerance)}``: ``abs(evidence[key] - value) <= tolerance``
            for numbers; for a dict of numbers, each of its keys must be in the evidence's
            dict within the tolerance; equality for anything else (the tolerance is ignored).
        severities: The severities it may have (empty: any). A timing finding that must be
            a claim, not an uncertain one, gives ``ACTIONABLE``.
    """

    id: str
    module: str | None = None
    step: int | None = None
    evidence: dict[str, tuple[Any, float]] = field(default_factory=dict)
    severities: frozenset[str] = frozenset()


#: Severities of a claim (an ``info`` finding is a remark, or an uncertain measurement).
ACTIONABLE = frozenset({"low", "medium", "high"})


@dataclass
class Truth:
    """What a scenario measured itself, and what the diagnosis must therefore say.

    Attributes:
        expect: Findings that must appear.
        forbid: Finding ids that must not appear (added to the scenario's own ``forbid``).
        measured: The raw measurements the expectations were made from (for reading).
        checks: ``{id: check(session) -> reason or None}``: claims that `Expect` cannot state
            (say "this precision, or a finding marked uncertain"); scored like an expectation
            of that id (TP when the check returns None, else FN with its reason).
    """

    expect: list[Expect] = field(default_factory=list)
    forbid: set[str] = field(default_factory=set)
    measured: dict[str, Any] = field(default_factory=dict)
    checks: dict[str, Callable[[Session], str | None]] = field(default_factory=dict)


@dataclass(frozen=True)
class Scenario:
    """One fault (or a healthy control) with its truth.

    Attributes:
        name: Short kebab-case name (the module is ``sc_<name with _>.py``).
        description: What is wrong in this run, in one or two sentences.
        run: ``run(out) -> (session, truth)``: trains under ``ampdiag.diagnose(out=out)`` and
            measures the truth independently.
        forbid: Finding ids that must not appear whatever the run measured.
        status: The session status the run must end with ("error" where the fault is an
            exception the user's block raised).
    """

    name: str
    description: str
    run: Callable[[Path], tuple[Session, Truth]]
    forbid: frozenset[str] = frozenset()
    status: str = "ok"


@dataclass
class IdScore:
    """TP/FN/FP/TN of one finding id in one scenario, with the reasons for misses."""

    tp: int = 0
    fn: int = 0
    fp: int = 0
    tn: int = 0
    reasons: list[str] = field(default_factory=list)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def mismatch(finding: Finding, expect: Expect) -> str | None:
    """Why ``finding`` does not satisfy ``expect`` (None when it does)."""
    ev = finding.evidence
    if expect.severities and finding.severity not in expect.severities:
        return f"severity {finding.severity!r} not in {sorted(expect.severities)}"
    if expect.module is not None and ev.get("module") != expect.module:
        return f"module {ev.get('module')!r} != {expect.module!r}"
    if expect.step is not None:
        step = ev.get("step", ev.get("first_step"))
        if step != expect.step:
            return f"step {step!r} != {expect.step!r}"
    for key, (value, tol) in expect.evidence.items():
        if key not in ev:
            return f"evidence[{key!r}] missing"
        got, want = _number(ev[key]), _number(value)
        if isinstance(value, dict) and isinstance(ev[key], dict):
            for sub, v in value.items():
                g = _number(ev[key].get(sub))
                if g is None or not (math.isfinite(g) and abs(g - float(v)) <= tol):
                    return (
                        f"evidence[{key!r}][{sub!r}] = {ev[key].get(sub)!r}, want {v!r} ± {tol:g}"
                    )
        elif want is not None and got is not None:
            if not (math.isfinite(got) and abs(got - want) <= tol):
                return f"evidence[{key!r}] = {ev[key]!r}, want {value!r} ± {tol:g}"
        elif ev[key] != value:
            return f"evidence[{key!r}] = {ev[key]!r}, want {value!r}"
    return None


def score(session: Session, scenario: Scenario, truth: Truth) -> dict[str, IdScore]:
    """Per finding id, TP/FN/FP of ``session`` against the scenario's truth."""
    found: dict[str, list[Finding]] = {}
    for f in session.all_findings():
        found.setdefault(f.id, []).append(f)
    out: dict[str, IdScore] = {}
    for exp in truth.expect:
        s = out.setdefault(exp.id, IdScore())
        candidates = found.get(exp.id, [])
        if not candidates:
            s.fn += 1
            s.reasons.append(f"{exp.id}: absent")
            continue
        why = [mismatch(f, exp) for f in candidates]
        if any(w is None for w in why):
            s.tp += 1
        else:
            s.fn += 1
            s.reasons.append(f"{exp.id}: {why[0]}")
    for fid, check in truth.checks.items():
        s = out.setdefault(fid, IdScore())
        why_not = check(session)
        if why_not is None:
            s.tp += 1
        else:
            s.fn += 1
            s.reasons.append(f"{fid}: {why_not}")
    for fid in sorted(set(scenario.forbid) | truth.forbid):
        s = out.setdefault(fid, IdScore())
        if fid in found:
            s.fp += 1
            s.reasons.append(f"{fid}: present but forbidden ({found[fid][0].title})")
        else:
            s.tn += 1
    return out


def measured_precision_advice(run_precision: str) -> Callable[[Session], str | None]:
    """A check for healthy runs: precision advice only from the A/B, never from numerics.

    Any ``prefer-*`` must rest on the precision A/B (``measured``) or on the speed probe's
    confirmed ``autocast-slower`` (beside it or merged into it), explain nothing but
    ``autocast-slower``, and never name the run's own precision.
    """

    def check(session: Session) -> str | None:
        for f in session.findings:
            if f.id not in PRECISION_ADVICE_IDS:
                continue
            slower = [g for g in session.all_findings() if g.id == "autocast-slower"]
            if f.evidence.get("measured") is not True and not any(
                g.severity != "info" for g in slower
            ):
                return f"{f.id} neither from the A/B nor from a measured slowdown: {f.title}"
            if set(f.evidence.get("explains", [])) - {"autocast-slower"}:
                return f"{f.id} explains {f.evidence['explains']} on a healthy run"
            if f.id == f"prefer-{run_precision}":
                return f"{f.id} for a {run_precision} run"
        return None

    return check


def premise(holds: bool, what: str, measured: Any) -> None:
    """Skips the scenario, with the measured figures, where its premise fails on this machine.

    A scenario whose fault rests on the CPU (FP16 slow where it has no native FP16 kernels) or
    on timing (a pass over a budget that grows with a loaded machine's slower block) cannot be
    built on every machine: there it is skipped, saying why, never failed.
    """
    if not holds:
        import pytest

        pytest.skip(f"the premise fails on this machine: {what}: {measured}")


def diagnose(out: Path, **settings: Any) -> ampdiag.Diagnosis:
    """``ampdiag.diagnose(out=out)`` with the quiet outputs (`QUIET`) and ``settings``."""
    return ampdiag.diagnose(out=out, **(QUIET | settings))


@contextmanager
def seeded(seed: int = 0) -> Iterator[None]:
    """Seeds torch's RNG for a scenario and restores the previous state afterwards."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


@contextmanager
def one_thread() -> Iterator[None]:
    """One intra-op thread: on a shared machine a second thread waits at every GEMM's barrier
    for a core another process holds (1.5 ms passes measured 150 ms); restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def session_of(d: ampdiag.Diagnosis) -> Session:
    """The Session a finished diagnose() block wrote."""
    assert d.session is not None, "diagnose() wrote no session"
    return d.session


def all_scenarios() -> list[Scenario]:
    """Every ``SCENARIO`` (or ``SCENARIOS`` list) of the ``sc_*.py`` modules here, by name."""
    import importlib

    here = Path(__file__).parent
    found: list[Scenario] = []
    for path in sorted(here.glob("sc_*.py")):
        module = importlib.import_module(f"tests.scenarios.{path.stem}")
        if hasattr(module, "SCENARIO"):
            found.append(module.SCENARIO)
        found += getattr(module, "SCENARIOS", [])
    return sorted(found, key=lambda s: s.name)


def fp16_lost(reference: torch.Tensor, held: torch.Tensor | None = None) -> tuple[int, int]:
    """(lost, nonzero): values nonzero in ``reference`` that FP16 holds as zero or subnormal.

    ``reference`` is a higher-precision gradient (already multiplied by the loss scale the run
    used); ``held`` the value the FP16 run held for it (default: ``reference`` cast to FP16).
    """
    ref = reference.detach().double()
    h = (reference.detach().half() if held is None else held.detach()).double()
    nonzero = ref != 0
    lost = nonzero & (h.abs() < 2.0**-14)
    return int(lost.sum()), int(nonzero.sum())


class _Casts(TorchDispatchMode):
    """Records the parameters (by storage) that an ``aten._to_copy`` casts to float16."""

    def __init__(self, params: dict[int, str]) -> None:
        super().__init__()
        self.params = params
        self.cast: set[str] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and kwargs.get("dtype") == torch.float16:
            name = self.params.get(args[0].data_ptr())
            if name is not None:
                self.cast.add(name)
        return func(*args, **kwargs)


def fp16_cast_params(model: torch.nn.Module, *args: Any) -> set[str]:
    """The names of the parameters FP16 autocast casts in a forward of a copy of ``model``.

    Their gradients are FP16's; the others' (an embedding's, a norm's: FP32-policy ops) are
    computed in FP32, and no FP16 range applies to them. Seen by a dispatch mode of its own
    (every cast to float16 of a parameter's storage), not by reading the autograd graph.
    """
    twin = copy.deepcopy(model)
    params = {p.data_ptr(): n for n, p in twin.named_parameters()}
    with torch.autocast("cpu", dtype=torch.float16), _Casts(params) as mode:
        twin(*args)
    return mode.cast


def combined(scores: Iterable[dict[str, IdScore]]) -> dict[str, IdScore]:
    """Sums per-id scores over scenarios."""
    total: dict[str, IdScore] = {}
    for per in scores:
        for fid, s in per.items():
            t = total.setdefault(fid, IdScore())
            t.tp += s.tp
            t.fn += s.fn
            t.fp += s.fp
            t.tn += s.tn
            t.reasons += s.reasons
    return total


def needed_scale_log2(
    gradients: Iterable[torch.Tensor], target: float = 0.01, search: range = range(0, 128)
) -> int | None:
    """The smallest k whose scale 2^k leaves under ``target`` of the nonzero values of
    ``gradients`` (true, unscaled, higher precision) zero or subnormal in FP16, with none
    overflowing FP16; None when no k in ``search`` does. Counted by casting to FP16."""
    values = torch.cat([g.detach().double().reshape(-1) for g in gradients])
    values = values[values != 0]
    if values.numel() == 0:
        return None
    for k in search:
        held = (values * 2.0**k).half()
        if bool(torch.isinf(held).any()):
            return None  # larger scales overflow too
        if float((held.double().abs() < 2.0**-14).double().mean()) < target:
            return k
    return None
