"""The precision choice holds still between identical runs: synthetic timings, known truth.

Each "run" times FP32 and BF16 in 7 interleaved rounds; the rounds' times are the true time
times a noise factor. The noise is one fixed pool of factors (a shared machine: most rounds
within a few percent, one in seven 30% slow), and each run deals the same pool to the two
precisions in another order, as two identical runs on a busy machine do. The row is what the
A/B stores: the median and the median absolute deviation of the rounds (computed here with
`statistics`, not by ampdiag).

The truth is the generating times, not anything ampdiag computes:

- FP32 and BF16 6% apart: no measurement of 7 such rounds can order them, so every run must
  give the same precision -- the one that does not depend on the noise: BF16 where the
  device runs it natively (it keeps half the activation memory), FP32 where BF16 is emulated.
  Deciding by whether the two intervals overlap gave FP32 in some deals and BF16 in others.
- 2x apart: the faster one, in every deal, whatever it keeps in memory.
"""

from __future__ import annotations

import random
import statistics
from typing import Any

from ampdiag.analysis import precision_choice
from ampdiag.analysis.advisors import advise
from tests.analysis.test_precision_advice import session

#: One busy machine's noise: 7 rounds per precision, 14 factors in all, dealt in turn.
POOL = [0.98, 0.99, 1.0, 1.0, 1.01, 1.02, 1.03, 0.985, 1.005, 1.015, 1.04, 1.06, 1.3, 1.35]
DEALS = 40


def row(p: str, true_ms: float, noise: list[float], saved: int) -> dict[str, Any]:
    times = [true_ms * f for f in noise]
    median = statistics.median(times)
    mad = statistics.median(abs(t - median) for t in times)
    return {"precision": p, "time_ms": median, "time_spread_ms": mad, "samples": len(times),
            "saved_bytes": saved, "nonfinite": False,
            "loss_rel_diff": None if p == "fp32" else 1e-3,
            "grad_underflow": None if p == "fp32" else 0.0,
            "grad_sqnr_db_median": None if p == "fp32" else 45.0}  # fmt: skip


def runs(fp32_ms: float, bf16_ms: float) -> list[list[dict[str, Any]]]:
    """``DEALS`` identical runs of an FP16 run (FP16 30x slower than both, so either is a
    switch): the same noise pool, dealt to the rounds in another order."""
    out = []
    for seed in range(DEALS):
        pool = POOL[:]
        random.Random(seed).shuffle(pool)
        out.append([row("fp32", fp32_ms, pool[0::2], 1000), row("bf16", bf16_ms, pool[1::2], 500),
                    row("fp16", 30.0, POOL[:7], 500)])  # fmt: skip
    return out


def picks(rows: list[list[dict[str, Any]]], emulated: tuple[str, ...]) -> set[str]:
    found = set()
    for r in rows:
        choice = precision_choice.choose(r, keep="fp16", emulated=emulated)
        assert choice is not None
        found.add(choice.precision)
    return found


def test_the_deals_do_disagree_on_whether_the_intervals_overlap() -> None:
    # the premise, measured on the rows: a 6% gap is inside the noise, some deals part the
    # two intervals and some do not (a rule that reads overlap flips between them)
    parted = set()
    for fp32, bf16, _ in runs(1.0, 1.06):
        low, high = (
            fp32["time_ms"] - fp32["time_spread_ms"],
            fp32["time_ms"] + fp32["time_spread_ms"],
        )
        b_low = bf16["time_ms"] - bf16["time_spread_ms"]
        b_high = bf16["time_ms"] + bf16["time_spread_ms"]
        parted.add(high < b_low or b_high < low)
    assert parted == {True, False}


def test_a_gap_inside_the_noise_gives_one_choice_the_noise_cannot_move() -> None:
    tie = runs(1.0, 1.06)
    assert picks(tie, emulated=()) == {"bf16"}  # native BF16: half the activation memory
    assert picks(tie, emulated=("bf16",)) == {"fp32"}  # emulated BF16 loses a tie
    # the other way round: BF16 6% faster, still one choice per device
    assert picks(runs(1.06, 1.0), emulated=()) == {"bf16"}
    assert picks(runs(1.06, 1.0), emulated=("bf16",)) == {"fp32"}


def test_a_gap_far_beyond_the_noise_gives_the_faster_every_run() -> None:
    assert picks(runs(1.0, 2.0), emulated=()) == {"fp32"}  # whatever BF16 saves
    assert picks(runs(2.0, 1.0), emulated=("bf16",)) == {"bf16"}  # emulated, yet measured 2x


def test_a_tie_is_worded_as_one() -> None:
    rows = runs(1.0, 1.06)[0]
    native = precision_choice.choose(rows, keep="fp16")
    emulated = precision_choice.choose(rows, keep="fp16", emulated=("bf16",))
    assert native is not None and emulated is not None
    assert precision_choice.tie_break(native, "fp16") == (
        "BF16 and FP32 measured the same speed within noise; BF16 keeps the least activation memory"
    )
    assert precision_choice.tie_break(emulated, "fp16") == (
        "FP32 and BF16 measured the same speed within noise; this device runs BF16 emulated "
        "(no native kernels), so FP32"
    )


def test_the_advice_follows_the_device_from_the_session() -> None:
    # an FP16 run (FP16 30x slower) on a CPU with and without native BF16: the same rows
    for native, want in ((True, "prefer-bf16"), (False, "prefer-fp32")):
        s = session("cpu:float16", runs(1.0, 1.06)[0], bf16_native=native)
        recs = [f for f in advise(s, []) if f.id.startswith("prefer-")]
        assert [f.id for f in recs] == [want], (native, [f.title for f in recs])
        assert "measured the same speed within noise" in recs[0].evidence["tie"]


#: A busier machine: rounds up to 2x slow (the spread of a run measured at 1.46x-4.6x).
BUSY = [1.0, 1.0, 1.05, 1.1, 1.2, 1.3, 1.5, 1.7, 1.9, 2.0, 1.02, 1.08, 1.4, 1.6]


def test_a_gain_far_beyond_the_noise_has_one_severity_on_a_busy_machine() -> None:
    # FP16 2.6x FP32's time: one severity, however wide the busy machine makes the interval
    severities = set()
    for seed in range(DEALS):
        pool = BUSY[:]
        random.Random(seed).shuffle(pool)
        rows = [row("fp32", 1.0, pool[0::2], 1000), row("fp16", 2.6, pool[1::2], 500)]
        s = session("cpu:float16", rows, bf16_native=False)
        recs = [f for f in advise(s, []) if f.id.startswith("prefer-")]
        assert [f.id for f in recs] == ["prefer-fp32"]
        severities.add(recs[0].severity)
    assert severities == {"medium"}
