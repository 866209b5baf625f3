"""Parameter-gradient statistics on sampled steps, measured on the device in a few fused passes.

Just before the optimizer uses the gradients (``scaler.step`` or ``optimizer.step``), on a
sampled step: one ``torch._foreach_norm`` pass for the per-parameter norms, and one exponent
histogram of every gradient at once (``_exponents.raw_histograms``: a cat, a shift, an add
and a bincount over at most ``numerics_sample_elements`` values per tensor). Everything is
packed into one tensor and copied to the host once per sampled step (without stalling on
CUDA, see ``_host.Deferred``).

From the histograms and the loss scale S: per parameter and in total, the zero share, the
shares of nonzero values FP16 would flush (|g·S| < 2^-24) or hold as subnormal
(|g·S| < 2^-14), would overflow (|g·S| >= 2^16), the non-finite count and the norm of the true
(unscaled) gradient; and a histogram of log2|g| against FP16's range.
"""

from __future__ import annotations

from typing import Any

import torch

from ampdiag.analysis import fp16range
from ampdiag.collectors._exponents import raw_histograms
from ampdiag.collectors._host import Deferred, pack
from ampdiag.collectors.base import Collector, RunContext, internal_work
from ampdiag.compat import scaler as compat_scaler

#: Key in RunContext.extra: callbacks the scaler collector calls before ``GradScaler.step``.
BEFORE_SCALER_STEP = "numerics.before_scaler_step"
FIELDS = ("n", "zero", "flush", "subnormal", "overflow", "nonfinite")


class GradientsCollector(Collector):
    """Gradient statistics per parameter and in total on sampled steps."""

    name = "gradients"

    def __init__(self) -> None:
        self._run: RunContext | None = None
        self._names: dict[int, str] = {}
        self._cache: dict[tuple[object, ...], torch.Tensor] = {}
        self._done: set[tuple[int, int]] = set()
        self._pending: list[tuple[int, list[str], bool, Deferred]] = []
        self._steps: dict[int, dict[str, Any]] = {}
        self._params: dict[str, dict[str, Any]] = {}
        self._hist_held: dict[int, int] = {}
        self._hist_true: dict[int, int] = {}
        self._last_hist: dict[str, Any] = {}
        self._limit = 0

    def start(self, run: RunContext) -> None:
        """Registers with the scaler collector (stats before ``scaler.step`` unscales)."""
        self._run = run
        self._limit = int(getattr(run.config, "numerics_sample_elements", 0))
        run.extra.setdefault(BEFORE_SCALER_STEP, []).append(self._before_scaler_step)

    def on_model(self, run: RunContext, model: torch.nn.Module) -> None:
        """Learns parameter names."""
        prefix = "" if len(run.models) <= 1 else f"model{len(run.models) - 1}."
        for name, p in model.named_parameters():
            self._names.setdefault(id(p), prefix + name)

    def _before_scaler_step(self, scaler: Any, optimizer: torch.optim.Optimizer) -> None:
        if self._run is not None:
            self._measure(self._run, optimizer, scaler)

    def before_optimizer_step(self, run: RunContext, optimizer: torch.optim.Optimizer) -> None:
        """Measures the gradients the optimizer is about to use (on sampled steps)."""
        self._measure(run, optimizer, run.scaler)

    def _measure(self, run: RunContext, optimizer: torch.optim.Optimizer, scaler: Any) -> None:
        if not run.is_sampled() or (run.step, id(optimizer)) in self._done:
            return
        self._done.add((run.step, id(optimizer)))
        params = [
            p
            for group in optimizer.param_groups
            for p in group["params"]
            if p.grad is not None and not p.grad.is_sparse and p.grad.is_floating_point()
        ]
        if not params:
            return
        grads = [p.grad for p in params if p.grad is not None]
        by_device: dict[torch.device, list[int]] = {}
        for i, g in enumerate(grads):
            by_device.setdefault(g.device, []).append(i)
        scale = compat_scaler.scale_tensor(scaler)
        # Gradients still hold g·S until unscale_ ran (a fused optimizer unscales inside step).
        scaled = scale is not None and compat_scaler.stage(scaler, optimizer) == "ready"
        for dev, idx in by_device.items():
            group = [grads[i] for i in idx]
            with internal_work():
                norms = torch.stack([n.float() for n in torch._foreach_norm(group)])
                hists = raw_histograms(group, self._limit, self._cache)
                s = scale if scale is not None else torch.ones((), device=dev)
                packed = pack([hists, norms, s], dev)
            names = [self._names.get(id(params[i]), f"param{id(params[i]) % 100000}") for i in idx]
            self._pending.append((run.step, names, scaled, Deferred(packed)))

    def on_step_end(self, run: RunContext, step: int) -> None:
        """Reads the previous steps' results that are ready (never waits mid-run on CUDA)."""
        self._done = {k for k in self._done if k[0] > step}
        self._resolve(wait=False)

    def _resolve(self, wait: bool) -> None:
        keep = []
        for item in self._pending:
            if wait or item[3].ready():
                self._absorb(*item)
            else:
                keep.append(item)
        self._pending = keep

    def _absorb(self, step: int, names: list[str], scaled: bool, deferred: Deferred) -> None:
        values = deferred.values()
        p = len(names)
        hists = [values[i * 256 : (i + 1) * 256] for i in range(p)]
        norms = values[p * 256 : p * 256 + p]
        scale = values[-1]
        s = fp16range.log2_or_none(scale) or 0
        # held: the value as the (FP16) backward held it, g·S; true: the gradient g.
        held_shift, true_shift = (0, -s) if scaled else (s, 0)
        true_norm_factor = 1.0 / scale if scaled and scale else 1.0
        rec = self._steps.setdefault(
            step,
            {"step": step, "scale": scale, "grads_scaled": scaled, "norm_sq": 0.0}
            | dict.fromkeys(FIELDS, 0),
        )
        step_held: dict[int, int] = {}
        for name, hist, norm in zip(names, hists, norms, strict=True):
            counts = fp16range.range_counts(hist, held_shift)
            true_norm = norm * true_norm_factor
            for f in FIELDS:
                rec[f] += counts[f]
            rec["norm_sq"] += true_norm * true_norm
            prm = self._params.setdefault(
                name, dict.fromkeys(FIELDS, 0) | {"norm_last": 0.0, "norm_max": 0.0, "steps": 0}
            )
            for f in FIELDS:
                prm[f] += counts[f]
            prm["norm_last"] = true_norm
            prm["norm_max"] = max(prm["norm_max"], true_norm)
            prm["steps"] += 1
            exps = fp16range.exponent_counts(hist)
            fp16range.merge(step_held, {e + held_shift: c for e, c in exps.items()})
            fp16range.merge(self._hist_true, {e + true_shift: c for e, c in exps.items()})
        fp16range.merge(self._hist_held, step_held)
        self._last_hist = {"step": step, "held": step_held}

    def stop(self, run: RunContext) -> None:
        """Reads every outstanding result and unregisters."""
        self._resolve(wait=True)
        listeners = run.extra.get(BEFORE_SCALER_STEP, [])
        if self._before_scaler_step in listeners:
            listeners.remove(self._before_scaler_step)

    def section(self) -> dict[str, Any] | None:
        """Per-step totals, per-parameter sums over the sampled steps, log2|g| histograms."""
        self._resolve(wait=True)
        if not self._steps:
            return None
        steps = []
        for rec in sorted(self._steps.values(), key=lambda r: r["step"]):
            out = {k: v for k, v in rec.items() if k != "norm_sq"}
            out["norm"] = rec["norm_sq"] ** 0.5
            steps.append(out)
        params = []
        for name, prm in self._params.items():
            nz = prm["n"] - prm["zero"] - prm["nonfinite"]
            params.append(
                {"name": name, **prm}
                | {
                    "zero_fraction": prm["zero"] / prm["n"] if prm["n"] else 0.0,
                    "flush_fraction": prm["flush"] / nz if nz > 0 else 0.0,
                    "subnormal_fraction": prm["subnormal"] / nz if nz > 0 else 0.0,
                }
            )
        totals = dict.fromkeys(FIELDS, 0)
        for rec in steps:
            for f in FIELDS:
                totals[f] += rec[f]
        nz = totals["n"] - totals["zero"] - totals["nonfinite"]
        return {
            "sample_elements": self._limit,
            "steps": steps,
            "params": params,
            "totals": totals
            | {
                "zero_fraction": totals["zero"] / totals["n"] if totals["n"] else 0.0,
                "flush_fraction": totals["flush"] / nz if nz > 0 else 0.0,
                "subnormal_fraction": totals["subnormal"] / nz if nz > 0 else 0.0,
                "overflow_fraction": totals["overflow"] / nz if nz > 0 else 0.0,
            },
            # Sparse {log2 exponent: count}: as held in the backward (g·S) and true (g).
            "hist_held": {str(k): v for k, v in sorted(self._hist_held.items())},
            "hist_true": {str(k): v for k, v in sorted(self._hist_true.items())},
            "last_hist": {
                "step": self._last_hist.get("step"),
                "held": {str(k): v for k, v in sorted(self._last_hist.get("held", {}).items())},
            },
        }
