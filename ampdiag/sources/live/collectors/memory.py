"""Memory: model state from the live tensors, the profiled timeline by category, CUDA snapshots.

* Model state (exact): parameter, gradient and optimizer-state bytes, summed as
  ``numel * element_size`` over the live tensors at the end of the block (shared storages
  counted once).
* Timeline (profiled steps): read from the profile the profiler collector already records
  (``profile_memory=True``; no second profiler). torch's memory profiler labels the tensors
  (`ampdiag.compat.memory.categorized_timeline`); when it is unavailable, ampdiag's own
  categorizer reads the Kineto trace (`ampdiag.analysis.memory_timeline.timeline_from_trace`).
  Both use the parameter, gradient and optimizer-state addresses seen at the end of each
  profiled step.
* CUDA: ``_record_memory_history`` over the block, a snapshot at its end (also when it raised,
  e.g. ``torch.OutOfMemoryError``: the failing frames still hold their tensors), written as
  ``memory/snapshot.pickle`` (open it at https://pytorch.org/memory_viz) and summarized into
  the section; the allocator counters from ``torch.cuda.memory_stats``.
* Batch size: the first dimension of the first tensor argument of the model's forward.
"""

from __future__ import annotations

import logging
import os
import pickle
from collections import Counter
from typing import Any

import torch

from ampdiag._layout import MEMORY_DIR
from ampdiag.analysis import memory_timeline as tl_mod
from ampdiag.compat import memory as compat_memory
from ampdiag.schema import MemorySection
from ampdiag.sources.live.collectors.base import Collector, RunContext
from ampdiag.trace.reader import read_trace

log = logging.getLogger("ampdiag")

SNAPSHOT_FILE = "snapshot.pickle"


def _storage_ptr(t: torch.Tensor) -> int:
    try:
        return int(t.untyped_storage().data_ptr())
    except Exception:
        return int(t.data_ptr())


def _nbytes(t: torch.Tensor) -> int:
    return int(t.numel() * t.element_size())


def model_state(
    models: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer]
) -> tuple[dict[str, Any], dict[int, str], dict[int, int]]:
    """Bytes of parameters, gradients and optimizer state, and their storage addresses.

    Returns:
        ``({"parameters", "gradients", "optimizer_state", "optimizer_state_by_key",
        "parameter_count", "parameter_dtypes"}, {storage address: category},
        {storage address: storage bytes})``.
    """
    seen: set[tuple[int, int, int]] = set()
    ptrs: dict[int, str] = {}
    sizes: dict[int, int] = {}
    out: dict[str, Any] = {"parameters": 0, "gradients": 0, "optimizer_state": 0}
    by_key: Counter[str] = Counter()
    dtypes: Counter[str] = Counter()
    count = 0

    def add(t: torch.Tensor, cat: str) -> int:
        ptr = _storage_ptr(t)
        key = (ptr, int(t.storage_offset()), int(t.numel()))
        if ptr and key in seen:
            return 0
        seen.add(key)
        ptrs.setdefault(ptr, cat)
        try:
            sizes[ptr] = int(t.untyped_storage().nbytes())
        except Exception:
            sizes[ptr] = _nbytes(t)
        n = _nbytes(t)
        out[cat] += n
        return n

    params: list[torch.Tensor] = []
    for m in models:
        params.extend(m.parameters())
    for opt in optimizers:
        for group in opt.param_groups:
            params.extend(p for p in group["params"] if isinstance(p, torch.Tensor))
    for p in params:
        if add(p, "parameters"):
            count += p.numel()
            dtypes[str(p.dtype).removeprefix("torch.")] += _nbytes(p)
    for p in params:
        if p.grad is not None:
            add(p.grad, "gradients")
    for opt in optimizers:
        for state in opt.state.values():
            if not isinstance(state, dict):
                continue
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    by_key[str(key)] += add(value, "optimizer_state")
    out["optimizer_state_by_key"] = dict(by_key)
    out["parameter_count"] = count
    out["parameter_dtypes"] = dict(dtypes)
    return out, ptrs, sizes


def host_memory_bytes() -> int | None:
    """Physical memory of this machine (the CPU's capacity), or None where unknown."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


class MemoryCollector(Collector):
    """Where the memory goes: model state, the categorized timeline, CUDA snapshots."""

    name = "memory"

    def __init__(self) -> None:
        self._run: RunContext | None = None
        self._handles: list[Any] = []
        self._batches: dict[int, int] = {}
        self._known_by_step: dict[int, dict[int, str]] = {}
        self._state: dict[str, Any] = {}
        self._known_end: dict[int, str] = {}
        self._known_sizes: dict[int, int] = {}
        self._cuda_recording = False
        self._cuda: dict[str, Any] | None = None
        self._errors: list[str] = []

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self, run: RunContext) -> None:
        """Starts CUDA memory history where there is CUDA."""
        self._run = run
        cfg = run.config
        if cfg.memory_history and compat_memory.cuda_history_available():
            self._cuda_recording = compat_memory.start_cuda_history(cfg.memory_history_max_entries)

    def on_model(self, run: RunContext, model: torch.nn.Module) -> None:
        """Watches the batch size at the model's forward (reads a shape, nothing else)."""

        def pre(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
            if run.step in self._batches:
                return
            for a in (*args, *kwargs.values()):
                if isinstance(a, torch.Tensor) and a.dim() >= 1:
                    self._batches[run.step] = int(a.shape[0])
                    return

        self._handles.append(model.register_forward_pre_hook(pre, with_kwargs=True))

    def on_step_end(self, run: RunContext, step: int) -> None:
        """On profiled steps, notes where the parameters, gradients and optimizer state live."""
        if run.is_profiled(step):
            _, ptrs, sizes = model_state(run.models, run.optimizers)
            self._known_by_step[step] = ptrs
            self._known_sizes.update(sizes)

    def stop(self, run: RunContext) -> None:
        """Removes the hooks, measures the model state, snapshots CUDA memory."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        try:
            self._state, self._known_end, _ = model_state(run.models, run.optimizers)
        except Exception as exc:
            self._errors.append(f"model state: {exc!r}")
        if self._cuda_recording:
            try:
                self._cuda = self._cuda_section(run)
            finally:
                compat_memory.stop_cuda_history()
                self._cuda_recording = False

    def _cuda_section(self, run: RunContext) -> dict[str, Any] | None:
        from ampdiag.sources.snapshot import summarize_snapshot

        snap = compat_memory.cuda_snapshot()
        out: dict[str, Any] = {}
        try:
            out["stats"] = compat_memory.cuda_stats()
        except Exception as exc:
            self._errors.append(f"cuda stats: {exc!r}")
        if snap is None:
            return out or None
        folder = run.out / MEMORY_DIR
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / SNAPSHOT_FILE).open("wb") as fh:
            pickle.dump(snap, fh)
        out["snapshot_file"] = f"{MEMORY_DIR}/{SNAPSHOT_FILE}"
        out.update(summarize_snapshot(snap, self._known_end))
        return out

    # --- the section --------------------------------------------------------------------------

    def _timeline(self, run: RunContext) -> dict[str, Any] | None:
        cuda = run.device_type == "cuda"
        prof = run.profile
        if prof is not None:
            tl = compat_memory.categorized_timeline(
                prof, "cuda:0" if cuda else "cpu", self._known_by_step
            )
            if tl is not None and tl["t_us"]:
                return tl
        files = run.trace_files
        if not files:
            return None
        trace = read_trace(max(files, key=lambda p: p.stat().st_mtime))
        return tl_mod.timeline_from_trace(
            trace, 1 if cuda else 0, self._known_by_step, self._known_sizes
        )

    def section(self) -> MemorySection | None:
        """Model state, timeline, peak, batch sizes, probes, CUDA summary, budget."""
        run = self._run
        if run is None:
            return None
        cfg = run.config
        out: MemorySection = {
            "device": run.device_type,
            "model_state": self._state,
            "batches": {str(k): v for k, v in sorted(self._batches.items())},
            "probes": run.memory_probes,
            "target_batch": cfg.memory_target_batch,
            "limit_bytes": cfg.memory_limit_bytes,
            "errors": self._errors,
        }
        if self._batches:
            out["observed_batch"] = Counter(self._batches.values()).most_common(1)[0][0]
        try:
            tl = self._timeline(run)
        except Exception as exc:
            self._errors.append(f"timeline: {exc!r}")
            tl = None
        if tl is not None:
            pk = tl_mod.peak(tl)
            if pk is not None:
                out["peak"] = pk
                n = tl_mod.step_number(pk.get("step"))
                if n is not None and n in self._batches:
                    out["observed_batch"] = self._batches[n]
            acts = tl_mod.step_peaks(tl, "activations")
            out["step_activation_peaks"] = acts
            out["live_activation_points"] = tl_mod.points_by_batch(acts, self._batches)
            out["timeline"] = tl_mod.as_json(tl_mod.thin(tl))
        if self._cuda is not None:
            out["cuda"] = self._cuda
            stats = self._cuda.get("stats") or {}
            out["capacity_bytes"] = stats.get("capacity_bytes")
            out["capacity_source"] = "CUDA device total memory"
            if "peak" not in out and self._cuda.get("peak"):
                cp = self._cuda["peak"]
                out["peak"] = {"bytes": cp["allocated_bytes"], "by_category": cp["by_category"]}
        elif run.device_type == "cuda" and torch.cuda.is_available():
            out["capacity_bytes"] = int(torch.cuda.get_device_properties(0).total_memory)
            out["capacity_source"] = "CUDA device total memory"
        else:
            out["capacity_bytes"] = host_memory_bytes()
            out["capacity_source"] = "host RAM"
        return out
