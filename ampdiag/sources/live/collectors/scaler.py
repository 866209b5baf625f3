"""GradScaler telemetry and misuse detection.

Observe-only patches of ``GradScaler.step``, ``GradScaler.unscale_`` and
``torch.nn.utils.clip_grad_norm_`` / ``clip_grad_value_`` record, per step: the scale the loss
was scaled with, whether the step was skipped (the scaler's own found-inf tensors, which every
path fills, the fused-optimizer one included, where ``optimizer.step()`` always runs), and the
scale after ``update()``. These are 0-dim device tensors, cloned (no sync) and copied to the
host in batches. Misuse seen on the way: clipping still-scaled gradients, ``optimizer.step()``
called while a scaler is active but outside ``scaler.step``, fp16 parameters in an optimizer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ampdiag.compat import scaler as compat_scaler
from ampdiag.schema import ScalerSection
from ampdiag.sources.live.collectors import COLLECTORS
from ampdiag.sources.live.collectors._host import Deferred, pack
from ampdiag.sources.live.collectors.base import Collector, RunContext
from ampdiag.sources.live.patching import Patches
from ampdiag.sources.live.steps import ThinnedRows

FLUSH_EVERY = 64
MAX_EVENTS = 50
#: Most step numbers listed per kind of event (skipped, growth, backoff); all are counted.
MAX_EVENT_STEPS = 10_000


@COLLECTORS.register
class ScalerCollector(Collector):
    """Scale history, skipped steps, growth/backoff, and misuse of the AMP API."""

    name = "scaler"
    enabled_by = "numerics"

    def __init__(self) -> None:
        self._run: RunContext | None = None
        self._patches = Patches()
        self._in_step = 0
        self._step_rows: dict[int, dict[str, Any]] = {}
        self._buffer: list[tuple[int, torch.Tensor]] = []
        self._pending: list[tuple[list[int], Deferred]] = []
        # Columns: scale, skipped, scale after update(); bounded (see start()).
        self._history = ThinnedRows(10_000, "dBd")
        self._totals = {"steps": 0, "skipped": 0, "growth": 0, "backoff": 0}
        self._events: dict[str, list[int]] = {"skipped": [], "growth": [], "backoff": []}
        self._scale_min: float | None = None
        self._unscale_calls = 0
        self._clips: list[dict[str, Any]] = []
        self._clip_pending: list[tuple[dict[str, Any], torch.Tensor | None]] = []
        self._bypassed: list[int] = []
        self._fp16: dict[str, dict[str, Any]] = {}
        self._checked: set[int] = set()
        self._scaler_info: dict[str, Any] | None = None

    # --- lifecycle --------------------------------------------------------------------------

    def start(self, run: RunContext) -> None:
        """Installs the observe-only patches."""
        self._run = run
        self._history = ThinnedRows(run.config.max_steps_recorded, "dBd")
        cls = torch.amp.GradScaler
        self._patches.wrap(cls, "step", self._make_step)
        self._patches.wrap(cls, "unscale_", self._make_unscale)
        import torch.nn.utils as nn_utils
        import torch.nn.utils.clip_grad as clip_mod

        for owner in (nn_utils, clip_mod):
            for fname in ("clip_grad_norm_", "clip_grad_value_"):
                if hasattr(owner, fname):
                    self._patches.wrap(owner, fname, self._make_clip(fname))

    def stop(self, run: RunContext) -> None:
        """Removes the patches and reads what is still on the device."""
        self._patches.restore()
        self._flush()
        for _, d in self._pending:
            d.values()  # wait once, at the end
        self._resolve(wait=True)

    # --- patches ----------------------------------------------------------------------------

    def _make_step(self, original: Callable[..., Any]) -> Callable[..., Any]:
        coll = self

        def step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            coll._safe(coll._before_step, self, optimizer)
            coll._in_step += 1
            try:
                result = original(self, optimizer, *args, **kwargs)
            finally:
                coll._in_step -= 1
            coll._safe(coll._after_step, self, optimizer)
            return result

        return step

    def _make_unscale(self, original: Callable[..., Any]) -> Callable[..., Any]:
        coll = self

        def unscale_(self: Any, optimizer: Any) -> Any:
            coll._safe(coll._check_params, optimizer)
            coll._unscale_calls += 1
            return original(self, optimizer)

        return unscale_

    def _make_clip(self, fname: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        coll = self

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def clip(*args: Any, **kwargs: Any) -> Any:
                result = original(*args, **kwargs)
                coll._safe(coll._saw_clip, fname, args, kwargs, result)
                return result

            clip.__doc__ = original.__doc__
            clip.__wrapped__ = original  # type: ignore[attr-defined]
            return clip

        return make

    def _safe(self, fn: Callable[..., None], *args: Any) -> None:
        # Observing must never break the user's step.
        try:
            fn(*args)
        except Exception as exc:  # pragma: no cover - defensive
            if self._run is not None:
                notes = self._run.numerics_errors
                if len(notes) < 10:
                    notes.append(repr(exc))

    # --- observations -----------------------------------------------------------------------

    def _before_step(self, scaler: Any, optimizer: Any) -> None:
        run = self._run
        assert run is not None
        self._check_params(optimizer)
        for callback in list(run.before_scaler_step):
            callback(scaler, optimizer)
        if scaler is run.scaler or run.scaler is None:
            scale = compat_scaler.scale_tensor(scaler)
            row = self._step_rows.setdefault(run.step, {"found": [], "scale": None})
            if scale is not None and row["scale"] is None:
                row["scale"] = scale.detach().clone()

    def _after_step(self, scaler: Any, optimizer: Any) -> None:
        run = self._run
        assert run is not None
        row = self._step_rows.get(run.step)
        if row is not None:
            row["found"].extend(compat_scaler.found_inf(scaler, optimizer))

    def _saw_clip(self, fname: str, args: Any, kwargs: Any, result: Any) -> None:
        run = self._run
        assert run is not None
        scaler = run.scaler
        if scaler is None or not compat_scaler.is_enabled(scaler):
            return
        scale = compat_scaler.scale_tensor(scaler)
        if scale is None:
            return
        scaled = not compat_scaler.any_unscaled(scaler)
        limit = args[1] if len(args) > 1 else kwargs.get("max_norm", kwargs.get("clip_value"))
        event = {
            "step": run.step,
            "function": fname,
            "limit": float(limit) if isinstance(limit, (int, float)) else None,
            "grads_scaled": scaled,
        }
        if len(self._clips) + len(self._clip_pending) < MAX_EVENTS:
            norm = result.detach().float().clone() if isinstance(result, torch.Tensor) else None
            event["_scale"] = scale.detach().clone()
            self._clip_pending.append((event, norm))

    def _check_params(self, optimizer: Any) -> None:
        if id(optimizer) in self._checked:
            return
        self._checked.add(id(optimizer))
        names = {}
        run = self._run
        if run is not None:
            for model in run.models:
                for n, p in model.named_parameters():
                    names[id(p)] = n
        key = f"{type(optimizer).__name__}#{len(self._checked)}"
        count = numel = 0
        examples: list[str] = []
        total = 0
        for group in getattr(optimizer, "param_groups", []):
            for p in group["params"]:
                total += 1
                if p.dtype == torch.float16:
                    count += 1
                    numel += p.numel()
                    if len(examples) < 5:
                        examples.append(names.get(id(p), f"param{total - 1}"))
        if count:
            self._fp16[key] = {
                "optimizer": type(optimizer).__name__,
                "fp16_params": count,
                "fp16_numel": numel,
                "params": total,
                "examples": examples,
            }

    def on_optimizer(self, run: RunContext, optimizer: torch.optim.Optimizer) -> None:
        """Checks the optimizer's parameters for fp16 (model.half() instead of autocast)."""
        self._check_params(optimizer)

    def before_optimizer_step(self, run: RunContext, optimizer: torch.optim.Optimizer) -> None:
        """Notes an ``optimizer.step()`` that bypasses an active, enabled scaler."""
        self._check_params(optimizer)
        scaler = run.scaler
        active = scaler is not None and compat_scaler.is_enabled(scaler)
        new = not self._bypassed or self._bypassed[-1] != run.step
        if self._in_step == 0 and active and new and len(self._bypassed) < MAX_EVENT_STEPS:
            self._bypassed.append(run.step)

    def on_step_end(self, run: RunContext, step: int) -> None:
        """Queues this step's scale, found-inf and scale-after-update (device tensors)."""
        scaler = run.scaler
        if scaler is not None and self._scaler_info is None:
            self._scaler_info = {
                "class": type(scaler).__name__,
                "enabled": compat_scaler.is_enabled(scaler),
                "device": compat_scaler.device(scaler),
                **compat_scaler.settings(scaler),
            }
        row = self._step_rows.pop(step, None)
        self._step_rows = {k: v for k, v in self._step_rows.items() if k > step}
        after = compat_scaler.scale_tensor(scaler)
        if row is None or row["scale"] is None or after is None:
            return
        dev = row["scale"].device
        found = (
            torch.stack([f.to(dev, torch.float32) for f in row["found"]]).sum()
            if row["found"]
            else torch.full((), -1.0, device=dev)
        )
        self._buffer.append((step, torch.stack([row["scale"].float(), found, after.float()])))
        if len(self._buffer) >= FLUSH_EVERY:
            self._flush()
        self._resolve(wait=False)

    def _flush(self) -> None:
        if not self._buffer:
            return
        steps = [s for s, _ in self._buffer]
        packed = pack([t for _, t in self._buffer], self._buffer[0][1].device)
        self._pending.append((steps, Deferred(packed)))
        self._buffer = []

    def _resolve(self, wait: bool) -> None:
        keep = []
        for steps, d in self._pending:
            if not (wait or d.ready()):
                keep.append((steps, d))
                continue
            values = d.values()
            for i, step in enumerate(steps):
                scale, found, after = values[3 * i : 3 * i + 3]
                skipped = found > 0 if found >= 0 else after < scale
                self._count(step, scale, bool(skipped), after)
        self._pending = keep
        if wait:
            for event, norm in self._clip_pending:
                scale_t = event.pop("_scale")
                event["scale"] = float(scale_t.item())
                event["total_norm"] = float(norm.item()) if norm is not None else None
                self._clips.append(event)
            self._clip_pending = []

    def _count(self, step: int, scale: float, skipped: bool, after: float) -> None:
        """Adds one step to the totals, the (bounded) event lists and the (thinned) history."""
        self._totals["steps"] += 1
        low = min(scale, after)
        self._scale_min = low if self._scale_min is None else min(self._scale_min, low)
        for name, happened in (
            ("skipped", skipped),
            ("growth", after > scale),
            ("backoff", after < scale),
        ):
            if happened:
                self._totals[name] += 1
                if len(self._events[name]) < MAX_EVENT_STEPS:
                    self._events[name].append(step)
        self._history.add(step, scale, skipped, after)

    # --- section ----------------------------------------------------------------------------

    def section(self) -> ScalerSection | None:
        """Scale history, skips, growth/backoff, misuse."""
        run = self._run
        if run is None:
            return None
        self._resolve(wait=True)
        scales, skips, afters = self._history.columns
        history = [
            {"step": step, "scale": scales[i], "skipped": bool(skips[i]), "scale_after": afters[i]}
            for i, step in enumerate(self._history.index)
        ]
        info = self._scaler_info
        if info is None and run.scaler is not None:
            info = {
                "class": type(run.scaler).__name__,
                "enabled": compat_scaler.is_enabled(run.scaler),
                "device": compat_scaler.device(run.scaler),
                **compat_scaler.settings(run.scaler),
            }
        return {
            "present": run.scaler is not None,
            "scaler": info,
            "history": history,
            "history_stride": self._history.stride,
            "steps_total": self._totals["steps"],
            "skipped_total": self._totals["skipped"],
            "growth_total": self._totals["growth"],
            "backoff_total": self._totals["backoff"],
            "scale_min": self._scale_min,
            "skipped_steps": self._events["skipped"],
            "growth_steps": self._events["growth"],
            "backoff_steps": self._events["backoff"],
            "unscale_calls": self._unscale_calls,
            "clip_events": self._clips,
            "bypassed_steps": self._bypassed,
            "fp16_params": list(self._fp16.values()),
            "errors": list(run.numerics_errors),
        }
