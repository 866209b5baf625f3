"""Private torch memory APIs: the memory profiler's categories and the CUDA memory history.

Two private torch features live here, and only here:

* ``torch.profiler._memory_profiler.MemoryProfile`` (checked on torch 2.4 - 2.13; its export
  is marked deprecated). It replays a profile's op tree and labels every tensor parameter,
  gradient, optimizer state, activation, temporary, input or autograd detail.
  `categorized_timeline` returns None when the module or the attributes it reads are missing
  or changed, and the caller falls back to ampdiag's own categorization
  (`ampdiag.analysis.memory_timeline`), which needs only the public trace and the known tensors.
* ``torch.cuda.memory._record_memory_history`` / ``_snapshot`` (the ``enabled=`` keyword
  form). `start_cuda_history` returns False when unavailable; `cuda_snapshot` returns None.
  The snapshot is a plain dict in torch's documented format (``segments``,
  ``device_traces``), the same object ``torch.cuda.memory._dump_snapshot`` pickles.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

import torch

from ampdiag.analysis.memory_timeline import (  # our category names, in plot order
    CATEGORIES,
    SAVED_MARK,
)

log = logging.getLogger("ampdiag")


_TORCH_TO_OURS = {
    "PARAMETER": "parameters",
    "OPTIMIZER_STATE": "optimizer_state",
    "GRADIENT": "gradients",
    "INPUT": "inputs",
    "ACTIVATION": "activations",
    "TEMPORARY": "temporaries",
    "AUTOGRAD_DETAIL": "autograd_detail",
}


def memory_profiler_available() -> bool:
    """Whether torch's (private) memory profiler can be used on this torch."""
    try:
        from torch.profiler import _memory_profiler as mp
    except ImportError:
        return False
    return all(hasattr(mp, n) for n in ("MemoryProfile", "Action", "TensorKey", "Category"))


def categorized_timeline(
    prof: Any,
    device: str,
    known_by_step: Mapping[int, Mapping[int, str]] | None = None,
    saved_by_step: Mapping[int, Mapping[tuple[int, int], str]] | None = None,
) -> dict[str, Any] | None:
    """The memory timeline of a finished profile, split by category, as torch labels tensors.

    Args:
        prof: A ``torch.profiler.profile`` whose trace is ready (``profile_memory=True``).
        device: "cpu" or "cuda:0" etc.: only that device's allocations are counted.
        known_by_step: Step index -> {storage address: our category} of the tensors ampdiag
            saw at the end of that step (parameters, gradients, optimizer state) and of the
            model's inputs in it. Of the tensors allocated before the window whose free the
            profile never reports, only these are counted (see the code). These
            override torch's label: without ``with_stack=True`` torch cannot see the optimizer
            and labels its state "parameter". An address names a tensor only while that
            tensor lives: the allocator reuses it (a step's activation where the last step's
            gradient was), so the label applies only to the allocation live at the end of
            the step it was seen in.
        saved_by_step: Step index -> {(storage address, bytes): category} of the storages
            autograd saved in that step, counted by ampdiag before each backward, where it
            leaves a ``SAVED_MARK`` event. A tensor created in such a step is an activation
            only when it was live at a mark with a saved storage's address and size (so a
            later tensor at a freed activation's address is not); torch's own "activation"
            label (a data-flow guess that also takes weights' casts and gradients) is then
            replaced by "temporaries".

    Returns:
        ``{"t_us": [...], "bytes": {category: [...]}, "steps": [(name, start_us, end_us)],
        "source": "torch-memory-profiler"}`` with times relative to the first event, or None
        when torch's memory profiler is missing, changed, or fails on this profile.
    """
    if not memory_profiler_available():
        return None
    try:
        from torch.profiler._memory_profiler import MemoryProfile

        result = prof.profiler.kineto_results
        if result is None:
            return None
        profile = MemoryProfile(result)
        timeline = profile.timeline
        lives, sizes_of, preexisting = _lifetimes(timeline)
        label = _Labels(profile, lives, known_by_step or {})
        label.saved = _saved_labels(profile, lives, sizes_of, saved_by_step or {})
        # A tensor allocated before the allocator reported to the profiler, read inside the
        # window, with no free reported: torch counts it live to the end, but it may have been
        # freed (the last step's gradients, read by ampdiag's statistics, then dropped by
        # zero_grad): its bytes then came and went with allocator address reuse. Only the
        # tensors ampdiag knows are live (model state, the model's inputs) are counted.
        unseen_free = {key for key in preexisting if lives[key][1] == math.inf}
        times, sizes, base = _series(timeline, torch.device(device), label, unseen_free)
        steps = [
            (node.name, (node.start_time_ns - base) / 1e3, (node.end_time_ns - base) / 1e3)
            for node in profile._op_tree.sorted_nodes
            if node.name.startswith("ProfilerStep#")
        ]
        return {
            "t_us": [max(0.0, (t - base) / 1e3) if t >= 0 else 0.0 for t in times],
            "bytes": {c: [s[c] for s in sizes] for c in CATEGORIES},
            "steps": steps,
            "source": "torch-memory-profiler",
        }
    except Exception as exc:  # private API: any change in it means "use the fallback"
        log.info("torch memory profiler unavailable on this profile: %r", exc)
        return None


def _lifetimes(timeline: Any) -> tuple[dict[Any, list[float]], dict[Any, int], set[Any]]:
    """Each tensor key's [created, destroyed] (ns; inf: not freed), bytes, and if it preexisted."""
    from torch.profiler._memory_profiler import Action, TensorKey

    lives: dict[Any, list[float]] = {}
    sizes_of: dict[Any, int] = {}
    preexisting: set[Any] = set()
    for t, action, (key, _), nbytes in timeline:
        if action in (Action.PREEXISTING, Action.CREATE):
            lives[key] = [-math.inf if action == Action.PREEXISTING else t, math.inf]
            sizes_of[key] = int(nbytes)
            if action == Action.PREEXISTING and isinstance(key, TensorKey):
                preexisting.add(key)
        elif action == Action.DESTROY and key in lives:
            lives[key][1] = t
    return lives, sizes_of, preexisting


class _Labels:
    """The category of a tensor key, as `categorized_timeline` documents.

    Autograd's saved storages first, then the tensors ampdiag saw at a step's end (live
    across it), then torch's own label, corrected.
    """

    def __init__(
        self,
        profile: Any,
        lives: Mapping[Any, list[float]],
        known_by_step: Mapping[int, Mapping[int, str]],
    ) -> None:
        self.categories = profile._categories
        self.lives = lives
        self.saved: Mapping[Any, str | None] = {}
        self.by_step = {n: dict(ptrs) for n, ptrs in known_by_step.items()}
        self.known_params = any(
            c in ("parameters", "optimizer_state")
            for ptrs in self.by_step.values()
            for c in ptrs.values()
        )
        self.step_end = {
            int(node.name.split("#", 1)[1]): node.end_time_ns
            for node in profile._op_tree.sorted_nodes
            if node.name.startswith("ProfilerStep#") and node.name.split("#", 1)[1].isdigit()
        }
        self.decided: dict[Any, str | None] = {}

    def known(self, key: Any) -> str | None:
        """Our category of the tensor at that key, where ampdiag saw it live at a step's end."""
        if key not in self.decided:
            ptr = int(key.storage.ptr)
            created, destroyed = self.lives.get(key, (-math.inf, math.inf))
            self.decided[key] = next(
                (
                    ptrs[ptr]
                    for n, ptrs in self.by_step.items()
                    if ptr in ptrs
                    and (n not in self.step_end or created <= self.step_end[n] < destroyed)
                ),
                None,
            )
        return self.decided[key]

    def __call__(self, key: Any, version: int) -> str:
        from torch.profiler._memory_profiler import TensorKey

        if not isinstance(key, TensorKey):
            return "unknown"
        label = self.saved.get(key)
        if label:  # saved for its step's backward
            return label
        ours = self.known(key)
        if ours is not None:
            return ours
        cat = self.categories.get(key, version)
        name = _TORCH_TO_OURS.get(cat.name, "unknown") if cat is not None else "unknown"
        if label is not None and name == "activations":
            return "temporaries"  # torch's guess, but autograd did not save it
        if name == "parameters" and self.known_params:
            # torch's data-flow guess; not one of the model's or optimizer's tensors.
            return "temporaries"
        return name


def _series(
    timeline: Any, want: torch.device, label: _Labels, unseen_free: set[Any]
) -> tuple[list[int], list[dict[str, int]], int]:
    """The bytes live per category at each moment of the device's timeline; the first moment."""
    from torch.profiler._memory_profiler import Action

    times: list[int] = []
    sizes: list[dict[str, int]] = []
    current = dict.fromkeys(CATEGORIES, 0)
    t_min: int | None = None
    for t, action, (key, version), nbytes in timeline:
        if key.device != want or (key in unseen_free and label.known(key) is None):
            continue
        if t >= 0 and (t_min is None or t < t_min):
            t_min = t
        if action in (Action.PREEXISTING, Action.CREATE):
            current[label(key, version)] += int(nbytes)
        elif action == Action.INCREMENT_VERSION:
            current[label(key, version)] -= int(nbytes)
            current[label(key, version + 1)] += int(nbytes)
        elif action == Action.DESTROY:
            current[label(key, version)] -= int(nbytes)
        if times and times[-1] == t:
            sizes[-1] = dict(current)
        else:
            times.append(t)
            sizes.append(dict(current))
    return times, sizes, t_min or 0


def _saved_labels(
    profile: Any,
    lives: Mapping[Any, list[float]],
    sizes_of: Mapping[Any, int],
    saved_by_step: Mapping[int, Mapping[tuple[int, int], str]],
) -> dict[Any, str]:
    """Tensor key -> its category from the saved storages.

    "" for a tensor made in a step whose saved tensors were counted, but not one of them.
    """
    steps = []
    marks = []
    for node in profile._op_tree.sorted_nodes:
        name = node.name
        if name.startswith("ProfilerStep#") and name.split("#", 1)[1].isdigit():
            steps.append((int(name.split("#", 1)[1]), node.start_time_ns, node.end_time_ns))
        elif name == SAVED_MARK:
            marks.append(node.start_time_ns)
    out: dict[Any, str] = {}
    if not saved_by_step:
        return out
    for key, (born, died) in lives.items():
        labels = next((saved_by_step.get(n) for n, s, e in steps if s <= born <= e), None)
        if labels is None or not hasattr(key, "storage"):
            continue
        label = labels.get((int(key.storage.ptr), sizes_of.get(key, -1)))
        live = any(born <= m < died for m in marks)
        out[key] = label if label is not None and live else ""
    return out


def cuda_history_available() -> bool:
    """Whether CUDA memory history can be recorded here (a CUDA device and the private API)."""
    if not torch.cuda.is_available():
        return False
    return hasattr(torch.cuda.memory, "_record_memory_history") and hasattr(
        torch.cuda.memory, "_snapshot"
    )


def start_cuda_history(max_entries: int) -> bool:
    """Starts recording CUDA allocations with Python stacks; False when it cannot."""
    if not cuda_history_available():
        return False
    try:
        torch.cuda.memory._record_memory_history(
            enabled="all", context="all", stacks="python", max_entries=max_entries
        )
    except Exception as exc:
        log.info("cannot record CUDA memory history: %r", exc)
        return False
    return True


def stop_cuda_history() -> None:
    """Stops recording (never raises)."""
    try:
        torch.cuda.memory._record_memory_history(enabled=None)
    except Exception as exc:
        log.info("cannot stop CUDA memory history: %r", exc)


def cuda_snapshot() -> dict[str, Any] | None:
    """The allocator snapshot (``segments`` and ``device_traces``), or None."""
    try:
        snap = torch.cuda.memory._snapshot()
    except Exception as exc:
        log.info("cannot take a CUDA memory snapshot: %r", exc)
        return None
    return snap if isinstance(snap, dict) else None


def cuda_stats(device: int | None = None) -> dict[str, int]:
    """The allocator counters ampdiag reports (public ``torch.cuda.memory_stats``)."""
    stats = torch.cuda.memory_stats(device)
    keys = {
        "allocated_bytes": "allocated_bytes.all.current",
        "allocated_peak_bytes": "allocated_bytes.all.peak",
        "reserved_bytes": "reserved_bytes.all.current",
        "reserved_peak_bytes": "reserved_bytes.all.peak",
        "num_alloc_retries": "num_alloc_retries",
        "num_ooms": "num_ooms",
    }
    out = {k: int(stats.get(v, 0)) for k, v in keys.items()}
    out["capacity_bytes"] = int(torch.cuda.get_device_properties(device or 0).total_memory)
    return out
