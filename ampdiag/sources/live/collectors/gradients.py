"""Parameter-gradient statistics on sampled steps, measured on the device in a few fused passes.

Just before the optimizer uses the gradients (``scaler.step`` or ``optimizer.step``): one
``_foreach_norm`` pass (stacked with the loss scale) and one exponent histogram of every
gradient at once (`_exponents.sampled_signed_histograms`), one transfer to the host per
sampled step (`_host.Deferred`), where numpy turns them into the figures. On the CPU nothing is
transferred: numpy counts the same gathered buffer (`_exponents.host_signed_histograms`,
cheaper than torch ops on arrays this small).

Under autocast only a parameter autocast cast has an FP16 gradient: a LayerNorm's or an
embedding's weight (FP32-policy ops) gets an FP32 one, whose small values FP16 never held. The
loss's graph tells them apart (`fp32_computed`), and ``totals["fp16_computed"]`` counts the
others alone. A run that casts no parameter has no such split.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ampdiag.analysis import fp16range
from ampdiag.compat import scaler as compat_scaler
from ampdiag.compat.dtensor import local_tensor
from ampdiag.compat.foreach import foreach_norm
from ampdiag.schema import GradientsSection
from ampdiag.sources.live.collectors import COLLECTORS
from ampdiag.sources.live.collectors._exponents import (
    host_signed_histograms,
    sampled_signed_histograms,
    shares,
)
from ampdiag.sources.live.collectors._host import Deferred, absorb_ready, grown
from ampdiag.sources.live.collectors.base import Collector, RunContext, graph_nodes, internal_work

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

_LOW = (torch.float16, torch.bfloat16)
FIELDS = ("n", "zero", "flush", "subnormal", "overflow", "nonfinite")


#: Most sampled steps whose totals are kept (thinned evenly past it; sums cover all).
MAX_STEP_RECORDS = 2000


@COLLECTORS.register
class GradientsCollector(Collector):
    """Gradient statistics per parameter and in total on sampled steps."""

    name = "gradients"
    enabled_by = "numerics"

    def __init__(self) -> None:
        self._run: RunContext | None = None
        self._names: dict[int, str] = {}
        self._cache: dict[Any, Any] = {}  # the sampling plans and their buffers
        self._done: set[tuple[int, int]] = set()
        self._pending: list[tuple[int, list[str], bool, list[bool], Deferred]] = []
        self._fp32_ids: set[int] = set()  # this step: parameters with FP32-computed grads
        self._fp32_names: set[str] = set()
        self._fp16_acc: npt.NDArray[np.int64] | None = None  # FIELDS sums, the others
        self._steps: dict[int, dict[str, Any]] = {}
        # Per parameter (one row each, in order of first sight): FIELDS sums, norms, steps.
        self._rows: dict[str, int] = {}
        self._acc: npt.NDArray[np.int64] | None = None
        self._norm_last: npt.NDArray[np.float64] | None = None
        self._norm_max: npt.NDArray[np.float64] | None = None
        self._nsteps: npt.NDArray[np.int64] | None = None
        self._hist_held: dict[int, int] = {}
        self._hist_true: dict[int, int] = {}
        self._last_hist: dict[str, Any] = {}
        self._limit = 0

    def start(self, run: RunContext) -> None:
        """Registers with the scaler collector (stats before ``scaler.step`` unscales)."""
        self._run = run
        self._limit = int(getattr(run.config, "numerics_sample_elements", 0))
        run.before_scaler_step.append(self._before_scaler_step)

    def on_model(self, run: RunContext, model: torch.nn.Module) -> None:
        """Learns parameter names."""
        prefix = "" if len(run.models) <= 1 else f"model{len(run.models) - 1}."
        for name, p in model.named_parameters():
            self._names.setdefault(id(p), prefix + name)

    def _before_scaler_step(self, scaler: Any, optimizer: torch.optim.Optimizer) -> None:
        if self._run is not None:
            self._measure(self._run, optimizer, scaler)

    def on_loss(self, run: RunContext, loss: torch.Tensor, from_scaler: bool) -> None:
        """On a sampled step, learns which parameters' gradients the backward computes in FP32."""
        if run.is_sampled() and loss.grad_fn is not None:
            with internal_work():
                self._fp32_ids |= fp32_computed(loss.grad_fn)

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
        # FSDP2/DTensor gradients: the statistics of this rank's shard (a DTensor has no
        # strided views, and its global size is not what this rank holds)
        grads = [local_tensor(p.grad) for p in params if p.grad is not None]
        by_device: dict[torch.device, list[int]] = {}
        for i, g in enumerate(grads):
            by_device.setdefault(g.device, []).append(i)
        scale = compat_scaler.scale_tensor(scaler)
        # Gradients still hold g·S until unscale_ ran (a fused optimizer unscales inside step).
        scaled = scale is not None and compat_scaler.stage(scaler, optimizer) == "ready"
        for dev, idx in by_device.items():
            group = grads if len(idx) == len(grads) else [grads[i] for i in idx]
            s = scale if scale is None or scale.device == dev else scale.to(dev)
            with internal_work():
                deferred = device_stats(group, self._limit, self._cache, s)
            names = [self._names.get(id(params[i]), f"param{id(params[i]) % 100000}") for i in idx]
            fp32 = [id(params[i]) in self._fp32_ids and params[i].dtype not in _LOW for i in idx]
            self._pending.append((run.step, names, scaled, fp32, deferred))

    def on_step_end(self, run: RunContext, step: int) -> None:
        """Reads the previous steps' results that are ready (never waits mid-run on CUDA)."""
        self._fp32_ids = set()
        if self._done:
            self._done = {k for k in self._done if k[0] > step}
        if self._pending:
            self._resolve(wait=False)

    def _resolve(self, wait: bool) -> None:
        self._pending = absorb_ready(self._pending, self._absorb, wait)

    def _param_rows(self, names: list[str]) -> npt.NDArray[np.intp]:
        import numpy as np

        for name in names:
            if name not in self._rows:
                self._rows[name] = len(self._rows)
        total = len(self._rows)
        if self._acc is None or self._acc.shape[0] < total:
            grow = total - (0 if self._acc is None else self._acc.shape[0])
            self._acc = grown(self._acc, grow, (len(FIELDS),), np.int64)
            self._norm_last = grown(self._norm_last, grow, (), np.float64)
            self._norm_max = grown(self._norm_max, grow, (), np.float64)
            self._nsteps = grown(self._nsteps, grow, (), np.int64)
        return np.fromiter((self._rows[n] for n in names), dtype=np.intp, count=len(names))

    def _absorb(
        self, step: int, names: list[str], scaled: bool, fp32: list[bool], deferred: Deferred
    ) -> None:
        import numpy as np

        signed, tail = deferred.arrays()
        hists = signed.reshape(-1, 2, 256).sum(axis=1)
        norms = tail[:-1].astype(np.float64)
        scale = float(tail[-1])
        s = fp16range.log2_or_none(scale) or 0
        # held: the value as the (FP16) backward held it, g·S; true: the gradient g.
        held_shift, true_shift = (0, -s) if scaled else (s, 0)
        true_norms = norms * (1.0 / scale if scaled and scale else 1.0)
        counts = fp16range.range_counts_rows(hists, held_shift)
        table = np.stack([counts[f] for f in FIELDS], axis=1)  # (params, FIELDS)
        rows = self._param_rows(names)
        assert self._acc is not None and self._norm_last is not None
        assert self._norm_max is not None and self._nsteps is not None
        np.add.at(self._acc, rows, table)
        fp16 = ~np.asarray(fp32, dtype=bool)
        if self._fp16_acc is None:
            self._fp16_acc = np.zeros(len(FIELDS), dtype=np.int64)
        self._fp16_acc += table[fp16].sum(axis=0)
        self._fp32_names.update(n for n, f in zip(names, fp32, strict=True) if f)
        self._norm_last[rows] = true_norms
        np.fmax.at(self._norm_max, rows, true_norms)  # a NaN norm does not erase the max
        np.add.at(self._nsteps, rows, 1)
        if step not in self._steps and len(self._steps) >= MAX_STEP_RECORDS:
            # A long run: every other record dropped, so those kept span the whole run.
            kept = sorted(self._steps)[::2]
            self._steps = {k: self._steps[k] for k in kept}
        rec = self._steps.setdefault(
            step,
            {"step": step, "scale": scale, "grads_scaled": scaled, "norm_sq": 0.0}
            | dict.fromkeys(FIELDS, 0),
        )
        for f, total in zip(FIELDS, table.sum(axis=0).tolist(), strict=True):
            rec[f] += int(total)
        rec["norm_sq"] += float(np.dot(true_norms, true_norms))
        agg = hists.sum(axis=0)
        bins = np.flatnonzero(agg[1:255]) + 1  # normal bins only (as exponent_counts)
        exps = bins - fp16range.BIAS
        counts_list = agg[bins].tolist()
        step_held = dict(zip((exps + held_shift).tolist(), counts_list, strict=True))
        true = dict(zip((exps + true_shift).tolist(), counts_list, strict=True))
        fp16range.merge(self._hist_true, true)
        fp16range.merge(self._hist_held, step_held)
        if self._last_hist.get("step") == step:  # a second optimizer in the same step
            fp16range.merge(step_held, self._last_hist["held"])
        self._last_hist = {"step": step, "held": step_held}

    def stop(self, run: RunContext) -> None:
        """Reads every outstanding result and unregisters."""
        self._resolve(wait=True)
        if self._before_scaler_step in run.before_scaler_step:
            run.before_scaler_step.remove(self._before_scaler_step)

    def section(self) -> GradientsSection | None:
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
        if self._acc is not None:
            assert self._norm_last is not None and self._norm_max is not None
            assert self._nsteps is not None
            acc, last, top, nst = (
                self._acc.tolist(),
                self._norm_last.tolist(),
                self._norm_max.tolist(),
                self._nsteps.tolist(),
            )
            for name, row in self._rows.items():
                prm: dict[str, Any] = dict(zip(FIELDS, acc[row], strict=True))
                prm |= {"norm_last": last[row], "norm_max": top[row], "steps": nst[row]}
                if name in self._fp32_names:
                    prm["computed_in"] = "float32"
                params.append({"name": name, **prm} | shares(prm))
        totals = dict.fromkeys(FIELDS, 0)
        for rec in steps:
            for f in FIELDS:
                totals[f] += rec[f]
        split: dict[str, Any] = {}
        if self._fp32_names and self._fp16_acc is not None:
            fp16 = dict(zip(FIELDS, self._fp16_acc.tolist(), strict=True))
            split["fp16_computed"] = fp16 | shares(fp16) | {"fp32_params": len(self._fp32_names)}
        return {
            "sample_elements": self._limit,
            "steps": steps,
            "params": params,
            "totals": totals | shares(totals, overflow=True) | split,
            # Sparse {log2 exponent: count}: as held in the backward (g·S) and true (g).
            "hist_held": {str(k): v for k, v in sorted(self._hist_held.items())},
            "hist_true": {str(k): v for k, v in sorted(self._hist_true.items())},
            "last_hist": {
                "step": self._last_hist.get("step"),
                "held": {str(k): v for k, v in sorted(self._last_hist.get("held", {}).items())},
            },
        }


def fp32_computed(root: Any) -> set[int]:
    """Ids of the parameters whose gradient the graph under ``root`` computes in FP32.

    A parameter autocast uses is cast (``ToCopyBackward0`` above its ``AccumulateGrad``): its
    gradient arrives as the cast's low-precision one. One the backward reaches only from
    other nodes is computed in its own dtype. Empty when the graph casts no parameter (no
    autocast: nothing to tell apart).
    """
    cast: set[int] = set()
    direct: set[int] = set()
    for node in graph_nodes(root):
        is_cast = node.name() == "ToCopyBackward0"
        for nxt, _ in node.next_functions:
            variable = getattr(nxt, "variable", None)
            if isinstance(variable, torch.Tensor):
                (cast if is_cast else direct).add(id(variable))
    return direct - cast if cast else set()


def device_stats(
    grads: list[torch.Tensor],
    limit: int,
    cache: dict[Any, Any],
    scale: torch.Tensor | None = None,
) -> Deferred:
    """A sampled step's device work for gradients on one device, on its way to the host.

    One ``_foreach_norm`` pass stacked with the loss scale (float32, ``len(grads) + 1``) and
    the exponent histograms by sign (``(len(grads), 2, 256)`` int64; the host folds the
    sign): two tensors, one transfer. CPU gradients: the same two arrays, made on the host
    (`Deferred.on_host`).
    """
    norms = foreach_norm(grads)
    if grads[0].is_cpu:
        # Already on the host: count in numpy, read the norms as they are (no stack, no copy).
        import numpy as np

        signed = host_signed_histograms(grads, limit, cache)
        values = [*map(float, norms), 1.0 if scale is None else float(scale)]
        return Deferred.on_host([signed, np.array(values, dtype=np.float32)])
    hists = sampled_signed_histograms(grads, limit, cache)
    tail = list(norms)
    tail.append(scale if scale is not None else torch.ones((), device=grads[0].device))
    stacked = torch.stack(tail)
    if stacked.dtype != torch.float32:
        stacked = stacked.float()
    return Deferred([hists, stacked], copy=False)
