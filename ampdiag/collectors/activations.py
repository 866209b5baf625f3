"""Per-module forward range, activation-gradient underflow and where NaN/inf first appears.

On sampled steps, a forward hook on every module of the model records the absolute max of its
output (one reduction, kept on the device; a NaN propagates through it) and registers a tensor
hook on that output, which sees the gradient entering the module in the backward. That
gradient's exponent histogram (``_exponents.raw_histogram``; at most
``numerics_sample_elements`` values) tells which share FP16 holds as zero or subnormal at the
scale in use, and, shifted by the scale, predicts the share at any candidate scale 2^0..2^24.

At the end of a sampled step the step's results are stacked and accumulated on the device and
copied to the host once (`_host.Deferred`). The first module, in execution order, whose output
(forward) or incoming gradient (backward) holds inf/NaN is the NaN origin, with its step.
Hooks never change a tensor: they return None.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from ampdiag.analysis import fp16range
from ampdiag.collectors._exponents import BINS, raw_histogram
from ampdiag.collectors._host import Deferred, pack
from ampdiag.collectors.base import Collector, RunContext, internal_work
from ampdiag.compat import scaler as compat_scaler

#: Unscaled histograms cover exponents -127-OFF .. 256-127-OFF+... (see _shift_index).
OFF = 64
UBINS = BINS + 2 * OFF


def _first_tensor(output: Any) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)):
        for item in output:
            if isinstance(item, torch.Tensor):
                return item
    return None


class ActivationsCollector(Collector):
    """Forward range, activation-gradient underflow and NaN origin, per module."""

    name = "activations"

    def __init__(self) -> None:
        self._run: RunContext | None = None
        self._names: list[str] = []
        self._index: dict[int, int] = {}
        self._handles: list[Any] = []
        self._active = False
        self._limit = 0
        self._fwd: list[tuple[int, torch.Tensor]] = []
        self._bwd: list[tuple[int, torch.Tensor]] = []
        self._scale: torch.Tensor | None = None
        self._acc_raw: torch.Tensor | None = None
        self._acc_unscaled: torch.Tensor | None = None
        self._pending: list[tuple[int, list[int], list[int], Deferred]] = []
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
        every = int(getattr(run.config, "activation_every", 0)) or max(1, run.config.sample_every)
        return step % every == 0

    def on_model(self, run: RunContext, model: torch.nn.Module) -> None:
        """Hooks every module of the model (forward hooks; cheap when the step is not sampled)."""
        prefix = "" if len(run.models) <= 1 else f"model{len(run.models) - 1}."
        for name, module in model.named_modules():
            if id(module) in self._index:
                continue
            idx = len(self._names)
            self._index[id(module)] = idx
            label = prefix + name if name else prefix + f"({type(module).__name__})"
            self._names.append(label)
            self._handles.append(module.register_forward_hook(partial(self._forward, idx)))

    # --- hooks ------------------------------------------------------------------------------

    def _forward(self, idx: int, module: torch.nn.Module, args: Any, output: Any) -> None:
        if not self._active:
            return
        t = _first_tensor(output)
        if t is None or not t.is_floating_point() or t.numel() == 0:
            return
        self._out_dtype.setdefault(idx, str(t.dtype).removeprefix("torch."))
        with internal_work():
            amax = torch.linalg.vector_norm(t.detach(), ord=float("inf"))
        self._fwd.append((idx, amax.float()))
        if t.requires_grad and torch.is_grad_enabled():
            t.register_hook(partial(self._backward, idx))  # type: ignore[no-untyped-call]

    def _backward(self, idx: int, grad: torch.Tensor) -> None:
        if not self._active or grad is None or grad.numel() == 0:
            return
        with internal_work():
            self._record_grad(idx, grad)

    def _record_grad(self, idx: int, grad: torch.Tensor) -> None:
        if self._scale is None:
            run = self._run
            live = compat_scaler.scale_tensor(run.scaler if run is not None else None)
            self._scale = (
                live.detach().clone().float()
                if live is not None
                else torch.ones((), device=grad.device)
            )
        self._grad_dtype.setdefault(idx, str(grad.dtype).removeprefix("torch."))
        self._bwd.append((idx, raw_histogram(grad, self._limit)))

    # --- steps ------------------------------------------------------------------------------

    def on_step_end(self, run: RunContext, step: int) -> None:
        """Accumulates the step's results on the device and queues one copy to the host."""
        if self._active and (self._fwd or self._bwd):
            self._finish_step(step)
        self._fwd, self._bwd, self._scale = [], [], None
        self._active = self._wants(run, step + 1)
        self._resolve(wait=False)

    def _ensure_acc(self, device: torch.device) -> None:
        m = len(self._names)
        if self._acc_raw is None or self._acc_unscaled is None:
            self._acc_raw = torch.zeros(m, BINS, dtype=torch.int64, device=device)
            self._acc_unscaled = torch.zeros(m, UBINS, dtype=torch.int64, device=device)
        elif self._acc_raw.shape[0] < m:
            extra = m - self._acc_raw.shape[0]
            self._acc_raw = torch.cat([self._acc_raw, self._acc_raw.new_zeros(extra, BINS)])
            self._acc_unscaled = torch.cat(
                [self._acc_unscaled, self._acc_unscaled.new_zeros(extra, UBINS)]
            )

    def _finish_step(self, step: int) -> None:
        self._sampled_steps += 1
        fwd_idx = [i for i, _ in self._fwd]
        bwd_idx = [i for i, _ in self._bwd]
        parts: list[torch.Tensor] = []
        device = (self._fwd[0][1] if self._fwd else self._bwd[0][1]).device
        if self._fwd:
            parts.append(torch.stack([a.to(device) for _, a in self._fwd]))
        if self._bwd:
            hists = torch.stack([h.to(device) for _, h in self._bwd])
            self._ensure_acc(device)
            assert self._acc_raw is not None and self._acc_unscaled is not None
            index = torch.tensor(bwd_idx, device=device)
            self._acc_raw.index_add_(0, index, hists)
            scale = self._scale if self._scale is not None else torch.ones((), device=device)
            shifted = hists.new_zeros(len(bwd_idx), UBINS).index_add_(
                1, _shift_index(scale.to(device)), hists
            )
            self._acc_unscaled.index_add_(0, index, shifted)
            parts.append(hists[:, BINS - 1])
            parts.append(scale.to(device))
        packed = pack(parts, device)
        self._pending.append((step, fwd_idx, bwd_idx, Deferred(packed)))

    def _resolve(self, wait: bool) -> None:
        keep = []
        for item in self._pending:
            if wait or item[3].ready():
                self._absorb(*item)
            else:
                keep.append(item)
        self._pending = keep

    def _absorb(self, step: int, fwd: list[int], bwd: list[int], deferred: Deferred) -> None:
        values = deferred.values()
        amax = values[: len(fwd)]
        nonfinite = values[len(fwd) : len(fwd) + len(bwd)]
        if bwd:
            self._scales.append(values[-1])
        bad_fwd = None
        for idx, a in zip(fwd, amax, strict=True):
            finite = a == a and a not in (float("inf"), float("-inf"))
            if finite:
                self._max_abs[idx] = max(self._max_abs.get(idx, 0.0), a)
            else:
                self._max_abs[idx] = float("inf") if a == a else self._max_abs.get(idx, 0.0)
                if bad_fwd is None:
                    bad_fwd = idx
        bad_bwd = next((i for i, c in zip(bwd, nonfinite, strict=True) if c > 0), None)
        if bad_fwd is not None or bad_bwd is not None:
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

    def stop(self, run: RunContext) -> None:
        """Removes every hook and reads what is still on the device."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._active = False
        self._resolve(wait=True)

    # --- section ----------------------------------------------------------------------------

    def section(self) -> dict[str, Any] | None:
        """Per-module range and underflow, predictions per candidate scale, NaN origin."""
        self._resolve(wait=True)
        if not self._sampled_steps:
            return None
        raw = self._acc_raw.tolist() if self._acc_raw is not None else []
        uns = self._acc_unscaled.tolist() if self._acc_unscaled is not None else []
        modules = []
        all_exps: dict[int, int] = {}
        for idx, name in enumerate(self._names):
            row: dict[str, Any] = {"module": name}
            seen = False
            if idx in self._max_abs:
                seen = True
                row["max_abs"] = self._max_abs[idx]
                row["output_dtype"] = self._out_dtype.get(idx)
            if idx < len(raw) and sum(raw[idx]):
                seen = True
                counts = fp16range.range_counts(raw[idx])
                nz = counts["n"] - counts["zero"] - counts["nonfinite"]
                exps = {
                    i - OFF - fp16range.BIAS: int(c)
                    for i, c in enumerate(uns[idx])
                    if 0 < i < UBINS - 1 and c
                }
                fp16range.merge(all_exps, exps)
                rec = fp16range.recommend_scale_log2(exps)
                row |= {
                    "grad_dtype": self._grad_dtype.get(idx),
                    "counts": counts,
                    "zero_fraction": counts["zero"] / counts["n"],
                    "flush_fraction": counts["flush"] / nz if nz > 0 else 0.0,
                    "subnormal_fraction": counts["subnormal"] / nz if nz > 0 else 0.0,
                    "overflow_fraction": counts["overflow"] / nz if nz > 0 else 0.0,
                    "exponents": {str(k): v for k, v in sorted(exps.items())},
                    "recommended_scale_log2": rec,
                }
            if seen:
                modules.append(row)
        predictions = [
            {"scale_log2": k, **fp16range.predict(all_exps, k)} for k in fp16range.CANDIDATE_LOG2
        ]
        rec_all = fp16range.recommend_scale_log2(all_exps)
        return {
            "sample_elements": self._limit,
            "sampled_steps": self._sampled_steps,
            "scales_seen": sorted(set(self._scales)),
            "modules": modules,
            "exponents": {str(k): v for k, v in sorted(all_exps.items())},
            "predictions": predictions,
            "recommended_scale_log2": rec_all,
            "recommended_init_scale": float(2**rec_all) if rec_all is not None else None,
            "nonfinite_origin": self._origin,
            "nonfinite_steps": self._nonfinite_steps[:100],
        }


def _shift_index(scale: torch.Tensor) -> torch.Tensor:
    """Column map raw exponent bin -> unscaled bin (divide by the scale: e - log2 S + OFF).

    Bin 0 (zeros) goes to 0, bin 255 (inf/NaN) to the last; the rest are clamped inside.
    """
    s = torch.log2(scale.float().clamp_min(2.0**-60)).round().long().clamp(-OFF + 1, OFF - 1)
    idx = torch.arange(BINS, device=scale.device) - s + OFF
    idx = idx.clamp(1, UBINS - 2)
    idx[0] = 0
    idx[BINS - 1] = UBINS - 1
    return idx
