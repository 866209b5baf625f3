"""Host-side step-time breakdown of a Kineto trace: forward, backward, optimizer, data, other.

Each ``ProfilerStep#N`` span is cut into elementary intervals; each interval goes to the
highest-priority category of the events covering it (data loading > optimizer > backward >
forward), and what no event covers is "other" (Python between ops, the profiler's own work).
The categories come from names torch itself writes:

- data: ``enumerate(DataLoader)#...`` and ``enumerate(DataPipe)#...`` annotations,
- optimizer: ``Optimizer.step#...`` and ``Optimizer.zero_grad#...`` annotations,
- backward: ``autograd::engine::evaluate_function: ...`` ops (on any thread of the process),
- forward: every other CPU op inside the step;
- not optimizer: the closure an optimizer's ``step(closure)`` runs (Lightning's automatic
  optimisation runs forward and backward there), marked by ``diagnose()`` with an
  ``ampdiag.closure#<optimizer>`` annotation: inside it, ops count as forward or backward
  and what they leave uncovered as other, never as optimizer.

This module holds the categories and how an event is classified; the trace reader
(`ampdiag.trace.reader`) keeps the classified host spans and
`ampdiag.analysis.timeline.host_breakdown` computes the breakdown, for live sessions and
existing traces alike.
"""

from __future__ import annotations

from typing import Any

CATEGORIES = ("forward", "backward", "optimizer", "data", "other")
#: The annotation diagnose() puts around an optimizer's closure (see `classify`).
CLOSURE_PREFIX = "ampdiag.closure#"


COLLECTIVE_PREFIXES = ("gloo:", "nccl:")
"""A collective as the process group ran it (``gloo:all_reduce`` on gloo's own thread, ...):
its span lasts until every rank has joined, so it includes the wait for the last one."""
COMM_OP_PREFIXES = ("c10d::", "record_param_comms")
"""Host ops that issue (or wait on) a collective: communication, not forward computation."""
MICRO_BATCH_NAMES = frozenset({"DistributedDataParallel.forward"})
"""Annotations that open one micro-batch (one forward of the DDP-wrapped model)."""


def classify(name: str, cat: str) -> str | None:
    """The breakdown category of one host event, or None for events that do not count.

    Besides the breakdown's own categories: ``all_reduce`` and other ``collective``,
    ``comm_op`` and ``micro_batch``
    (see the constants above), which `ampdiag.analysis.communication` reads and the step
    breakdown leaves out of forward/backward time.
    """
    if name.startswith(COLLECTIVE_PREFIXES):
        return "all_reduce" if "all_reduce" in name or "allreduce" in name else "collective"
    if name.startswith(COMM_OP_PREFIXES):
        return "comm_op"
    if name in MICRO_BATCH_NAMES:
        return "micro_batch"
    if name.startswith(("enumerate(DataLoader)", "enumerate(DataPipe)")):
        return "data"
    if name.startswith(CLOSURE_PREFIX):
        return "closure"
    if name.startswith(("Optimizer.step#", "Optimizer.zero_grad#")):
        return "optimizer"
    if name.startswith("autograd::engine::evaluate_function"):
        return "backward"
    if cat in ("cpu_op", "operator", "Operator"):
        return "forward"
    return None


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-step rows -> ``{"steps", "mean", "share"}`` (the shape every breakdown has)."""
    if not rows:
        return {"steps": [], "mean": {}, "share": {}}
    mean = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0] if k != "step"}
    total = mean["total_us"] or 1.0
    share = {c: mean[f"{c}_us"] / total for c in CATEGORIES}
    return {"steps": rows, "mean": mean, "share": share}
