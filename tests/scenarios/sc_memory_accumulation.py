"""A target batch that does not fit a memory budget: accumulation's plan, or no plan at all.

Tutorial 2's MLP (bf16 autocast, ``ampdiag.memory_probe`` before the loop) trains at batch
512, planning for an effective batch of 4096 (``memory_target_batch``).

Truth, measured without ampdiag (`tests.scenarios.memory_runs`, `memory_truth`):

* the activation bytes per sample: what autograd saves for the backward (saved-tensor hooks,
  weights and their casts excluded) at two batch sizes, their slope;
* the largest micro-batch that fits 90% of the budget: the CPU allocator's peak of an
  accumulating step (two micro-batches of ``m``, averaged) at two sizes ``m``, which grows
  linearly with ``m``; the micro-batch where that line meets 90% of the budget, and the
  accumulation steps it takes to reach 4096;
* the model state by arithmetic.

`use-grad-accumulation` (28 MiB budget) must name the per-sample bytes within 30% of the
saved-tensor truth and the accumulation steps within one of the truth's (its micro-batch
within 25%). `no-micro-batch-fits` (a budget the model state alone nearly fills, truth: the
allocator's peak at a micro-batch of 1 is over 90% of it) must say so, with the model state
exact, and no accumulation plan may be given.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch.nn import functional as F

import ampdiag
from ampdiag.session import Session
from tests.scenarios import memory_runs as mr
from tests.scenarios.harness import Expect, Scenario, Truth, diagnose, session_of
from tests.scenarios.memory_truth import saved_bytes

TARGET, BATCH, STEPS = 4096, 512, 4
HEADROOM = 0.90  # the share of the budget a plan may use (documented with the finding)


def _per_sample() -> float:
    run = mr.build(momentum=0.0)
    at = {
        b: saved_bytes(run.model, run.x[:b], run.y[:b], F.cross_entropy, torch.bfloat16)[
            "activations"
        ]
        for b in (64, 512)
    }
    return (at[512] - at[64]) / (512 - 64)


def _accumulating_peak(micro: int, adam: bool = False) -> int:
    """The allocator's peak of a step of two micro-batches of ``micro`` (the second step)."""

    def job(mark: mr.Mark) -> None:
        mr.train(mr.build(momentum=0.0, adam=adam), 2 * micro, 2, mark, micro=micro)

    return mr.allocator_peaks(job)[1]


def _diagnosed(out: Path, budget: int, adam: bool = False) -> Session:
    run = mr.build(momentum=0.0, adam=adam)

    def batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return run.x[:n], run.y[:n]

    settings = {"memory_target_batch": TARGET, "memory_limit_bytes": budget}
    with diagnose(out, profile_active=1, speed_probe=False, **settings) as d:
        ampdiag.memory_probe(
            run.model, batch, loss_fn=F.cross_entropy, autocast_dtype=torch.bfloat16
        )
        mr.train(run, BATCH, STEPS)
    return session_of(d)


def plan(out: Path) -> tuple[Session, Truth]:
    budget = 28 * 2**20
    usable = HEADROOM * budget
    points = [(m, _accumulating_peak(m)) for m in (128, 512)]
    largest = math.floor(mr.linear_root(points, usable))
    steps = math.ceil(TARGET / largest)
    per_sample = _per_sample()
    measured = {"per_sample_bytes": per_sample, "accumulating_peaks": points,
                "largest_micro_batch": largest, "accumulation_steps": steps}  # fmt: skip
    assert 1 < steps < TARGET, measured  # the target does not fit, a micro-batch does
    session = _diagnosed(out, budget)
    expect = Expect(
        "use-grad-accumulation",
        evidence={
            "per_sample_activation_bytes": (per_sample, 0.30 * per_sample),
            "accumulation_steps": (steps, 1),
            "micro_batch": (math.ceil(TARGET / steps), 0.25 * TARGET / steps),
            "target_batch": (TARGET, 0),
        },
    )
    return session, Truth(expect=[expect], forbid={"no-micro-batch-fits"}, measured=measured)


def no_fit(out: Path) -> tuple[Session, Truth]:
    run = mr.build(momentum=0.0, adam=True)
    state = sum(mr.state_bytes(run).values())
    budget = int(state / 0.95)  # the model state alone: 95% of it
    at_one = _accumulating_peak(1, adam=True)
    measured = {"model_state_bytes": state, "budget": budget, "peak_at_micro_batch_1": at_one}
    assert at_one > HEADROOM * budget, measured  # truly nothing fits
    session = _diagnosed(out, budget, adam=True)
    expect = Expect(
        "no-micro-batch-fits",
        evidence={
            "model_state_bytes": (state, 0),
            "target_batch": (TARGET, 0),
            "capacity_bytes": (budget, 0),
        },
    )
    return session, Truth(expect=[expect], forbid={"use-grad-accumulation"}, measured=measured)


SCENARIOS = [
    Scenario(
        "use-grad-accumulation",
        "Batch 4096 does not fit 28 MiB; micro-batches with accumulation do.",
        plan,
    ),
    Scenario(
        "no-micro-batch-fits",
        "Adam's model state alone is 95% of the budget: no micro-batch fits, no plan.",
        no_fit,
    ),
]
