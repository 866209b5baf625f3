"""Gradient accumulation, four micro-batches per optimizer step: done right (losses averaged),
gradients zeroed between micro-batches (set to None, or zeroed in place), micro-batch losses
summed; bf16, and fp16 with a GradScaler.

Truth (`tests.scenarios.accumulation`, measured by the loop without ampdiag): the backward
passes per step; each micro-batch's own gradient (replayed with ``torch.autograd.grad``); how
many of them the gradient the optimizer sees is the sum of; and that gradient's norm over the
mean micro-batch gradient's (1 averaged, N summed).

* `grad-accumulation-broken`: the micro-batches per step and the surviving ones as measured
  (1 of 4), and how they were reset; no accumulation advice to such a run (it is given a
  target batch and a budget that would call for it, see test_accumulation.py).
* `accumulation-loss-not-averaged`: the micro-batch count, and the loss weights' sum within 5%
  of the measured gradient ratio (near N).
* Averaged runs: neither finding.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ampdiag.session import Session
from tests.scenarios import accumulation as acc
from tests.scenarios.harness import Expect, Scenario, Truth

IDS = {"grad-accumulation-broken", "accumulation-loss-not-averaged"}


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def averaged(scaler: bool):
    def run(out: Path) -> tuple[Session, Truth]:
        dtype = torch.float16 if scaler else torch.bfloat16
        _, session, m = acc.train("average", out=out, dtype=dtype, scaler=scaler)
        assert session is not None
        assert m["surviving"] == [acc.N] * acc.STEPS, m
        assert all(abs(r - 1.0) < 0.05 for r in m["ratio"]), m["ratio"]
        return session, Truth(forbid=IDS, measured=m)

    return run


def zeroed(how: str):
    def run(out: Path) -> tuple[Session, Truth]:
        _, session, m = acc.train(
            how,
            out=out,
            micro=[8, 16] * (acc.STEPS // 2),  # two batch sizes: the memory fit has a slope
            memory_target_batch=10**6,
            memory_limit_bytes=64 * 2**20,
        )
        assert session is not None
        assert set(m["surviving"]) == {1}, m  # only the last micro-batch reaches the optimizer
        expect = Expect(
            "grad-accumulation-broken",
            evidence={
                "micro_batches": (m["backward_passes"][0], 0),
                "surviving_micro_batches": (m["surviving"][0], 0),
                "how": ("set_to_none" if how == "zero_none" else "zeroed", 0),
            },
        )
        forbid = {"use-grad-accumulation", "accumulation-loss-not-averaged"}
        return session, Truth(expect=[expect], forbid=forbid, measured=m)

    return run


def summed(scaler: bool):
    def run(out: Path) -> tuple[Session, Truth]:
        dtype = torch.float16 if scaler else torch.bfloat16
        _, session, m = acc.train("sum", out=out, dtype=dtype, scaler=scaler)
        assert session is not None
        assert m["surviving"] == [acc.N] * acc.STEPS, m
        ratio = _mean(m["ratio"])
        assert abs(ratio - acc.N) < 0.1, m  # N times the averaged gradient
        expect = Expect(
            "accumulation-loss-not-averaged",
            evidence={
                "micro_batches": (m["backward_passes"][0], 0),
                "loss_weight_sum": (ratio, 0.05 * ratio),
            },
        )
        return session, Truth(expect=[expect], forbid={"grad-accumulation-broken"}, measured=m)

    return run


def _tag(scaler: bool) -> str:
    return "fp16-scaler" if scaler else "bf16"


SCENARIOS = [
    *(
        Scenario(f"accumulation-averaged-{_tag(s)}", "Four micro-batches, losses / 4.",
                 averaged(s))
        for s in (False, True)
    ),
    *(
        Scenario(f"accumulation-loss-summed-{_tag(s)}",
                 "Four micro-batches whose losses are summed, not averaged.", summed(s))
        for s in (False, True)
    ),
    *(
        Scenario(f"accumulation-{how.replace('_', '-')}",
                 "optimizer.zero_grad() between the micro-batches of one step.", zeroed(how))
        for how in ("zero_none", "zero_inplace")
    ),
]  # fmt: skip
