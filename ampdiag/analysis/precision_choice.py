"""Which precision the A/B measurements recommend: pure arithmetic on its rows (no torch).

`ampdiag.compare` measures FP32, BF16, FP16 (+ loss scale) and TF32 on the user's model and
batch; this module turns those rows into one choice, the same way wherever it is needed: in
`compare` itself (its ``recommended``) and in the analysis (the precision advice and
``autocast-slower``), so that no two places can decide differently.

The choice is **the precision in use, unless a safe one is measured clearly faster**
(`SAFETY`; `SWITCH_SPEEDUP`):

- *safe*: nothing non-finite in the loss or the gradients; the loss within 1% of FP32's; at most
  1% of FP32's nonzero gradient values lost to zero (FP16 measured with the loss scale a
  GradScaler starts at, 2^16); the median gradient SQNR against FP32 at least 20 dB (noise
  power at most 1% of the signal's). FP32 is the reference and always safe.
- *in use* (the incumbent): the run's own precision when it is safe (``keep``; FP32 for
  ``ampdiag.compare`` on its own, and when the run's precision is not safe).
- *clearly faster*: the lower end of the speed-up interval over the incumbent is at least
  `SWITCH_SPEEDUP` (1.10x): even its second-least pass beats the incumbent's least pass by
  that (`estimate`, `TIMING`: load only adds time; a median of passes made a 1.2x loss 5.2x
  when two of three 1 ms FP16 passes took a 4 ms time slice). A decision
  rests on that bound, never on a point estimate: identical runs whose intervals move a
  little keep the same choice, and a precision measured 0.93x as fast is never chosen as a
  "tie". Among several that clear it, the fastest; those it is not measured clearly faster
  than (`SWITCH_SPEEDUP` again, `contenders`) are *tied* with it, and the tie is decided by
  what does not move between identical runs (`tie_order`): a precision the device runs
  emulated (``emulated``: BF16 on a CPU without AVX512_BF16/AMX) loses it, then the one that
  keeps the least activation memory wins, then the simplest -- FP32, TF32 matmuls (one flag),
  BF16 autocast (no scaler), FP16 autocast (needs a GradScaler). Overlapping intervals were
  the old test of a tie: their edge moves with the machine's load (a spread of 0.5% quiet,
  30% busy), so FP32 "faster" and BF16 "tied, less memory" swapped between identical runs.
- ``tied`` lists the precisions the choice was not measured clearly faster than (either
  way): "as fast, within what a switch must clear".
- A precision timed once has no interval: when no row has one, nothing is claimed about speed
  and the choice is the incumbent (``timed`` False).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ampdiag import timing, units
from ampdiag.analysis import device as D
from ampdiag.analysis.compute import computes_in
from ampdiag.analysis.derive import derived, part
from ampdiag.schema import PrecisionChoice
from ampdiag.session import Session
from ampdiag.units import number

#: The numerical-safety criterion (documented in the module docstring).
SAFETY: dict[str, float] = {
    "loss_rel_diff_max": 0.01,
    "grad_underflow_max": 0.01,
    "grad_sqnr_db_median_min": 20.0,
}
#: Simplest first: the order that breaks a tie within the measured spread.
SIMPLICITY = ("fp32", "tf32", "bf16", "fp16")
#: Display names.
NAMES = {"fp32": "FP32", "tf32": "TF32", "bf16": "BF16", "fp16": "FP16"}


#: The run's autocast dtype name -> precision name.
def is_safe(row: Mapping[str, Any]) -> bool | None:
    """Whether a measured precision meets `SAFETY` (None when it failed or was not run)."""
    if row.get("error") or row.get("not_run"):
        return None
    if row.get("nonfinite"):
        return False
    if row.get("precision") == "fp32":
        return True
    loss = number(row.get("loss_rel_diff"), finite=True)
    under = number(row.get("grad_underflow"), finite=True)
    sqnr = number(row.get("grad_sqnr_db_median"), finite=True)
    return (
        (loss is None or loss <= SAFETY["loss_rel_diff_max"])
        and (under is None or under <= SAFETY["grad_underflow_max"])
        and (sqnr is None or sqnr >= SAFETY["grad_sqnr_db_median_min"])
    )


def unsafe_reasons(row: Mapping[str, Any]) -> list[str]:
    """Which part of `SAFETY` a precision fails, in words."""
    out = []
    if row.get("nonfinite"):
        out.append("inf/NaN in the loss or gradients")
    loss = number(row.get("loss_rel_diff"), finite=True)
    if loss is not None and loss > SAFETY["loss_rel_diff_max"]:
        out.append(f"loss {loss:.1%} off FP32's")
    under = number(row.get("grad_underflow"), finite=True)
    if under is not None and under > SAFETY["grad_underflow_max"]:
        out.append(f"{under:.1%} of gradient values lost")
    sqnr = number(row.get("grad_sqnr_db_median"), finite=True)
    if sqnr is not None and sqnr < SAFETY["grad_sqnr_db_median_min"]:
        out.append(f"gradient SQNR {sqnr:.0f} dB")
    return out


#: A precision whose first timed pass is at least this many times the fastest one's least pass
#: is timed in that one round only (`compare.OUT_OF_RACE`): its single pass still clears the
#: `SWITCH_SPEEDUP` a speed claim needs with room for `ONE_PASS_INFLATION`.
ONE_ROUND = 2.0
#: How much slower than its truth one pass of a precision may measure in process CPU time: whole
#: processes whose every pass ran up to ~35% slower under load (the GRU's 1.40x-1.75x, `bench_
#: stability`). The lower end of a precision timed in one round (`one_round`).
ONE_PASS_INFLATION = 1.35


def estimate(row: Mapping[str, Any]) -> timing.Estimate | None:
    """The row's time in ms: its passes' least up to the second least (`timing.least`).

    A precision timed in one round (``one_round``: its first pass was already at least twice
    the fastest one's least, `compare.OUT_OF_RACE`): that pass as the upper end (load only adds
    time) and the pass less `ONE_PASS_INFLATION` as the lower, counted as two samples (the
    pass and its bound), so that a speed claim rests on it: at 2x it still clears 1.10x.
    A row without passes (an older session): its median ± spread; None without an interval.
    """
    times = [v for v in (number(x, finite=True) for x in row.get("times_ms") or []) if v]
    if len(times) == 1 and row.get("one_round"):
        return timing.Estimate(times[0], times[0] / ONE_PASS_INFLATION, times[0], 2)
    if len(times) >= timing.MIN_SAMPLES:
        return timing.least(times)
    t, s = number(row.get("time_ms"), finite=True), number(row.get("time_spread_ms"), finite=True)
    if t is None or s is None:
        return None
    n = row.get("samples")
    samples = n if isinstance(n, int) and n >= timing.MIN_SAMPLES else timing.MIN_SAMPLES
    return timing.Estimate(t, t - s, t + s, samples)


#: A change of precision is chosen only when the lower end of its speed-up interval over the
#: precision in use is at least this: 10% is the least gain worth a change of setup, and a
#: bound (not the median) near it does not move between identical runs on a shared machine.
SWITCH_SPEEDUP = 1.10


#: How the A/B's times are read, in the one sentence every advice resting on them cites.
TIMING = (
    "Each precision's time is the least of its interleaved forward + backward passes (on a "
    "CPU in process CPU time), since another process's load only ever adds time, and a "
    f"precision counts as faster only when even its second-least pass beats the other's least "
    f"by {SWITCH_SPEEDUP:.2f}x."
)


def timing_words(rows: Mapping[str, Mapping[str, Any]]) -> str:
    """`TIMING`, and each precision timed in one round with its single pass's ratio."""
    once = [
        f"{NAMES.get(p, p)} one round: {float(r['one_round']):.1f}x slower than the fastest's "
        f"least pass (timed no more: {ONE_ROUND:g}x or more after one round)"
        for p, r in rows.items()
        if number(r.get("one_round"), finite=True)
    ]
    return " ".join([TIMING, *(f"{w}." for w in once)])


def clears(base: Mapping[str, Any], row: Mapping[str, Any]) -> bool:
    """Whether ``row`` is measured clearly faster than ``base``.

    Its speed-up's lower end (`speedup`) is at least `SWITCH_SPEEDUP`.
    """
    ratio = speedup(base, row)
    return ratio is not None and ratio.get("low", 0.0) >= SWITCH_SPEEDUP


def speedup(base: Mapping[str, Any], row: Mapping[str, Any]) -> dict[str, float] | None:
    """``base`` time / ``row`` time (``median``: of the `estimate` figures) and its range."""
    tb, tr = number(base.get("time_ms"), finite=True), number(row.get("time_ms"), finite=True)
    if not tb or not tr:
        return None
    out = {"median": tb / tr}
    eb, er = estimate(base), estimate(row)
    if eb is not None and er is not None and er.low > 0:
        ratio = timing.quotient(eb, er)
        out["median"], out["low"], out["high"] = ratio.median, ratio.low, ratio.high
    return out


def saving(base: Mapping[str, Any], row: Mapping[str, Any], key: str) -> float | None:
    """The share of ``base``'s memory figure (``saved_bytes``, ``peak_bytes``) ``row`` saves."""
    b, r = number(base.get(key), finite=True), number(row.get(key), finite=True)
    if not b or r is None:
        return None
    return 1.0 - r / b


@dataclass
class Choice:
    """The precision the measurements recommend.

    Attributes:
        precision: The choice.
        tied: Every safe precision the measurement cannot tell from the fastest (the choice
            among them); one element when the choice is certain.
        unsafe: Precisions that failed `SAFETY`, with why.
        timed: Whether the rows carry intervals at all (timed more than once).
        saved_bytes: Activation memory each tied precision saves, by name.
        emulated: The tied precisions the device runs without native kernels.
    """

    precision: str
    tied: list[str] = field(default_factory=list)
    unsafe: dict[str, list[str]] = field(default_factory=dict)
    timed: bool = True
    saved_bytes: dict[str, float] = field(default_factory=dict)
    emulated: list[str] = field(default_factory=list)

    @property
    def uncertain(self) -> bool:
        """Whether the measured spread leaves more than one precision fastest."""
        return len(self.tied) > 1


def contenders(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The rows the fastest of ``rows`` is not measured clearly faster than (itself included).

    The bar is `SWITCH_SPEEDUP` on the lower end of the speed-up, the bar a switch clears:
    a difference under it is noise as far as the choice goes, on a quiet machine and a busy
    one alike.
    """
    fastest = min(rows, key=lambda r: est.median if (est := estimate(r)) else float(r["time_ms"]))
    return [r for r in rows if not clears(r, fastest)]


def tie_order(emulated: Collection[str]) -> Callable[[Mapping[str, Any]], tuple[bool, float, int]]:
    """The sort key that decides a tie from what noise cannot move.

    A precision in ``emulated`` last, then the least activation memory, then the simplest
    (`SIMPLICITY`).
    """

    def key(r: Mapping[str, Any]) -> tuple[bool, float, int]:
        memory = number(r.get("saved_bytes"), finite=True)
        p = str(r["precision"])
        rank = SIMPLICITY.index(p) if p in SIMPLICITY else len(SIMPLICITY)
        return (p in emulated, memory if memory is not None else math.inf, rank)

    return key


def choose(
    rows: Sequence[Mapping[str, Any]],
    keep: str | None = "fp32",
    emulated: Collection[str] = (),
) -> Choice | None:
    """The precision to train in (None when none was timed and safe); see the module docstring.

    ``keep`` is the precision in use (the run's own), kept unless a safe one clears
    `SWITCH_SPEEDUP` over it. ``emulated``: the precisions the device has no native kernels
    for, which lose a tie.
    """
    safe = [r for r in rows if is_safe(r) and number(r.get("time_ms"), finite=True) is not None]
    if not safe:
        return None
    unsafe = {str(r["precision"]): unsafe_reasons(r) for r in rows if is_safe(r) is False}
    names = [str(r["precision"]) for r in safe]
    incumbent = next((r for r in safe if r["precision"] == keep), None) or next(
        (r for r in safe if r["precision"] == "fp32"), None
    )
    if not any(estimate(r) is not None for r in safe):
        first = str(incumbent["precision"]) if incumbent is not None else names[0]
        return Choice(first, [first, *(n for n in names if n != first)], unsafe, timed=False)

    order = tie_order(emulated)
    better = [r for r in safe if incumbent is None or clears(incumbent, r)]
    if incumbent is not None and not better:
        pick = incumbent
    else:
        pick = sorted(contenders(better), key=order)[0]
    alike = [r for r in safe if r is not pick and not clears(pick, r) and not clears(r, pick)]
    tied = [pick, *sorted(alike, key=order)]
    memory = {
        str(r["precision"]): m
        for r in tied
        if (m := number(r.get("saved_bytes"), finite=True)) is not None
    }
    alike_names = [str(r["precision"]) for r in tied]
    slow = [p for p in alike_names if p in emulated]
    return Choice(alike_names[0], alike_names, unsafe, saved_bytes=memory, emulated=slow)


def tie_break(choice: Choice, keep: str | None = "fp32") -> str:
    """Why the choice won among the precisions it was not measured clearly faster than."""
    name = NAMES.get(choice.precision, choice.precision)
    if choice.precision == keep:
        return (
            f"{name} is kept: none was measured at least {SWITCH_SPEEDUP:.2f}x faster "
            "(the lower end of its interval)"
        )
    others = " and ".join(NAMES.get(p, p) for p in choice.tied if p != choice.precision)
    same = f"{name} and {others} measured the same speed within noise; " if others else ""
    if choice.emulated and choice.precision not in choice.emulated:
        slow = " and ".join(NAMES.get(p, p) for p in choice.emulated)
        return f"{same}this device runs {slow} emulated (no native kernels), so {name}"
    own = choice.saved_bytes.get(choice.precision)
    if own is not None and any(v > own for p, v in choice.saved_bytes.items() if p in choice.tied):
        return f"{same}{name} keeps the least activation memory"
    return f"{same}{name} is the simplest"


def rows_of(ab: Mapping[str, Any] | None) -> dict[str, Mapping[str, Any]]:
    """The A/B rows by precision name."""
    if not isinstance(ab, Mapping):
        return {}
    found = ab.get("results")
    if not isinstance(found, list):
        return {}
    return {str(r.get("precision")): r for r in found if isinstance(r, Mapping)}


@dataclass
class Measured:
    """What a session's A/B says, for the advice: the rows and the choice, or why there is none.

    Attributes:
        rows: The A/B rows by precision.
        choice: The choice, when the A/B timed its precisions (more than once each).
        run: The run's own precision ("fp16", "bf16"; None when no autocast was seen).
        why_not: Why the advice cannot rest on the A/B (None when it can).
    """

    rows: dict[str, Mapping[str, Any]]
    choice: Choice | None
    run: str | None
    why_not: str | None


def measured(session: Session) -> Measured:
    """The A/B of a session (``speed_probe.precisions``), as the precision advice reads it.

    The choice is made once, in the derive step (``derived.precision_choice``), and read here.
    """
    doc = derived(session).get("precision_choice") or derived_choice(session)
    choice = Choice(**doc["choice"]) if doc["choice"] is not None else None
    return Measured(_advisable(session), choice, doc["run"], doc["why_not"])


def _advisable(session: Session) -> dict[str, Mapping[str, Any]]:
    """The A/B rows of the precisions the device can run, by name.

    A precision the device cannot run (BF16 or TF32 below compute capability 8.0: emulated)
    is never the advice, whatever its row measured.
    """
    ab = session.section("speed_probe").get("precisions")
    return {p: r for p, r in rows_of(ab).items() if D.advisable(session.environment, p)}


@part("precision_choice")
def derived_choice(session: Session) -> PrecisionChoice:
    """The A/B's choice for the run, or why there is none (derived part)."""
    probe = session.section("speed_probe")
    run = computes_in(session)["autocast_precision"]
    ab = probe.get("precisions")
    rows = _advisable(session)
    why: str | None = None
    if not probe:
        why = "no speed probe ran (a trace, or a session recorded without one)"
    elif probe.get("skipped"):
        why = f"the speed probe was skipped: {probe['skipped']}"
    elif probe.get("error"):
        why = f"the speed probe failed: {probe['error']}"
    elif not isinstance(ab, Mapping):
        why = "this session has no precision A/B"
    elif ab.get("skipped") or ab.get("error"):
        why = f"the precision A/B did not run: {ab.get('skipped') or ab.get('error')}"
    device = str(session.environment.get("device_type") or "cpu")
    emulated = () if bf16_runs_natively(session.environment, device) else ("bf16",)
    choice = choose(list(rows.values()), keep=run, emulated=emulated) if why is None else None
    if why is None and choice is None:
        why = "no precision was both timed and numerically safe"
    elif choice is not None and not choice.timed:
        budget = number(ab.get("budget_s"), finite=True) if isinstance(ab, Mapping) else None
        why = "each precision was timed once (no spread to compare)" + (
            f": the A/B budget was {units.micros(budget * 1e6)} "
            "(precision_ab_budget_s, at most 5% of the block)"
            if budget is not None
            else ""
        )
        choice = None
    doc = asdict(choice) if choice is not None else None
    return {"run": run, "choice": doc, "why_not": why}  # type: ignore[typeddict-item]


def fp32_fast_here(session: Session, device: str) -> str | None:
    """Why FP32 is the fast precision of this run, in words (None: it is not known to be).

    A CPU without AVX512_BF16/AMX converts and emulates BF16 and FP16, slower than FP32
    (nanoGPT's ``train.py`` about 4x), so advice that trades FP16's range for BF16's would cost
    the run its speed where FP32 keeps the range too; unless the A/B measured a low precision
    faster on this very run. Elsewhere (a CPU with native BF16: the demo's TinyGPT there), the
    A/B's own choice of FP32 says it: advice that names BF16 beside it would contradict it.
    """
    chosen = measured(session).choice
    if chosen is not None and chosen.precision != "fp32":
        return None
    if device == "cpu" and session.environment.get("bf16_native") is False:
        return "this CPU emulates BF16 and FP16, no AVX512_BF16/AMX"
    if chosen is not None:
        return "the precision A/B chose it on this model and batch"
    return None


def bf16_runs_natively(environment: Mapping[str, Any], device: str) -> bool:
    """Whether the device runs BF16 kernels natively (CPU: AVX512_BF16/AMX; CUDA: sm80+).

    On a GPU the compute capability decides where the session has it (below 8.0 torch
    emulates BF16, and its ``bf16_supported`` flag says True all the same).
    """
    if device == "cpu":
        return environment.get("bf16_native") is True
    known = D.runs_bf16(environment)
    return known if known is not None else environment.get("bf16_supported") is True
