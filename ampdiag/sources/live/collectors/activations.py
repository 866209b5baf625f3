"""Per-module forward range, activation-gradient underflow and where NaN/inf first appears.

What is measured, and why against FP32, is in docs/how-it-works.md (Numerics). How, on sampled
steps only (hooks armed for the step, removed after it): a forward hook on every module keeps
its output's range (one ``aminmax`` on the device) and hooks that output's gradient, keeping a
sample of it (`_exponents.sample_view`); one exponent histogram of the step's samples, shifted
by the scale, predicts the share FP16 loses at any candidate scale.

A value FP16 flushed is a zero like any other, so underflow is also counted where it happens:
a hook on the backward of each FP32 -> FP16 cast in the loss's graph (walked once per sampled
step, `on_loss`) sees the FP32 gradient just before the cast ("boundary"). Where that cast is
at the model's output, the step's inputs and that gradient are kept (`_replays` says on which
steps) and an FP32 replay before the optimizer step (`fp32_replay.reference_gradients`) gives
the true gradient entering every module: the figures inside the model are counted against it,
and each replayed step contributes the smallest scale that keeps its loss under 1% (the
recommendation is the largest: gradients shrink or grow as a run goes on).

A step's results go to the host in one transfer (`_host.Deferred`) and are accumulated with
numpy. Hooks never change a tensor: they return None.
"""

from __future__ import annotations

import math
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from ampdiag.analysis import fp16range
from ampdiag.compat import scaler as compat_scaler
from ampdiag.schema import ActivationsSection
from ampdiag.sources.live import global_hooks
from ampdiag.sources.live.collectors import COLLECTORS
from ampdiag.sources.live.collectors._exponents import (
    BINS,
    sample_view,
    shares,
    signed_histograms_of,
)
from ampdiag.sources.live.collectors._host import Deferred, absorb_ready, grown
from ampdiag.sources.live.collectors.base import (
    Collector,
    RunContext,
    graph_nodes,
    internal_work,
    tensors_in,
)
from ampdiag.sources.live.collectors.fp32_replay import (
    MAX_OUTPUT_VALUES,
    REPLAY_VALUES,
    ReplayError,
    reference_gradients,
)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

#: Unscaled histograms cover exponents -127-OFF .. 256-127-OFF+... (see _shift_index).
OFF = 64
UBINS = BINS + 2 * OFF


@COLLECTORS.register
class ActivationsCollector(Collector):
    """Forward range, activation-gradient underflow and NaN origin, per module."""

    name = "activations"
    enabled_by = "numerics"

    def __init__(self) -> None:
        self._run: RunContext | None = None
        self._names: list[str] = []
        self._index: dict[int, int] = {}
        self._hooks = global_hooks.SampledHooks(self._forward)
        self._active = False
        self._limit = 0
        self._cache: dict[tuple[object, ...], torch.Tensor] = {}
        self._fwd_idx: list[int] = []
        self._fwd_min: list[torch.Tensor] = []
        self._fwd_max: list[torch.Tensor] = []
        self._bwd_idx: list[int] = []
        self._bwd: list[torch.Tensor] = []
        self._scale: torch.Tensor | None = None
        self._walked = -1
        self._node_handles: list[Any] = []
        self._bnd: list[torch.Tensor] = []
        self._bcache: dict[tuple[object, ...], torch.Tensor] = {}
        self._bnd_raw: npt.NDArray[np.int64] | None = None
        self._bnd_unscaled: npt.NDArray[np.int64] | None = None
        self._root_args: tuple[Any, ...] | None = None
        self._root_node: Any = None
        self._replay: tuple[tuple[Any, ...], torch.Tensor, torch.Tensor] | None = None
        # this step's replay: per module, its true gradient's histogram and size
        self._ref: tuple[torch.Tensor, list[int]] | None = None
        self._ref_acc: npt.NDArray[np.int64] | None = None  # true exponents, all steps
        self._ref_lost: npt.NDArray[np.int64] | None = None  # per module: lost, flush, nz
        self._ref_steps: list[dict[str, Any]] = []  # per sampled step: the scale it needs
        self._ref_failed: dict[str, Any] | None = None  # replays that gave no FP32 truth
        self._candidates = 0  # sampled steps whose backward reached the model's output
        self._replay_step = -1
        self._root_idx = -1  # the main model's index: its output is where the replay starts
        self._acc_raw: npt.NDArray[np.int64] | None = None
        self._acc_unscaled: npt.NDArray[np.int64] | None = None
        self._pending: list[tuple[int, list[int], list[int], bool, list[int], Deferred]] = []
        self._max_abs: dict[int, float] = {}
        self._out_dtype: dict[int, str] = {}
        self._grad_dtype: dict[int, str] = {}
        self._origin: dict[str, Any] | None = None
        self._nonfinite_steps: list[int] = []
        self._sampled_steps = 0
        self._scales: list[float] = []

    def start(self, run: RunContext) -> None:
        """Arms the hooks for the first step when it is sampled."""
        self._run = run
        self._limit = int(getattr(run.config, "numerics_sample_elements", 0))
        self._active = self._wants(run, run.step)

    @staticmethod
    def _wants(run: RunContext, step: int) -> bool:
        every = int(getattr(run.config, "activation_every", 0))
        return run.window_step(step) % every == 0 if every > 0 else run.is_sampled(step)

    def on_model(self, run: RunContext, model: torch.nn.Module) -> None:
        """Learns every module of the model; hooks them when the step is sampled."""
        prefix = "" if len(run.models) <= 1 else f"model{len(run.models) - 1}."
        for name, module in model.named_modules():
            if id(module) in self._index:
                continue
            idx = len(self._names)
            self._index[id(module)] = idx
            label = prefix + name if name else prefix + f"({type(module).__name__})"
            self._names.append(label)
            self._hooks.add(module, hook_now=self._active)
        if self._root_idx < 0 and id(model) in self._index:
            self._root_idx = self._index[id(model)]

    # --- hooks ------------------------------------------------------------------------------

    def _forward(self, idx: int, module: torch.nn.Module, args: Any, output: Any) -> None:
        if not self._active or (self._run is not None and not self._run.on_block_thread()):
            return
        t = next(tensors_in(output), None)
        if t is None or not t.is_floating_point() or t.numel() == 0:
            return
        if idx not in self._out_dtype:
            self._out_dtype[idx] = str(t.dtype).removeprefix("torch.")
        with internal_work():
            lo, hi = torch.aminmax(t.detach())
        self._fwd_idx.append(idx)
        self._fwd_min.append(lo)
        self._fwd_max.append(hi)
        if t.requires_grad and torch.is_grad_enabled():
            t.register_hook(partial(self._backward, idx))  # type: ignore[no-untyped-call]
            if idx == self._root_idx:
                self._root_args, self._root_node = args, t.grad_fn

    def _backward(self, idx: int, grad: torch.Tensor) -> None:
        if not self._active or grad is None or grad.numel() == 0:
            return
        with internal_work():
            self._record_grad(idx, grad)

    def _scale_now(self, device: torch.device) -> None:
        if self._scale is None:
            run = self._run
            live = compat_scaler.scale_tensor(run.scaler if run is not None else None)
            self._scale = (
                live.detach().float().clone() if live is not None else torch.ones((), device=device)
            )

    def on_loss(self, run: RunContext, loss: torch.Tensor, from_scaler: bool) -> None:
        """On a sampled step, hooks the backward of every cast in the loss's graph (once)."""
        if not self._active or self._walked == run.step or loss.grad_fn is None:
            return
        self._walked = run.step
        for node in graph_nodes(loss.grad_fn):
            if node.name() == "ToCopyBackward0":
                self._node_handles.append(node.register_hook(partial(self._boundary, node)))

    def _boundary(self, node: Any, grad_inputs: Any, grad_outputs: Any) -> None:
        # The backward of a cast: grad_outputs[0] arrives in the cast's output dtype, and
        # grad_inputs[0] leaves in its input dtype. FP32 -> FP16 is where FP16 loses values.
        gi, go = grad_inputs[0], grad_outputs[0]
        if gi is None or go is None or gi.dtype != torch.float16 or go.dtype != torch.float32:
            return
        try:
            with internal_work():
                self._keep_boundary(node, go)
        except Exception:  # a refinement: never break the user's backward for it
            return

    def _keep_boundary(self, node: Any, go: torch.Tensor) -> None:
        self._scale_now(go.device)
        sample = sample_view(go.detach(), self._limit)
        self._bnd.append(sample.clone(memory_format=torch.contiguous_format))
        # The cast of the model's output (the user's ``out.float()``), or the model's output
        # itself when its forward cast it (Accelerate's convert_outputs_to_fp32).
        at_root = self._root_node is not None and (
            node is self._root_node or any(n is self._root_node for n, _ in node.next_functions)
        )
        if at_root and self._root_args is not None and go.numel() <= MAX_OUTPUT_VALUES:
            assert self._scale is not None
            if self._replay_step != self._walked:  # the step's first backward at the root
                self._replay_step = self._walked
                self._candidates += 1
            if _replays(self._candidates - 1):
                self._replay = (self._root_args, go.detach().clone(), self._scale)

    def before_optimizer_step(self, run: RunContext, optimizer: torch.optim.Optimizer) -> None:
        """Replays the step in FP32 while the weights are still the step's own."""
        if self._replay is not None:
            self._run_replay(run)

    def _run_replay(self, run: RunContext) -> None:
        replay, self._replay = self._replay, None
        if replay is None or run.model is None:
            return
        args, grad, scale = replay
        try:
            with internal_work():
                unscaled = grad / scale.to(grad.device)
                found = reference_gradients(run.model, args, unscaled, REPLAY_VALUES)
                rows = [(self._index[id(m)], g, n) for m, g, n in found if id(m) in self._index]
                del found
                if not rows:
                    raise ReplayError("the replay reached none of the model's modules")
                hist = signed_histograms_of(
                    [g for _, g, _ in rows], [i for i, _, _ in rows], len(self._names)
                )
        except Exception as exc:  # never the user's problem: the figures say unmeasured, why
            self._replay_failed(run.step, exc)
            return
        sizes = [0] * len(self._names)
        for i, _, n in rows:
            sizes[i] += n
        self._ref = (hist, sizes)

    def _replay_failed(self, step: int, exc: Exception) -> None:
        """Counts a replay that gave no FP32 truth, keeping the first step's reason."""
        if self._ref_failed is None:
            reason = str(exc) if isinstance(exc, ReplayError) else f"{type(exc).__name__}: {exc}"
            self._ref_failed = {"steps": 0, "first_step": step, "reason": reason[:300]}
        self._ref_failed["steps"] += 1

    def _record_grad(self, idx: int, grad: torch.Tensor) -> None:
        self._scale_now(grad.device)
        if idx not in self._grad_dtype:
            self._grad_dtype[idx] = str(grad.dtype).removeprefix("torch.")
        # A copy: the gradient itself is freed as the backward moves on.
        sample = sample_view(grad.detach(), self._limit)
        self._bwd.append(sample.clone(memory_format=torch.contiguous_format))
        self._bwd_idx.append(idx)

    # --- steps ------------------------------------------------------------------------------

    def on_step_end(self, run: RunContext, step: int) -> None:
        """Queues the step's results for the host; hooks or unhooks for the next step."""
        if self._replay is not None:  # no optimizer step (skipped, or d.step()): replay now
            self._run_replay(run)
        if self._active and (self._fwd_idx or self._bwd_idx or self._bnd):
            with internal_work():
                self._finish_step(step)
        self._fwd_idx, self._fwd_min, self._fwd_max = [], [], []
        self._bwd_idx, self._bwd, self._scale = [], [], None
        self._bnd = []
        self._ref = None
        self._root_args = self._root_node = None
        for handle in self._node_handles:
            handle.remove()
        self._node_handles.clear()
        active = self._wants(run, step + 1)
        self._hooks.arm(active)
        self._active = active
        if self._pending:
            self._resolve(wait=False)

    def _finish_step(self, step: int) -> None:
        self._sampled_steps += 1
        fwd_idx, bwd_idx = self._fwd_idx, self._bwd_idx
        device = (self._fwd_min or self._bwd or self._bnd)[0].device
        parts: list[torch.Tensor] = []
        scalars = [*self._fwd_min, *self._fwd_max]
        if bwd_idx or self._bnd:
            scalars.append(self._scale if self._scale is not None else torch.ones(()))
        if scalars:
            if any(t.device != device for t in scalars):
                scalars = [t.to(device) for t in scalars]
            values = torch.stack(scalars)
            parts.append(values if values.dtype == torch.float32 else values.float())
        else:
            parts.append(torch.zeros(0, device=device))
        if bwd_idx:
            samples = self._bwd
            if any(t.device != device for t in samples):
                samples = [t.to(device) for t in samples]
            parts.append(signed_histograms_of(samples, bwd_idx, len(self._names), self._cache))
        if self._bnd:
            samples = [t.to(device) for t in self._bnd]
            parts.append(signed_histograms_of(samples, [0] * len(samples), 1, self._bcache))
        boundary = bool(self._bnd)
        sizes: list[int] = []  # per module row: the values its true gradients held
        if self._ref is not None:
            hist, sizes = self._ref
            parts.append(hist.to(device))
        self._pending.append((step, fwd_idx, bwd_idx, boundary, sizes, Deferred(parts, copy=False)))

    def _resolve(self, wait: bool) -> None:
        self._pending = absorb_ready(self._pending, self._absorb, wait)

    def _accumulate(self, hist: Any, scale: float) -> None:
        import numpy as np

        m = hist.shape[0]
        extra = m - (0 if self._acc_raw is None else self._acc_raw.shape[0])
        if extra > 0:
            self._acc_raw = grown(self._acc_raw, extra, (BINS,), np.int64)
            self._acc_unscaled = grown(self._acc_unscaled, extra, (UBINS,), np.int64)
        assert self._acc_raw is not None and self._acc_unscaled is not None
        self._acc_raw[:m] += hist
        np.add.at(self._acc_unscaled[:m].T, _shift_index(scale), hist.T)

    def _absorb(
        self,
        step: int,
        fwd: list[int],
        bwd: list[int],
        boundary: bool,
        sizes: list[int],
        deferred: Deferred,
    ) -> None:
        import numpy as np

        arrays = deferred.arrays()
        values = arrays[0].astype(np.float64)
        k = len(fwd)
        with np.errstate(invalid="ignore"):
            amax = np.maximum(-values[:k], values[k : 2 * k]).tolist()
        bad_fwd = None
        for idx, a in zip(fwd, amax, strict=True):
            if math.isfinite(a):
                self._max_abs[idx] = max(self._max_abs.get(idx, 0.0), a)
            else:
                self._max_abs[idx] = float("inf") if a == a else self._max_abs.get(idx, 0.0)
                if bad_fwd is None:
                    bad_fwd = idx
        bad_bwd = None
        scale = float(values[2 * k]) if bwd or boundary else 1.0
        if bwd:
            self._scales.append(scale)
            hist = arrays[1].reshape(-1, 2, BINS).sum(axis=1)
            self._accumulate(hist, scale)
            nonfinite = hist[:, BINS - 1]
            bad_bwd = next((i for i in bwd if nonfinite[i] > 0), None)
        if sizes:
            self._absorb_replay(step, arrays[-1].reshape(-1, 2, BINS).sum(axis=1), sizes, scale)
        if boundary:
            bhist = arrays[2 if bwd else 1].reshape(2, BINS).sum(axis=0)
            if self._bnd_raw is None or self._bnd_unscaled is None:
                self._bnd_raw = np.zeros(BINS, dtype=np.int64)
                self._bnd_unscaled = np.zeros(UBINS, dtype=np.int64)
            self._bnd_raw += bhist
            np.add.at(self._bnd_unscaled, _shift_index(scale), bhist)
        if (bad_fwd is not None or bad_bwd is not None) and len(self._nonfinite_steps) < 10_000:
            self._nonfinite_steps.append(step)
        if self._origin is None and (bad_fwd is not None or bad_bwd is not None):
            phase = "forward" if bad_fwd is not None else "backward"
            where = bad_fwd if bad_fwd is not None else bad_bwd
            assert where is not None
            self._origin = {
                "step": step,
                "phase": phase,
                "module": self._names[where],
                "kind": "output" if phase == "forward" else "incoming gradient",
            }

    def _absorb_replay(self, step: int, hist: Any, sizes: list[int], scale: float) -> None:
        """One step's true (unscaled) gradient exponents per module, absorbed.

        What FP16 lost at the step's scale, per module, and the scale the step needs. Each
        module's row (all its values up to ``REPLAY_VALUES``) is weighted by the values its
        gradient held, so that shares over all modules are shares of all values.
        """
        import numpy as np

        sampled = hist.sum(axis=1)
        weight = np.divide(
            np.asarray(sizes, dtype=np.float64),
            sampled,
            out=np.zeros(len(sizes)),
            where=sampled > 0,
        )
        hist = np.rint(hist * np.maximum(weight, 1.0)[:, None]).astype(np.int64)
        m = hist.shape[0]
        extra = m - (0 if self._ref_acc is None else self._ref_acc.shape[0])
        if extra > 0:
            self._ref_acc = grown(self._ref_acc, extra, (BINS,), np.int64)
            self._ref_lost = grown(self._ref_lost, extra, (3,), np.int64)
        assert self._ref_acc is not None and self._ref_lost is not None
        self._ref_acc[:m] += hist
        shift = round(math.log2(scale)) if math.isfinite(scale) and scale > 0 else 0
        c = fp16range.range_counts_rows(hist, shift)
        self._ref_lost[:m, 0] += c["subnormal"]
        self._ref_lost[:m, 1] += c["flush"]
        self._ref_lost[:m, 2] += c["n"] - c["zero"] - c["nonfinite"]
        exps = fp16range.exponent_counts(hist.sum(axis=0).tolist())
        k, reached = fp16range.search_scale_log2(exps)
        if len(self._ref_steps) < 10_000:
            self._ref_steps.append({"step": step, "scale_log2": k, "reached": reached})

    def stop(self, run: RunContext) -> None:
        """Removes every hook, reads what is still on the device."""
        self._hooks.arm(False)
        self._active = False
        if self._replay is not None and not run.block_raised:  # the block ended mid-step
            self._run_replay(run)
            if self._fwd_idx or self._bwd_idx or self._bnd:
                with internal_work():
                    self._finish_step(run.step)
        self._replay = self._ref = None
        self._resolve(wait=True)

    # --- section ----------------------------------------------------------------------------

    def section(self) -> ActivationsSection | None:
        """Per-module range and underflow, predictions per candidate scale, NaN origin."""
        self._resolve(wait=True)
        if not self._sampled_steps:
            return None
        raw: list[list[int]] = self._acc_raw.tolist() if self._acc_raw is not None else []
        uns: list[list[int]] = self._acc_unscaled.tolist() if self._acc_unscaled is not None else []
        modules = []
        all_exps: dict[int, int] = {}
        true_lost = self._ref_lost.tolist() if self._ref_lost is not None else []
        for idx, name in enumerate(self._names):
            row: dict[str, Any] = {"module": name}
            seen = False
            if idx < len(true_lost) and true_lost[idx][2]:
                seen = True
                lost, flush, nz = true_lost[idx]
                row |= {
                    "true_counts": {"nonzero": nz, "lost": lost, "flush": flush},
                    "lost_fraction": lost / nz,
                    "true_flush_fraction": flush / nz,
                }
            if idx in self._max_abs:
                seen = True
                row["max_abs"] = self._max_abs[idx]
                row["output_dtype"] = self._out_dtype.get(idx)
            if idx < len(raw) and any(raw[idx]):
                seen = True
                counts = fp16range.range_counts(raw[idx])
                exps = _unscaled_exponents(uns[idx])
                fp16range.merge(all_exps, exps)
                rec = fp16range.recommend_scale_log2(exps)
                row |= {
                    "grad_dtype": self._grad_dtype.get(idx),
                    "counts": counts,
                    **shares(counts, overflow=True),
                    "exponents": {str(k): v for k, v in sorted(exps.items())},
                    "recommended_scale_log2": rec,
                }
            if seen:
                modules.append(row)
        boundary = self._boundary_section()
        replay = self._replay_section()
        if self._ref_acc is not None:
            # The true gradients replace what survived in FP16 (flushed values are missing
            # there).
            all_exps = fp16range.exponent_counts(self._ref_acc.sum(axis=0).tolist())
        if boundary:
            fp16range.merge(all_exps, boundary["exponents"])
        predictions = [
            {"scale_log2": k, **fp16range.predict(all_exps, k)} for k in fp16range.CANDIDATE_LOG2
        ]
        if replay is not None and replay["recommended_scale_log2"] is not None:
            rec_all, reached = replay["recommended_scale_log2"], replay["scale_reaches_target"]
        else:
            rec_all, reached = fp16range.search_scale_log2(all_exps)
        section: ActivationsSection = {
            "sample_elements": self._limit,
            "sampled_steps": self._sampled_steps,
            "scales_seen": sorted(set(self._scales)),
            "modules": modules,
            "exponents": {str(k): v for k, v in sorted(all_exps.items())},
            "predictions": predictions,
            "recommended_scale_log2": rec_all,
            "recommended_init_scale": float(2**rec_all) if rec_all is not None else None,
            "scale_reaches_target": reached,
            "boundary": boundary,
            "scale_from_fp32_replay": replay is not None,
            "recommended_at_step": replay["recommended_at_step"] if replay else None,
            "replay": replay,
            "replay_failed": self._ref_failed,
            "nonfinite_origin": self._origin,
            "nonfinite_steps": self._nonfinite_steps[:100],
        }
        return section

    def _replay_section(self) -> dict[str, Any] | None:
        """What the FP32 replays measured (None: none ran).

        ``lost_fraction`` / ``flush_fraction``: of the nonzero true gradient values entering
        every module (containers included) on the replayed steps, the share FP16 held as zero
        or subnormal / as zero at each step's scale. ``recommended_scale_log2``: the largest
        of the steps' needed scales (``steps``), at ``recommended_at_step``;
        ``scale_reaches_target`` False when some step has no scale under 1%.
        """
        if self._ref_lost is None or not self._ref_steps:
            return None
        lost, flush, nz = (int(v) for v in self._ref_lost.sum(axis=0).tolist())
        known = [s for s in self._ref_steps if s["scale_log2"] is not None]
        worst = max(known, key=lambda s: s["scale_log2"], default=None)
        return {
            "steps_replayed": len(self._ref_steps),
            "lost_fraction": lost / nz if nz else 0.0,
            "flush_fraction": flush / nz if nz else 0.0,
            "nonzero": nz,
            "recommended_scale_log2": worst["scale_log2"] if worst else None,
            "recommended_at_step": worst["step"] if worst else None,
            "scale_reaches_target": all(s["reached"] for s in self._ref_steps),
            "steps": self._ref_steps[:100],
        }

    def _boundary_section(self) -> dict[str, Any] | None:
        """What FP16 lost where FP32 gradients were cast to FP16 (None: no such cast seen)."""
        if self._bnd_raw is None or self._bnd_unscaled is None:
            return None
        counts = fp16range.range_counts(self._bnd_raw.tolist())
        nz = counts["n"] - counts["zero"] - counts["nonfinite"]
        exps = _unscaled_exponents(self._bnd_unscaled.tolist())
        return {
            "counts": counts,
            # Nonzero FP32 values FP16 holds as zero or subnormal at the scale in use.
            "lost_fraction": counts["subnormal"] / nz if nz > 0 else 0.0,
            "flush_fraction": counts["flush"] / nz if nz > 0 else 0.0,
            "exponents": {str(k): v for k, v in sorted(exps.items())},
        }


#: Replayed: the first REPLAY_FIRST sampled steps that can be, then the 2^k-th ones.
REPLAY_FIRST = 8


def _replays(n: int) -> bool:
    """Whether the n-th (from 0) sampled step that can be replayed is.

    A replay costs about one FP32 forward and backward: on every one of the first
    `REPLAY_FIRST` (a short run is measured on each), then on the 2^k-th only, so that a long
    run still has replays spread over its whole length at a negligible amortised cost.
    """
    return n < REPLAY_FIRST or n & (n - 1) == 0


def _unscaled_exponents(row: list[int]) -> dict[int, int]:
    """{log2 exponent: count} of a row of unscaled bins (`_shift_index`), zeros and inf/NaN out."""
    return {i - OFF - fp16range.BIAS: int(c) for i, c in enumerate(row) if 0 < i < UBINS - 1 and c}


def _shift_index(scale: float) -> Any:
    """Column map raw exponent bin -> unscaled bin (divide by the scale: e - log2 S + OFF).

    Bin 0 (zeros) goes to 0, bin 255 (inf/NaN) to the last; the rest are clamped inside.
    """
    import numpy as np

    s = round(math.log2(max(scale, 2.0**-60))) if math.isfinite(scale) else 0
    s = min(max(s, -OFF + 1), OFF - 1)
    idx = np.clip(np.arange(BINS) - s + OFF, 1, UBINS - 2)
    idx[0] = 0
    idx[BINS - 1] = UBINS - 1
    return idx
