"""Findings of a distributed run: the rank the others wait for, all-reduces accumulation wastes.

Both read the timeline section's communication figures (`ampdiag.analysis.communication`): a
folder of the ranks' traces, or the merged report of a ``diagnose()`` run on several ranks.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ampdiag.analysis.registry import rule
from ampdiag.session import Finding, Session, Severity


#: The straggler and redundant-all-reduce thresholds (here, not beside the numpy analysis in
#: `ampdiag.analysis.communication`, so that a session's report imports no numpy).
@dataclass(frozen=True)
class Thresholds:
    """This module's thresholds, by name: a typo is a type error, not a run-time KeyError."""

    # A straggler is the last to arrive in at least this share of the matched collectives ...
    last_share_min: float = 0.75
    # ... and on every step the others wait for it at least this share of the median step
    # (the least late step counts: CPU scheduling noise on a loaded machine makes single steps
    # late by a third of a step and more, never all of them by a quarter) ...
    lateness_share_medium: float = 0.25
    lateness_share_high: float = 0.50
    # ... and at least this long (below, transfer time differences dominate).
    lateness_min_us: float = 1000.0
    # redundant-allreduce: all-reduces in more than one micro-batch on at least this share of
    # the steps with two or more micro-batches.
    redundant_step_share: float = 0.5
    # ... high when the redundant all-reduces take this share of the step.
    redundant_time_share_high: float = 0.20


THRESHOLDS = Thresholds()

_WHERE = {
    "data": "data loading (enumerate(DataLoader))",
    "forward": "forward ops on the host",
    "backward": "backward ops on the host",
    "optimizer": "the optimizer step",
    "other": "host work outside any op (Python, sleeps, synchronisations, logging)",
}


def straggler(session: Session) -> dict[str, Any] | None:
    """The straggler that passes the thresholds (see `straggler_rank`), or None."""
    s = session.section("timeline").get("communication", {}).get("straggler")
    if not isinstance(s, dict):
        return None
    step = float(s.get("step_us_median") or 0.0)
    least = float(s.get("lateness_us_min", 0.0))
    if (
        float(s.get("last_share", 0.0)) < THRESHOLDS.last_share_min
        or step <= 0
        or least < THRESHOLDS.lateness_min_us
        or least / step < THRESHOLDS.lateness_share_medium
    ):
        return None
    return s


@rule("straggler-rank")
def straggler_rank(session: Session) -> Iterator[Finding]:
    """One rank arrives last at the collectives and the others wait for it.

    Fires when one rank is last in >= 75% of the matched collectives and, on every step, the
    others wait for it >= 25% of the median step (medium; >= 50% high) and >= 1 ms. Says where
    its extra time goes: its host time by category less the other ranks' mean, and its GPU
    computation per step less theirs (GPU traces).
    """
    s = straggler(session)
    if s is None:
        return
    step = float(s["step_us_median"])
    late = float(s["lateness_us_median"])
    share = late / step
    extra = {k: float(v) for k, v in (s.get("extra_us_per_step") or {}).items()}
    gpu_extra = s.get("gpu_compute_extra_us_per_step")
    causes = sorted(((v, k) for k, v in extra.items() if v > 0), reverse=True)
    where: list[str] = []
    if isinstance(gpu_extra, (int, float)) and gpu_extra > 0.25 * late:
        where.append(f"GPU computation (+{gpu_extra / 1000:.1f} ms per step)")
    where += [f"{_WHERE[k]} (+{v / 1000:.1f} ms per step)" for v, k in causes[:2] if v > 0.1 * late]
    severity: Severity = "high" if share >= THRESHOLDS.lateness_share_high else "medium"
    rank = s["rank"]
    fix_by_cause = {
        "data": "Load data ahead on that rank: DataLoader(num_workers=4, pin_memory=True,\n"
        "persistent_workers=True), and give every rank an equal share (DistributedSampler).",
        "other": "Remove the extra host work from that rank's step: logging, checkpointing,\n"
        "evaluation or .item()/.cpu() syncs done by one rank only (if rank == 0: ...) belong\n"
        "outside the step, or on every rank at once.",
        "forward": "Balance the work: every rank should get the same batch size and sequence\n"
        "lengths (pad or bucket by length) so the forward costs the same everywhere.",
        "backward": "Balance the work: every rank should get the same batch size and sequence\n"
        "lengths, so the backward costs the same everywhere.",
        "optimizer": "Keep optimizer-side work equal on every rank (no rank-only clipping,\n"
        "EMA or logging of the parameters).",
    }
    top = causes[0][1] if causes else "other"
    gpu_top = isinstance(gpu_extra, (int, float)) and gpu_extra > (causes[0][0] if causes else 0)
    fix = (
        "Balance the GPU work: that rank computes more per step (uneven batch, sequence length\n"
        "or a slower/throttled GPU: check nvidia-smi for clocks and temperature)."
        if gpu_top
        else fix_by_cause.get(top, fix_by_cause["other"])
    )
    fix += (
        f"\nThe other ranks' exposed communication is waiting for rank {rank}: tuning DDP\n"
        "buckets or overlap will not recover it; making rank "
        f"{rank} as fast as the others will."
    )
    yield Finding(
        id="straggler-rank",
        severity=severity,
        title=(
            f"Rank {rank} is the straggler: the other ranks wait {late / 1000:.1f} ms per step "
            f"({share:.0%} of a step) for it at the collectives"
            + (f", its extra time in {where[0]}." if where else ".")
        ),
        evidence={
            "rank": rank,
            "last_share": round(float(s["last_share"]), 4),
            "lateness_us_per_step": [round(float(x), 1) for x in s.get("lateness_us", [])],
            "lateness_us_median": round(late, 1),
            "step_us_median": round(step, 1),
            "lateness_share": round(share, 4),
            "waiting_attributed_us_per_step": round(float(s["attributed_us_per_step"]), 1),
            "extra_us_per_step": {k: round(v, 1) for k, v in extra.items()},
            "gpu_compute_extra_us_per_step": (
                round(float(gpu_extra), 1) if isinstance(gpu_extra, (int, float)) else None
            ),
            "where": where,
            "threshold": THRESHOLDS.lateness_share_medium,
        },
        fix=fix,
        section="timeline",
        impact=share,
    )


@rule("redundant-allreduce")
def redundant_allreduce(session: Session) -> Iterator[Finding]:
    """Gradient accumulation all-reduces in every micro-batch instead of the last one only.

    Counts, per optimizer step, the DDP forwards (micro-batches) and the gradient all-reduces
    in each; fires when >= 2 micro-batches all-reduce on >= 50% of the steps with two or more
    micro-batches (medium; high when the redundant all-reduces take >= 20% of the step).
    """
    best: tuple[float, dict[str, Any]] | None = None
    for r in session.section("timeline").get("ranks", []):
        steps = [
            s
            for s in (r.get("collectives") or {}).get("steps", [])
            if int(s.get("micro_batches", 0)) >= 2
        ]
        if not steps:
            continue
        redundant = [s for s in steps if sum(1 for n in s["allreduces_per_micro_batch"] if n) > 1]
        if len(redundant) < THRESHOLDS.redundant_step_share * len(steps):
            continue
        n = len(redundant)
        allreduces = sum(s["allreduces"] for s in redundant) / n
        buckets = sum(s["allreduces_per_micro_batch"][-1] for s in redundant) / n
        micro = sum(s["micro_batches"] for s in redundant) / n
        spare = max(0.0, allreduces - buckets)
        time_us = sum(s["time_us"] for s in redundant) / n
        saved = time_us * spare / allreduces if allreduces else 0.0
        step_us = sum(s["step_us"] for s in redundant) / n
        ev = {
            "rank": r["rank"],
            "micro_batches": round(micro, 2),
            "allreduces_per_step": round(allreduces, 2),
            "buckets": round(buckets, 2),
            "redundant_per_step": round(spare, 2),
            "allreduce_us_per_step": round(time_us, 1),
            "redundant_us_per_step": round(saved, 1),
            "step_us": round(step_us, 1),
            "steps": [s["step"] for s in redundant],
            "allreduces_per_micro_batch": redundant[0]["allreduces_per_micro_batch"],
        }
        if best is None or saved > best[0]:
            best = (saved, ev)
    if best is None:
        return
    saved, ev = best
    share = saved / ev["step_us"] if ev["step_us"] else 0.0
    severity: Severity = "high" if share >= THRESHOLDS.redundant_time_share_high else "medium"
    yield Finding(
        id="redundant-allreduce",
        severity=severity,
        title=(
            f"Gradients are all-reduced {ev['allreduces_per_step']:g} times per optimizer step "
            f"instead of {ev['buckets']:g}: each of the {ev['micro_batches']:g} accumulated "
            f"micro-batches syncs (rank {ev['rank']}, {saved / 1000:.1f} ms per step)."
        ),
        evidence={**ev, "redundant_share_of_step": round(share, 4)},
        fix=(
            "Skip the gradient sync on all but the last micro-batch:\n"
            "import contextlib\n"
            "for i, (x, y) in enumerate(micro_batches):\n"
            "    last = i == len(micro_batches) - 1\n"
            "    with contextlib.nullcontext() if last else model.no_sync():\n"
            "        loss = loss_fn(model(x), y) / len(micro_batches)\n"
            "        loss.backward()\n"
            "optimizer.step(); optimizer.zero_grad()\n"
            "# with Hugging Face Accelerate: with accelerator.accumulate(model): ...\n"
            "# with FSDP2: model.set_requires_gradient_sync(last)"
        ),
        section="timeline",
        impact=share,
    )


_LOW = frozenset({"bfloat16", "float16"})


@rule("fsdp-mixed-precision")
def fsdp_mixed_precision(session: Session) -> Iterator[Finding]:
    """States FSDP2's MixedPrecisionPolicy (info): compute dtype, and the dtype of the reduce.

    FSDP2 casts the parameters for forward and backward itself (no autocast), which the
    precision audit sees as matmuls in low precision without autocast; the reduce dtype decides
    the precision of the gradient reduction (FP32 keeps small gradient contributions).
    """
    policies = [
        p
        for m in session.section("run").get("models", [])
        if isinstance(m, dict)
        for p in m.get("fsdp_mixed_precision") or []
    ]
    low = [p for p in policies if p.get("param_dtype") in _LOW]
    if not low:
        return
    param = low[0]["param_dtype"]
    reduce = low[0].get("reduce_dtype") or param
    note = (
        "gradients are reduced in FP32"
        if reduce == "float32"
        else f"gradients are reduced in {reduce}: small contributions may round away"
    )
    yield Finding(
        id="fsdp-mixed-precision",
        severity="info",
        title=(
            f"FSDP2 MixedPrecisionPolicy: parameters computed in {param} on "
            f"{len(low)} fully_shard module(s); {note}."
        ),
        evidence={"policies": policies, "param_dtype": param, "reduce_dtype": reduce},
        fix=(
            ""
            if reduce == "float32"
            else "Reduce in FP32: MixedPrecisionPolicy(param_dtype=torch.bfloat16, "
            "reduce_dtype=torch.float32)"
        ),
        section="precision",
        impact=0.0,
    )
