"""The precision audit: which dtype every ATen op of one sampled step really ran in, and why.

On the audited step (``DiagnoseConfig.precision_step``; which ops are audited:
docs/how-it-works.md, Precision audit) a TorchDispatchMode is entered at the root model's
first training forward and left before the optimizer step, so it sees the forward and the
backward *after* autocast's casts. Per op: the dtypes in and out, whether autocast was active,
the module (forward and backward), the FLOPs (torch.utils.flop_counter's formulas), the time,
and for every op that ran in FP32 one reason:

``autocast-fp32-policy``
    autocast keeps the op (or the composite it decomposes from) in FP32 on this device, or it
    consumes a tensor autocast up-cast for such an op.
``promotion``
    type promotion from an FP32 input (an FP32 parameter, input or activation) — e.g. the
    residual stream that stays FP32 because the embeddings are FP32.
``user-cast``
    it consumes a tensor the user's code cast to FP32 (``.float()``, ``.to(torch.float32)``).
``outside-autocast``
    autocast was not active: code outside the ``with torch.autocast`` block (a loss computed
    after it, or a region with ``enabled=False``), and its backward.
``unknown-op``
    an op autocast has no kernel for (custom ops, other namespaces): it runs in whatever dtype
    its inputs have.
``sdpa-math-fallback``
    ``F.scaled_dot_product_attention`` ran its math path, which casts BF16/FP16 inputs to FP32
    itself (on the CPU: with dropout, which no fused CPU kernel takes), and the ops it ran and
    their backward. Not autocast's policy: a model already on SDPA is never told to use it.
    Each call's settings (dropout, mask, head size, whether a fused kernel ran) are kept in
    ``sdpa`` so that the report can say why the fallback ran.

The audit changes nothing. Inside a dispatch mode's handler autocast is excluded, so a custom
op's Python body would silently run in FP32 under the audit; the handler therefore re-enables
autocast (as it was when the op was called) around ops autocast has no kernel for and that are
not ATen/prims ops, which is what the dispatcher does without the mode (autocast falls through
to the op's kernel with autocast still on). Casts are recorded as casts (``precision: "cast"``)
with an origin (``autocast``, ``user``, ``autograd`` for the backward of a cast, ``outside``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

from ampdiag.compat import autocast as ac
from ampdiag.compat.dispatch import flop_formula, op_name
from ampdiag.sources.live.collectors.base import is_internal_work
from ampdiag.sources.live.collectors.module_tracker import ModuleTracker, tensors_of
from ampdiag.sources.live.patching import Patches

LOW = frozenset({torch.float16, torch.bfloat16})
FP32 = frozenset({torch.float32, torch.float64})
REASONS = (
    "autocast-fp32-policy",
    "promotion",
    "user-cast",
    "outside-autocast",
    "unknown-op",
    "sdpa-math-fallback",
)
CAST_OPS = frozenset({"_to_copy", "copy_", "to", "_autocast_to_reduced_precision"})
CAST_METHODS = ("float", "double", "to", "type")
_REASON_RANK = {"sdpa-math-fallback": 0, "user-cast": 1, "autocast-fp32-policy": 2, "unknown-op": 3}
SDPA = "sdpa-math-fallback"
#: SDPA's fused kernels: one of them running means SDPA did not fall back to its math path.
SDPA_FUSED = frozenset(
    {
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_fused_attention_overrideable",
    }
)


_DT_NAMES: dict[torch.dtype, str] = {}


def _dt(dtype: torch.dtype) -> str:
    name = _DT_NAMES.get(dtype)
    if name is None:
        name = _DT_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


@dataclass
class _OpInfo:
    name: str
    overload: str
    foreign: bool
    is_cast: bool
    flops: Callable[..., Any] | None


class _UserCasts:
    """Observe-only patches of Tensor.float/.double/.to/.type: marks casts the user wrote."""

    def __init__(self) -> None:
        self.depth = 0
        self._patches = Patches()
        for name in CAST_METHODS:
            self._patches.wrap(torch.Tensor, name, self._make)

    def _make(self, original: Callable[..., Any]) -> Callable[..., Any]:
        owner = self

        def cast(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            owner.depth += 1
            try:
                return original(self, *args, **kwargs)
            finally:
                owner.depth -= 1

        cast.__doc__ = original.__doc__
        return cast

    def close(self) -> None:
        """Restores the methods."""
        self._patches.restore()


class _SdpaCalls:
    """An observe-only patch of ``F.scaled_dot_product_attention``: each call's settings.

    The audit cannot tell SDPA's math path from autocast by the ops alone (the math path's
    casts to FP32 happen while autocast is on); inside a call, it can.
    """

    def __init__(self) -> None:
        self.current: dict[str, Any] | None = None
        self.calls: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._patches = Patches()
        self._patches.wrap(torch.nn.functional, "scaled_dot_product_attention", self._make)

    def _make(self, original: Callable[..., Any]) -> Callable[..., Any]:
        owner = self

        def sdpa(*args: Any, **kwargs: Any) -> Any:
            if owner.current is not None:
                return original(*args, **kwargs)
            owner.current = call = _sdpa_settings(args, kwargs)
            try:
                return original(*args, **kwargs)
            finally:
                owner.current = None
                key = tuple(sorted((k, v) for k, v in call.items() if k != "fused"))
                row = owner.calls.setdefault(key, {**call, "count": 0})
                row["count"] += 1
                row["fused"] = bool(row.get("fused")) or bool(call.get("fused"))
                row["math"] = bool(row.get("math")) or bool(call.get("math"))

        sdpa.__doc__ = original.__doc__
        return sdpa

    def rows(self) -> list[dict[str, Any]]:
        """One row per distinct call: its settings, count, and which path ran."""
        return [dict(r) for r in self.calls.values()]

    def close(self) -> None:
        """Restores the function."""
        self._patches.restore()


def _sdpa_settings(args: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """What decides SDPA's path: device, dtype, dropout, mask, causal, head size."""
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
    given = dict(zip(names, args, strict=False)) | kwargs
    q = given.get("query")
    mask = given.get("attn_mask")
    return {
        "device": q.device.type if isinstance(q, torch.Tensor) else None,
        "dtype": _dt(q.dtype) if isinstance(q, torch.Tensor) else None,
        "dropout_p": float(given.get("dropout_p") or 0.0),
        "mask": None if mask is None else ("bool" if mask.dtype == torch.bool else "float"),
        "is_causal": bool(given.get("is_causal")),
        "head_dim": int(q.shape[-1]) if isinstance(q, torch.Tensor) and q.dim() else None,
        "grad": torch.is_grad_enabled(),
    }


def _make_audit_mode(audit: DtypeAudit) -> Any:
    base = ac.dispatch_mode_class()

    class AuditMode(base):  # type: ignore[misc, valid-type]
        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            return audit.handle(func, args, kwargs or {})

    return AuditMode()


class DtypeAudit:
    """One audit: the dispatch mode, the module tracker and the per-op records.

    Args:
        names: id(module) -> path, for the root and its submodules.
        fallback_autocast: Autocast state per device when the entry TLS cannot be read.
    """

    def __init__(self, names: dict[int, str], fallback_autocast: dict[str, bool]) -> None:
        self.tracker = ModuleTracker(names)
        self.casts = _UserCasts()
        self.sdpa = _SdpaCalls()
        self.fallback = fallback_autocast
        self.tags: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.rows: dict[tuple[Any, ...], dict[str, Any]] = {}
        self.fw_autocast: dict[str, bool] = {}
        self.autocast_dtypes: dict[str, str] = {}
        self.reenabled: set[str] = set()
        self.seen_backward = False
        self.other = {"count": 0, "time_us": 0.0}
        self.errors: list[str] = []
        self._info: dict[Any, _OpInfo] = {}
        self._events: list[tuple[dict[str, Any], Any, Any]] = []
        self._mode = _make_audit_mode(self)
        self._entered = False
        #: Whether the model's last forward trained (grad mode on as it began). Not the grad
        #: mode of each op: a custom op's body and autograd.Function.forward run without grad.
        self.training = True

    # --- lifecycle ----------------------------------------------------------------------------

    def enter(self, root: torch.nn.Module, args: Any) -> None:
        """Starts auditing (called from the root model's forward pre-hook)."""
        self.tracker.enter_root(root, args)
        self._mode.__enter__()
        self._entered = True

    def new_forward(self) -> None:
        """Another forward of the root (gradient accumulation): its ops are forward again."""
        self.seen_backward = False

    def exit(self) -> None:
        """Stops auditing; removes the mode, hooks and patches. Safe to call twice."""
        if self._entered:
            self._entered = False
            try:
                self._mode.__exit__(None, None, None)
            finally:
                self.tracker.close()
                self.casts.close()
                self.sdpa.close()
            self._resolve_events()
        else:
            self.tracker.close()
            self.casts.close()
            self.sdpa.close()

    # --- the handler --------------------------------------------------------------------------

    def info(self, func: Any) -> _OpInfo:
        """What is known of an op without running it (cached)."""
        got = self._info.get(func)
        if got is None:
            ns = func.namespace
            name, overload = op_name(func)
            got = _OpInfo(
                name=name,
                overload=overload,
                foreign=ns not in ("aten", "prims"),
                is_cast=name in CAST_OPS,
                flops=flop_formula(func),
            )
            self._info[func] = got
        return got

    def handle(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        """Runs the op exactly as without the audit, and records it."""
        if is_internal_work():  # another collector's statistics, not the model's work
            return func(*args, **kwargs)
        backward = ac.in_backward()
        if not backward and not self.training:
            # not the training step's own op: a forward under no_grad or inference_mode (a
            # generate callback, an eval loop) and what follows it (its sampling)
            return func(*args, **kwargs)
        info = self.info(func)
        inputs = [t for t in tensors_of(args) if isinstance(t, torch.Tensor)]
        inputs += list(tensors_of(kwargs))
        device = inputs[0].device.type if inputs else "cpu"
        state = ac.entry_autocast_state((device,))
        active = (state or self.fallback).get(device, False)
        reenable = False
        if active and info.foreign:
            reenable = not ac.op_has_autocast_kernel(func, device)
        start_ev = end_ev = None
        if device == "cuda":
            start_ev = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end_ev = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start_ev.record()
        t0 = time.perf_counter_ns()
        if reenable:
            out = self._call_with_autocast(func, args, kwargs, device)
            self.reenabled.add(f"{func.namespace}::{info.name}")
        else:
            out = func(*args, **kwargs)
        elapsed_us = (time.perf_counter_ns() - t0) / 1000.0
        if end_ev is not None:
            end_ev.record()
        try:
            row = self._record(func, info, args, kwargs, inputs, out, device, active, backward)
            if row is not None:
                row["time_us"] += elapsed_us
                if start_ev is not None:
                    self._events.append((row, start_ev, end_ev))
        except Exception as exc:  # the audit must never break the user's step
            msg = f"{info.name}: {exc!r}"
            if len(self.errors) < 20 and msg not in self.errors:
                self.errors.append(msg)
        return out

    def _call_with_autocast(self, func: Any, args: Any, kwargs: dict[str, Any], device: str) -> Any:
        """Calls an op with autocast on, as the dispatcher would have without the mode."""
        torch.set_autocast_enabled(device, True)
        try:
            return func(*args, **kwargs)
        finally:
            torch.set_autocast_enabled(device, False)

    # --- recording ----------------------------------------------------------------------------

    def _phase(self, backward: bool) -> str:
        if backward:
            self.seen_backward = True
            return "backward"
        if self.seen_backward and not self.tracker.stack:
            return "other"
        return "forward"

    def _record(
        self,
        func: Any,
        info: _OpInfo,
        args: Any,
        kwargs: dict[str, Any],
        inputs: list[torch.Tensor],
        out: Any,
        device: str,
        active: bool,
        backward: bool,
    ) -> dict[str, Any] | None:
        phase = self._phase(backward)
        if phase == "other":
            self.other["count"] += 1
            return None
        module = self.tracker.current if phase == "forward" else self.tracker.backward_module()
        if phase == "forward":
            self.fw_autocast[module] = self.fw_autocast.get(module, False) or active
            if active and device not in self.autocast_dtypes:
                self.autocast_dtypes[device] = _dt(torch.get_autocast_dtype(device))
        else:
            active = self.fw_autocast.get(module, False)
        outputs = list(tensors_of(out))
        in_f = [t for t in inputs if t.is_floating_point()]
        out_f = [t for t in outputs if t.is_floating_point()]
        precision, reason, cast_origin, cast_bytes = self._classify(
            info, in_f, out_f, device, active, backward
        )
        flops = 0
        if info.flops is not None and precision != "none":
            try:
                flops = int(info.flops(*args, **kwargs, out_val=out))
            except Exception:
                flops = 0
        key = (
            phase,
            module,
            info.name if not info.foreign else f"{func.namespace}::{info.name}",
            tuple(_dt(t.dtype) for t in inputs),
            tuple(_dt(t.dtype) for t in outputs),
            active,
            precision,
            reason,
            cast_origin,
        )
        row = self.rows.get(key) or self._new_row(key, info, device)
        row["count"] += 1
        row["flops"] += flops
        row["cast_bytes"] += cast_bytes
        return row

    def _classify(
        self,
        info: _OpInfo,
        in_f: list[torch.Tensor],
        out_f: list[torch.Tensor],
        device: str,
        active: bool,
        backward: bool,
    ) -> tuple[str, str | None, str | None, int]:
        """(precision, FP32 reason, cast origin, cast bytes) of one op; tags FP32 outputs."""
        compute = out_f[0].dtype if out_f else (in_f[0].dtype if in_f else None)
        if info.is_cast and in_f and out_f and in_f[-1].dtype != out_f[0].dtype:
            src, dst = in_f[-1], out_f[0]
            cast_bytes = src.numel() * src.element_size() + dst.numel() * dst.element_size()
            call = self.sdpa.current
            if call is not None and not backward and dst.dtype in FP32 and src.dtype in LOW:
                call["math"] = True  # SDPA's math path up-casts its inputs itself
                self._tag(out_f, SDPA)
                return "cast", None, "sdpa", cast_bytes
            if self.casts.depth > 0 and not backward:
                cast_origin = "user"
            elif backward:
                cast_origin = "autograd"
            elif active:
                cast_origin = "autocast"
            else:
                cast_origin = "outside"
            if dst.dtype in FP32:
                tag = {
                    "user": "user-cast",
                    "autocast": "autocast-fp32-policy",
                    "outside": "outside-autocast",
                }.get(cast_origin)
                self._tag(out_f, tag if tag is not None else self._input_tag(in_f))
            return "cast", None, cast_origin, cast_bytes
        if compute is None:
            return "none", None, None, 0
        call = self.sdpa.current
        if call is not None and info.name in SDPA_FUSED:
            call["fused"] = True
        if compute in LOW:
            return "low", None, None, 0
        if compute in FP32:
            reason = self._reason(info, device, active, in_f)
            self._tag(out_f, "outside-autocast" if reason == "outside-autocast" else reason)
            return "fp32", reason, None, 0
        return "none", None, None, 0

    def _new_row(self, key: tuple[Any, ...], info: _OpInfo, device: str) -> dict[str, Any]:
        """The row of ops alike in ``key`` (phase, module, op, dtypes, autocast, precision...)."""
        phase, module, op, ins, outs, active, precision, reason, cast_origin = key
        row: dict[str, Any] = {
            "phase": phase,
            "module": module,
            "op": op,
            "overload": info.overload,
            "in_dtypes": list(ins),
            "out_dtypes": list(outs),
            "autocast": active,
            "precision": precision,
            "reason": reason,
            "cast_origin": cast_origin,
            "count": 0,
            "flops": 0,
            "time_us": 0.0,
            "cast_bytes": 0,
        }
        if reason == SDPA or cast_origin == "sdpa":
            # on a GPU the same call runs a fused kernel: these ops would not run at all
            row["cuda_policy"] = "sdpa-fused"
        elif not info.foreign and phase == "forward" and device == "cpu":
            row["cuda_policy"] = ac.cuda_policy_for(info.name, info.overload)
        self.rows[key] = row
        return row

    def _reason(self, info: _OpInfo, device: str, active: bool, in_f: list[torch.Tensor]) -> str:
        call = self.sdpa.current
        if (call is not None and call.get("math")) or self._input_tag(in_f) == SDPA:
            return SDPA  # SDPA's math path (or its backward), whatever autocast's state
        if not active:
            return "outside-autocast"
        if info.foreign:
            return "unknown-op"
        if ac.autocast_registered(info.name, info.overload, device):
            return "autocast-fp32-policy"
        tag = self._input_tag(in_f)
        return tag if tag in _REASON_RANK else "promotion"

    def _input_tag(self, tensors: list[torch.Tensor]) -> str:
        best = "promotion"
        for t in tensors:
            if t.dtype not in FP32:
                continue
            tag = self.tags.get(t)  # type: ignore[no-untyped-call]
            if tag in _REASON_RANK and _REASON_RANK[tag] < _REASON_RANK.get(best, 9):
                best = tag
        return best

    def _tag(self, tensors: list[torch.Tensor], tag: str) -> None:
        for t in tensors:
            if t.dtype in FP32:
                self.tags[t] = tag

    def _resolve_events(self) -> None:
        if not self._events:
            return
        torch.cuda.synchronize()
        for row, start, end in self._events:
            row.setdefault("device_time_us", 0.0)
            row["device_time_us"] += float(start.elapsed_time(end)) * 1000.0
        self._events.clear()
