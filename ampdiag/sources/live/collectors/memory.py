"""Memory: model state from the live tensors, the profiled timeline by category, CUDA snapshots.

What each figure counts (and leaves out) is defined in docs/how-it-works.md (Memory). Where it
comes from:

* Model state: ``numel * element_size`` over the live tensors at the end of the block (shared
  storages once).
* Timeline and peak (profiled steps): the profile the profiler collector records (no second
  profiler), labelled by torch's memory profiler (`ampdiag.compat.memory`) or, when that is
  unavailable, by `ampdiag.analysis.memory_timeline`; both use the model-state addresses seen
  at the end of each profiled step and the model's inputs.
* CUDA: ``_record_memory_history`` over the block and a snapshot at its end (also when it
  raised: the failing frames still hold their tensors), written as ``memory/snapshot.pickle``
  and summarized (`ampdiag.sources.snapshot`); the counters of ``torch.cuda.memory_stats``.
* Activations (sampled and profiled steps): before each backward, the storages autograd saved
  (`ampdiag.sources.live.saved_activations`). Reading a saved tensor runs the user's
  saved-tensor hooks (a checkpoint would recompute, an offload copy back), so a step whose
  forward ran under ``saved_tensors_hooks`` (an observe-only patch of its ``__enter__`` /
  ``__exit__``) is not counted.
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
from ampdiag.compat.dtensor import local_tensor
from ampdiag.schema import MemorySection
from ampdiag.sources.live import exclusive, global_hooks
from ampdiag.sources.live.collectors import COLLECTORS
from ampdiag.sources.live.collectors.base import (
    Collector,
    RunContext,
    internal_work,
    is_internal_work,
)
from ampdiag.sources.live.discovery import split_parameters
from ampdiag.sources.live.patching import Patches
from ampdiag.sources.live.saved_activations import ParameterIndex, saved_by_graph

log = logging.getLogger("ampdiag")

SNAPSHOT_FILE = "snapshot.pickle"
#: Steps whose batch size is noted (and every profiled step): enough for the batch in use.
MAX_BATCH_STEPS = 1000
#: Most trace events torch's memory profiler categorizes; past it ampdiag's own categorizer
#: (linear in the events) does. torch's replays the whole op tree with a data-flow pass whose
#: cost per event is high enough that a real script's window made the exit take seconds.
TORCH_CATEGORIZER_MAX_EVENTS = 4000


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
        "parameter_count" (updated by an optimizer), "frozen_parameter_count" (held, never
        updated: an EMA copy), "parameter_dtypes"}, {storage address: category},
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
        t = local_tensor(t)  # FSDP2/DTensor: this rank holds its shard, not the global size
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
    frozen_ids = {id(p) for m in models for p in split_parameters(m, optimizers)[1]}
    frozen = 0
    for p in params:
        if add(p, "parameters"):
            if id(p) in frozen_ids:  # held, never updated (an EMA copy): stated apart
                frozen += local_tensor(p).numel()
            else:
                count += local_tensor(p).numel()
            dtypes[str(p.dtype).removeprefix("torch.")] += _nbytes(local_tensor(p))
    largest = 0
    for p in params:
        if p.grad is not None:
            largest = max(largest, add(p.grad, "gradients"))
    for opt in optimizers:
        for state in opt.state.values():
            if not isinstance(state, dict):
                continue
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    by_key[str(key)] += add(value, "optimizer_state")
    out["largest_gradient"] = largest
    out["optimizer_state_by_key"] = dict(by_key)
    out["parameter_count"] = count
    out["frozen_parameter_count"] = frozen
    out["parameter_dtypes"] = dict(dtypes)
    return out, ptrs, sizes


def host_memory_bytes() -> int | None:
    """Physical memory of this machine (the CPU's capacity), or None where unknown."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


@COLLECTORS.register
class MemoryCollector(Collector):
    """Where the memory goes: model state, the categorized timeline, CUDA snapshots."""

    name = "memory"
    enabled_by = "memory"

    def __init__(self) -> None:
        self._run: RunContext | None = None
        self._handles: list[Any] = []
        self._batches: dict[int, int] = {}
        self._micro_batches_max = 0
        self._known_by_step: dict[int, dict[int, str]] = {}
        self._inputs_by_step: dict[int, dict[int, str]] = {}
        self._saved: dict[int, dict[str, int]] = {}
        self._saved_by_step: dict[int, dict[tuple[int, int], str]] = {}
        self._patches = Patches()
        self._user_hooks = 0  # the user's saved-tensor hook contexts open now
        self._user_hooks_step = -1  # the last step one was entered in
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
        self._watch_saved_tensor_hooks(run)
        cfg = run.config
        if cfg.memory_history and compat_memory.cuda_history_available():
            if not exclusive.claim(exclusive.CUDA_HISTORY, self):
                run.warn("CUDA memory history not recorded: another diagnose() block records it")
                return
            self._cuda_recording = compat_memory.start_cuda_history(cfg.memory_history_max_entries)
            if not self._cuda_recording:
                exclusive.release(exclusive.CUDA_HISTORY, self)

    def on_model(self, run: RunContext, model: torch.nn.Module) -> None:
        """Watches the batch size at the model's forward (reads a shape, nothing else)."""

        def pre(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
            if not run.on_block_thread():
                return
            if run.is_profiled():
                self._note_inputs(run.step, (*args, *kwargs.values()))
            if run.step in self._batches:
                return
            if len(self._batches) >= MAX_BATCH_STEPS and not run.is_profiled():
                return  # a long run: the first steps and the profiled ones tell the sizes
            for a in (*args, *kwargs.values()):
                if isinstance(a, torch.Tensor) and a.dim() >= 1:
                    self._batches[run.step] = int(a.shape[0])
                    return

        self._handles.append(global_hooks.on_module(model, global_hooks.MODULE_INPUTS, pre))

    def _note_inputs(self, step: int, values: tuple[Any, ...]) -> None:
        """The storages of the model's tensor inputs (top level, or in a list/tuple/dict)."""
        found = self._inputs_by_step.setdefault(step, {})
        for v in values:
            inner = v.values() if isinstance(v, dict) else v if isinstance(v, list | tuple) else [v]
            for t in inner:
                if isinstance(t, torch.Tensor) and not t.is_sparse:
                    ptr = _storage_ptr(t)
                    if ptr:
                        found[ptr] = "inputs"
                        try:
                            self._known_sizes[ptr] = int(t.untyped_storage().nbytes())
                        except Exception:
                            self._known_sizes[ptr] = _nbytes(t)

    def _watch_saved_tensor_hooks(self, run: RunContext) -> None:
        hooks_cls = torch.autograd.graph.saved_tensors_hooks

        def make_enter(original: Any) -> Any:
            def enter(hooks: Any) -> Any:
                if not is_internal_work():
                    self._user_hooks += 1
                    self._user_hooks_step = run.step
                return original(hooks)

            return enter

        def make_exit(original: Any) -> Any:
            def exit_(hooks: Any, *exc: Any) -> Any:
                if not is_internal_work():
                    self._user_hooks = max(0, self._user_hooks - 1)
                return original(hooks, *exc)

            return exit_

        self._patches.wrap(hooks_cls, "__enter__", make_enter)
        self._patches.wrap(hooks_cls, "__exit__", make_exit)

    def before_backward(self, run: RunContext, tensor: torch.Tensor) -> None:
        """On sampled and profiled steps, counts what the coming backward holds (no sync)."""
        step = run.step
        profiled = run.is_profiled(step)
        if not (profiled or run.is_sampled(step)) or tensor.grad_fn is None:
            return
        if self._user_hooks or self._user_hooks_step == step:
            return  # reading saved tensors would run the user's unpack hooks
        params: list[torch.Tensor] = []
        for m in run.models:
            params.extend(m.parameters())
        with internal_work():
            saved = saved_by_graph(tensor, ParameterIndex.of(params))
        previous = self._saved.get(step)
        if previous is None or saved.activation_bytes > previous["activation_bytes"]:
            # micro-batches free their activations at their backward: the step holds the largest
            self._saved[step] = {
                "activation_bytes": saved.activation_bytes,
                "weight_cast_bytes": saved.weight_cast_bytes,
                "storages": len(saved.activations),
            }
        if profiled:
            with torch.profiler.record_function(tl_mod.SAVED_MARK):
                pass  # where the count was made: the tensors live now are the saved ones
            labels = self._saved_by_step.setdefault(step, {})
            labels.update({key: "activations" for key in saved.activations.items()})
            for key in saved.weight_casts.items():
                labels.setdefault(key, "temporaries")

    def after_backward(self, run: RunContext, index: int) -> None:
        """Notes whether the run accumulates (its timeline then holds accumulation's memory)."""
        self._micro_batches_max = max(self._micro_batches_max, index + 1)

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
        self._patches.restore()
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
                exclusive.release(exclusive.CUDA_HISTORY, self)

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
        known = {  # model state wins where an input is also a parameter
            n: {**self._inputs_by_step.get(n, {}), **self._known_by_step.get(n, {})}
            for n in sorted({*self._known_by_step, *self._inputs_by_step})
        }
        files = run.trace_files
        trace = run.read_trace(max(files, key=lambda p: p.stat().st_mtime)) if files else None
        prof = run.profile
        small = trace is None or trace.events <= TORCH_CATEGORIZER_MAX_EVENTS
        if prof is not None and small:
            tl = compat_memory.categorized_timeline(
                prof, "cuda:0" if cuda else "cpu", known, self._saved_by_step
            )
            if tl is not None and tl["t_us"]:
                return tl
        if trace is None:
            return None
        return tl_mod.timeline_from_trace(
            trace, 1 if cuda else 0, known, self._known_sizes, self._saved_by_step
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
            "micro_batches_max": self._micro_batches_max,
            "limit_bytes": cfg.memory_limit_bytes,
            "errors": self._errors,
        }
        out["saved_activations"] = {
            str(k): {**v, "batch": self._batches.get(k)} for k, v in sorted(self._saved.items())
        }
        out["live_activation_points"] = [
            [self._batches[k], v["activation_bytes"]]
            for k, v in sorted(self._saved.items())
            if k in self._batches
        ]
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
            out["step_activation_peaks"] = tl_mod.step_peaks(tl, "activations")
            most = tl_mod.activation_peak(tl)
            if most is not None:
                most["batch"] = self._batches.get(tl_mod.step_number(most.get("step")) or -1)
                out["activation_peak"] = most
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
