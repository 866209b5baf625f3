"""The first non-finite step, replayed in FP32 (and BF16): is the divergence precision's fault?

A run whose loss becomes NaN in FP16 may be FP16's fault (an activation beyond 65504, a scaled
gradient that overflows) or not (a learning rate too high diverges in FP32 too; a 0/0 in one
batch is a 0/0 in every precision). Only a measurement tells them apart: the same step, from
the same weights and batch, computed in FP32 -- and in BF16 where the run was FP16.

`ReplayKeeper` (driven by the sentinel) is given, cheaply, only what such a replay needs and only
until the step ends: the sentinel's root hooks keep references to the model's forward inputs
(the user's batch tensors, which the step holds anyway) and to the gradient arriving at the
model's output, with the loss scale it carries (`RootCall`), and reduce the model's output and
that gradient to one value each; the sentinel's check of the step reads them with the losses
and the parameter gradients once (one host read per step: before the optimizer step, when one
runs, else at the step's end; a GradScaler reads its own found-inf there already). On a
GPU without an enabled GradScaler that read would make the host wait for the device on every
step, so there the keeper keeps and reads nothing and says why (the divergence's cause then
rests on the loss trend, or is unknown). At the
FIRST non-finite step, before the weights change (before the optimizer step; when the
GradScaler skipped the step, at its end: the weights did not change), `replay_step` runs that
step's forward (and its backward, from the captured output gradient divided by the loss scale,
where that is finite) on a hook-free replica (`fp32_replay.replaying`: RNG forked, buffers
restored; ``torch.autograd.grad`` leaves every ``.grad`` alone). Then it stops: no hook, no
reference, no read is left for the rest of the run.

A backward-only inf/NaN under an enabled GradScaler is the scaler finding its scale (it skips
the step and halves the scale): it triggers the replay only when it persists
(`PERSISTENT_SKIPS` steps in a row).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from ampdiag.analysis.compute import precision_of
from ampdiag.compat import scaler as compat_scaler
from ampdiag.compat.autocast import AutocastHeldOff
from ampdiag.compat.dtensor import fsdp_mixed_precision, is_dtensor, local_tensor
from ampdiag.compat.modules import (
    State,
    changed_state,
    keep_state,
    state_attributes,
    uncompiled,
)
from ampdiag.sources.live.collectors._finite import max_abs_token
from ampdiag.sources.live.collectors.base import RunContext, internal_work, tensors_in
from ampdiag.sources.live.collectors.fp32_replay import (
    MAX_OUTPUT_VALUES,
    low_precision_state,
    replaying,
    upcast_inputs,
)

#: Backward-only non-finite steps in a row (an enabled GradScaler skipping them) from which the
#: skips are not the scaler searching its scale (from torch's 65536 it halves to 256 in 8
#: skips): the replay runs on the last of them.
PERSISTENT_SKIPS = 8
#: Why a GPU run without an enabled GradScaler is not checked (`ReplayKeeper`).
NOT_CHECKED_ON_GPU = (
    "not checked: on a GPU without an enabled GradScaler the per-step check would make the "
    "host wait for the device on every step"
)


@dataclass(eq=False, slots=True)  # compared by identity (its fields hold tensors)
class RootCall:
    """One forward of the root model in the step (a micro-batch), kept until the step's check.

    Recorded by the sentinel's two root hooks (`sentinel.Sentinel`), read by its check and by
    the replay here: references to the forward's inputs, the model's own state, the autocast
    and RNG states it began with (what a replay enters again), and one 0-dim token each for
    its output, its losses and the gradient at its output (each finite exactly when what it
    stands for is: `sentinel.finite_token`), with a reference to that gradient and the loss
    scale it carries. Where the sentinel checks the step itself (a CPU model), ``out`` and
    ``grads`` hold the tensors until its check, which reduces them with the rest and leaves
    tokens there when the step is not clean (what `ReplayKeeper` then reads).
    """

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    state: State
    autocast: list[tuple[str, torch.dtype]]
    rng: torch.Tensor | None
    out: list[torch.Tensor] = field(default_factory=list)
    losses: list[torch.Tensor] = field(default_factory=list)
    grads: list[torch.Tensor] = field(default_factory=list)
    grad: torch.Tensor | None = None
    scale: torch.Tensor | None = None


class ReplayKeeper:
    """Reads a step's root forwards (`RootCall`) at its check; replays the first non-finite step."""

    def __init__(self) -> None:
        self._names: dict[int, str] = {}
        self._root: torch.nn.Module | None = None
        self._params: list[torch.nn.Parameter] = []
        self._calls: list[RootCall] = []
        self._checked = False
        self._skips_in_row = 0
        # "forward" (the loss or the forward non-finite), "backward" (only the backward)
        self._records: dict[str, dict[str, Any]] = {}
        self._not_checked: str | None = None  # why this run is not watched (a GPU, no scaler)
        self._weights_start: dict[str, Any] | None = None  # `_weights` at the first check
        # attributes holding tensors (a recurrent state kept between steps): found at the
        # model and again after the first step (one created by the first forward)
        self._state_at: list[tuple[torch.nn.Module, str]] | None = None
        self._state_seen = False

    @property
    def done(self) -> bool:
        """Whether the replay of a non-finite forward ran or was given up (nothing is kept).

        A replay of persistent backward-only skips does not end the watch: the run may go on
        to a non-finite loss, whose replay is the one the divergence rests on.
        """
        return "forward" in self._records

    @property
    def watching(self) -> bool:
        """Whether the step's root forwards are still wanted here (a replay may yet run)."""
        return self._root is not None and not self.done and self._not_checked is None

    # --- lifecycle --------------------------------------------------------------------------

    def on_model(self, model: torch.nn.Module) -> None:
        """Watches the first model (its root forwards come from the sentinel's hooks)."""
        if self._root is not None or self.done:
            return
        self._root = model
        # a compiled model's submodules by the names the user knows (no "_orig_mod.")
        for name, m in uncompiled(model)[0].named_modules():
            self._names.setdefault(id(m), name or f"({type(m).__name__})")
        for name, m in model.named_modules():
            self._names.setdefault(id(m), name or f"({type(m).__name__})")
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._state_at = state_attributes(model)

    def stop(self) -> None:
        """Drops every reference."""
        self._calls = []

    def state_now(self) -> State:
        """The model's own state as a root forward begins (references, no copy)."""
        return keep_state(self._state_at) if self._state_at and self.watching else []

    # --- the check --------------------------------------------------------------------------

    def before_optimizer_step(
        self, run: RunContext, calls: list[RootCall], finite: bool = False
    ) -> None:
        """Checks the step before its weights change; replays it when non-finite.

        ``calls``: the step's root forwards; ``finite``: the sentinel's own check of this step
        found it finite (not read again).
        """
        if finite and calls and not self._checked and self._weights_start is not None:
            self._checked, self._skips_in_row = True, 0  # a clean step: nothing to read
            return
        self._calls = calls
        if not self._checked and self.watching and self._calls:
            self._checked = True
            self._check(run, run.step, "before the optimizer step", finite)

    def on_step_end(
        self, run: RunContext, step: int, calls: list[RootCall], finite: bool = False
    ) -> None:
        """Checks a step that ran no optimizer step (a GradScaler skip); drops the inputs."""
        self._calls = calls
        if not self._checked and self.watching and self._calls:
            self._check(run, step, "at the step's end (no optimizer step ran)", finite)
        self._calls = []
        self._checked = False
        if not self._state_seen and self._root is not None:  # made by the first forward
            self._state_seen = True
            self._state_at = state_attributes(self._root)
        record = self._records.get("forward")
        if record is not None and record.get("step") == step and "error" not in record:
            record["parameters_finite_after"] = self._parameters_finite()

    def _parameters_finite(self) -> bool | None:
        """Whether every weight is finite after the replayed step's update (one read, once)."""
        try:
            with internal_work(), torch.no_grad():
                weights = [local_tensor(p.detach()) for p in self._params]
                return bool(torch.isfinite(torch.nn.utils.get_total_norm(weights, math.inf)))
        except Exception:  # a refinement: unmeasured, never the user's problem
            return None

    def _weights(self) -> dict[str, Any]:
        """The weights' max |w| and L2 norm now (two reductions, one read).

        Measured at the first step and at the replayed one: a learning rate too high makes
        the loss blow up through the weights, which grow many times over; a loss blown up by
        one batch leaves them where they were.
        """
        try:
            with internal_work(), torch.no_grad():
                weights = [local_tensor(p.detach()) for p in self._params]
                if not weights:
                    return {}
                norms = torch.stack(
                    [
                        torch.nn.utils.get_total_norm(weights, math.inf).float(),
                        torch.nn.utils.get_total_norm(weights, 2.0).float(),
                    ]
                ).tolist()
            return {"max_abs": norms[0], "norm": norms[1]}
        except Exception:  # a refinement: unmeasured, never the user's problem
            return {}

    def _check(self, run: RunContext, step: int, when: str, finite: bool = False) -> None:
        if any(p.is_cuda for p in self._params[:1]) and not _scaler_enabled(run):
            self._not_checked = NOT_CHECKED_ON_GPU
            self._calls = []
            return
        if self._weights_start is None:
            self._weights_start = {"step": step, **self._weights()}
        if finite:
            self._skips_in_row = 0
            return
        try:
            self._check_step(run, step, when)
        except Exception as exc:  # a broken check costs the replay, never the sentinel's step
            self._records["forward"] = {"step": step, "error": f"the check failed: {exc!r}"[:300]}
            self._calls = []

    def _check_step(self, run: RunContext, step: int, when: str) -> None:
        with internal_work():
            bad = self._nonfinite()
        if bad is None:
            self._skips_in_row = 0
            return
        call, backward_only = bad
        if not backward_only:
            self._replay(run, step, call, when, "forward")
            return
        if "backward" in self._records:
            return
        self._skips_in_row += 1
        if not _scaler_enabled(run) or self._skips_in_row >= PERSISTENT_SKIPS:
            self._replay(run, step, call, when, "backward")
        # else: the scaler searching its scale

    def _nonfinite(self) -> tuple[RootCall, bool] | None:
        """The micro-batch to replay and whether only the backward was non-finite, or None."""
        per_call = [[*c.out, *c.losses, *c.grads] for c in self._calls]
        tokens = [t for ts in per_call for t in ts]
        grads = [local_tensor(p.grad) for p in self._params if p.grad is not None]
        if grads:
            tokens.append(max_abs_token(grads))
        if not tokens:
            return None
        device = tokens[0].device
        values = torch.stack([t.to(device) for t in tokens]).cpu().tolist()
        if all(math.isfinite(v) for v in values):
            return None
        losses_finite = True
        chosen: RootCall | None = None
        i = 0
        for call, ts in zip(self._calls, per_call, strict=True):
            mine = values[i : i + len(ts)]
            i += len(ts)
            losses_finite &= all(math.isfinite(v) for v in mine[: len(call.out) + len(call.losses)])
            if chosen is None and not all(math.isfinite(v) for v in mine):
                chosen = call
        return chosen or self._calls[0], losses_finite

    # --- the replay -------------------------------------------------------------------------

    def _replay(self, run: RunContext, step: int, call: RootCall, when: str, trigger: str) -> None:
        precision = run_precision(run)
        record: dict[str, Any] = {
            "step": step,
            "when": when,
            "trigger": trigger,
            "run_precision": precision,
            "micro_batch": next(i for i, c in enumerate(self._calls) if c is call),
            "results": {},
            # the step's own weights (before its update), and the run's first step's
            "weights": {**self._weights(), "start": self._weights_start},
        }
        model = run.model
        why_not = "no model" if model is None else _gathers_across_ranks(model)
        if model is None or why_not:
            record["error"] = why_not
            self._records[trigger] = record
            self._calls = []
            return
        # the model's own state (an RNN's hidden state kept on a module) as the step began
        restore, in_place, kept = changed_state(call.state, self._names)
        if in_place:
            record["error"] = (
                f"the model's state {', '.join(in_place[:3])} was written in place during the "
                f"step: the replay cannot start from the state step {step} began with"
            )
            self._records[trigger] = record
            self._calls = []
            return
        if restore:
            record["state_restored"] = sorted(
                f"{self._names.get(i, '?')}.{a}" for i, attrs in restore.items() for a in attrs
            )
        grad = call.grad
        if grad is not None and call.scale is not None:
            grad = grad.float() / call.scale.to(grad.device)
        record["loss_scale"] = float(call.scale) if call.scale is not None else None
        why_no_backward = None
        if call.grads and call.grad is None:
            why_no_backward = f"the output gradient holds over {MAX_OUTPUT_VALUES} values"
        elif grad is None:
            why_no_backward = "no gradient reached the model's output"
        elif not bool(torch.isfinite(grad).all()):
            why_no_backward = "the gradient at the model's output was already non-finite"
        if why_no_backward is not None:
            record["backward_not_replayed"] = why_no_backward
            grad = None
        device_type = "cuda" if any(p.is_cuda for p in self._params[:1]) else "cpu"
        stored = low_precision_state(model)
        if stored is not None:
            record["upcast"] = stored  # replayed on an FP32 copy of the low-precision weights
        compiled = uncompiled(model)[0] is not model or uncompiled(model)[1]
        targets = ["fp32", "bf16"] if precision == "fp16" else ["fp32"]
        if compiled:
            record["compiled"] = True
        if compiled or precision != "fp32":
            # the run's own precision, eagerly: which submodule made it, and which op (`_FirstOp`)
            targets.append("run")
        for target in targets:
            try:
                with internal_work():
                    record["results"][target] = replay_step(
                        model,
                        call.args,
                        call.kwargs,
                        grad,
                        target,
                        device_type,
                        self._names,
                        upcast=stored is not None and target != "run",
                        autocast_dtype=_autocast_dtype(run) if target == "run" else None,
                        state=kept,
                    )
            except Exception as exc:  # never the user's problem: the record says why
                record["results"][target] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        if "error" in record["results"]["fp32"]:
            record["error"] = record["results"]["fp32"]["error"]
        self._records[trigger] = record
        self._calls = []

    def section(self) -> dict[str, Any] | None:
        """The replay of the first non-finite forward or loss, else of persistent skips.

        None: no step was non-finite (or only the scaler's search for its scale).
        """
        found = self._records.get("forward") or self._records.get("backward")
        if found is None and self._not_checked is not None:
            return {"error": self._not_checked}
        return found


def _gathers_across_ranks(model: torch.nn.Module) -> str | None:
    """Why the model's forward may not be replayed on one rank alone, or None.

    The first non-finite step is this rank's: a replayed forward that gathers parameters
    (FSDP, DTensor parameters) or statistics (SyncBatchNorm) across ranks would wait for
    ranks that run no replay.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return None
    for m in model.modules():
        name = type(m).__name__
        if "FullyShard" in name or "FSDP" in name or isinstance(m, torch.nn.SyncBatchNorm):
            return f"a {name} module gathers across ranks: this rank cannot replay it alone"
    if any(is_dtensor(p) for p in model.parameters()):
        return "sharded (DTensor) parameters: this rank cannot replay the forward alone"
    return None


def _scaler_enabled(run: RunContext) -> bool:
    return compat_scaler.scale_tensor(run.scaler) is not None


def _autocast_dtype(run: RunContext) -> torch.dtype | None:
    """The low-precision dtype autocast computed the run's forwards in, or None."""
    return {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision_of(run.autocast))


def run_precision(run: RunContext) -> str:
    """What the run computed in: "fp16", "bf16" or "fp32" (`compute.precision_of`).

    Autocast seen at the forward, the parameters' dtypes, or an FSDP2 ``MixedPrecisionPolicy``
    (its ``param_dtype`` is what the forward and backward compute in, with FP32 parameters).
    """
    dtypes: list[object] = [*run.autocast, *(p.dtype for m in run.models for p in m.parameters())]
    for m in run.models:
        with contextlib.suppress(Exception):  # a refinement: the policy unread
            dtypes += [p.get("param_dtype") for p in fsdp_mixed_precision(m)]
    return precision_of(dtypes)


def replay_step(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    grad_output: torch.Tensor | None,
    precision: str,
    device_type: str,
    names: dict[int, str],
    *,
    upcast: bool = False,
    autocast_dtype: torch.dtype | None = None,
    state: dict[int, dict[str, object]] | None = None,
) -> dict[str, Any]:
    """The step's forward (and backward from ``grad_output``) in ``precision``: what it holds.

    ``precision`` "fp32": autocast held off everywhere (`AutocastHeldOff`); "bf16": under
    ``torch.autocast(device_type, torch.bfloat16)``; "run": as the run computed it (under
    ``torch.autocast(device_type, autocast_dtype)`` where given), eagerly -- a compiled
    model's submodules each seen (`fp32_replay.replaying`): which one made the value.
    ``upcast``: the model's FP16/BF16 parameters (``model.half()``) and floating inputs are
    replayed as FP32 copies (``result["upcast"]``), the model's own left alone. ``state``:
    ``{id(module): {attribute: value}}`` set on the replica's modules (the model's own state
    as the step began, `compat.modules.changed_state`; FP16/BF16 tensors as FP32 copies but in
    the run's own precision), the model's left alone.

    Returns ``finite`` (every module output,
    and where replayed every gradient, finite), ``origin`` ({module, phase, kind} of the first
    non-finite value: forward, the deepest-first module output in execution order; backward,
    the first module in backward order whose output gradient is finite and input gradient is
    not, else a parameter gradient's owner), ``max_abs``/``max_abs_module`` (the largest
    finite |output|), ``grad_max_abs``/``grad_max_abs_module`` (gradients, unscaled).

    Raises:
        ValueError: the replay did not compute in ``precision`` (an explicit cast, FP16
            parameters, the model's own autocast) or returned no tensor.
    """
    rows: list[tuple[torch.nn.Module, torch.Tensor, torch.Tensor | None]] = []
    device = grad_output.device if grad_output is not None else torch.device(device_type)
    if upcast:
        args, kwargs = upcast_inputs(args), upcast_inputs(kwargs)
    with replaying(model, device, upcast=upcast) as (replica, origin):
        for copied in replica.modules():
            then = (state or {}).get(id(origin[id(copied)]))
            if then:  # into the copy's own dict: the model's is untouched
                low = precision != "run"  # an FP16 state, replayed in FP32 (BF16: autocast)
                copied.__dict__.update({k: upcast_inputs(v) if low else v for k, v in then.items()})

        def keep(module: torch.nn.Module, inputs: Any, output: Any) -> None:
            t = next(tensors_in(output), None)
            if t is None or not t.is_floating_point():
                return
            x = next((a for a in tensors_in(inputs, max_depth=2) if a.requires_grad), None)
            rows.append((origin[id(module)], t, x))

        handles = [m.register_forward_hook(keep) for m in replica.modules()]
        watch = _FirstOp(names, origin) if precision == "run" else None
        if watch is not None:
            handles += watch.hooks(replica)
        try:
            if precision == "fp32":
                held_off = AutocastHeldOff()
                with held_off:
                    out = next(tensors_in(replica(*args, **kwargs)), None)
                if held_off.low is not None:
                    raise ValueError(f"the FP32 replay is not FP32: {held_off.low}")
            elif precision == "run" and watch is not None:
                with (
                    torch.autocast(
                        device_type,
                        dtype=autocast_dtype or torch.float32,
                        enabled=autocast_dtype is not None,
                    ),
                    watch,
                ):
                    out = next(tensors_in(replica(*args, **kwargs)), None)
                watch.carried(out)
            else:
                with torch.autocast(device_type, dtype=torch.bfloat16):
                    out = next(tensors_in(replica(*args, **kwargs)), None)
                if any(t.dtype == torch.float16 for _, t, _ in rows):
                    raise ValueError("the BF16 replay computed in FP16 (the model's own autocast)")
        finally:
            for h in handles:
                h.remove()
        if out is None:
            raise ValueError("the replayed forward returned no tensor")
        fwd = _max_abs([t.detach() for _, t, _ in rows])
        result: dict[str, Any] = {"precision": precision, "forward_finite": True}
        if upcast:
            result["upcast"] = True
        if watch is not None and watch.found is not None:
            result["op"] = watch.result()
        origin_at: dict[str, Any] | None = None
        finite_vals = [(v, m) for v, (m, _, _) in zip(fwd, rows, strict=True) if math.isfinite(v)]
        for v, (m, _, _) in zip(fwd, rows, strict=True):
            if not math.isfinite(v):
                origin_at = {"module": names.get(id(m), "?"), "phase": "forward", "kind": "output"}
                result["forward_finite"] = False
                break
        if finite_vals:
            v, m = max(finite_vals, key=lambda x: x[0])
            result["max_abs"], result["max_abs_module"] = v, names.get(id(m), "?")
        backward = result["forward_finite"] and grad_output is not None and out.requires_grad
        if backward and grad_output is not None:
            if out.shape != grad_output.shape:
                raise ValueError(
                    f"the replayed output {tuple(out.shape)} is not the step's "
                    f"{tuple(grad_output.shape)}"
                )
            origin_at = _backward(rows, out, grad_output, replica, names, result)
        result["backward_replayed"] = bool(backward)
    result["origin"] = origin_at
    result["finite"] = origin_at is None
    return result


class _FirstOp(torch.overrides.TorchFunctionMode):
    """The replay's first op whose output is non-finite from finite inputs: what made it.

    Runs only in the replay of the first non-finite step, in the run's own precision (a read
    per op until that op is found; nothing on the steps the run trains). It records the op,
    the module it ran in, its dtype and:

    * ``constant``: a finite number among its arguments beyond the output dtype's range (a mask
      filled with -1e9 in FP16, whose max is 65504): the constant became inf;
    * ``function``: the custom ``torch.autograd.Function`` the value came out of, where the
      op ran with grad mode off (inside a Function's forward) and the first non-finite tensor
      that carries a custom Function's node is that Function's output.

    An inf from an inf constant (a mask filled with ``float("-inf")``) or from inputs already
    non-finite is not an origin.
    """

    def __init__(self, names: dict[int, str], origin: dict[int, torch.nn.Module]) -> None:
        super().__init__()
        self._names, self._origin = names, origin
        self._where: list[str] = []
        self._custom: dict[int, tuple[str, torch.Tensor]] = {}  # custom Functions' outputs
        self.found: dict[str, Any] | None = None

    def hooks(self, replica: torch.nn.Module) -> list[Any]:
        """Hooks that keep the name of the module each op runs in."""

        def enter(m: torch.nn.Module, args: Any) -> None:
            self._where.append(self._names.get(id(self._origin.get(id(m))), "?"))

        def leave(m: torch.nn.Module, args: Any, out: Any) -> None:
            if self._where:
                self._where.pop()

        return [
            h
            for m in replica.modules()
            for h in (m.register_forward_pre_hook(enter), m.register_forward_hook(leave))
        ]

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        with contextlib.suppress(Exception):  # observing must never break the replay
            self._see(func, args, kwargs, out)
        return out

    def carried(self, value: Any) -> None:
        """Notes the custom Functions' outputs among ``value`` (the replay's output)."""
        for t in tensors_in(value, max_depth=2):
            node = t.grad_fn
            if isinstance(node, torch.autograd.function.BackwardCFunction):
                self._custom.setdefault(id(node), (type(node).__name__, t))

    def _see(self, func: Any, args: Any, kwargs: dict[str, Any], out: Any) -> None:
        inputs = [t for t in tensors_in((args, kwargs), max_depth=3) if t.is_floating_point()]
        self.carried(inputs)
        outs = [t for t in tensors_in(out, max_depth=2) if t.is_floating_point()]
        if self.found is not None or not outs:
            return
        nan, inf = _nan_inf(outs)
        if not (nan or inf):
            return
        in_nan, in_inf = _nan_inf(inputs)
        numbers = [
            float(v)
            for v in (*args, *kwargs.values())
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        ]
        if not (
            (nan and not in_nan)
            or (inf and not (in_nan or in_inf) and all(math.isfinite(v) for v in numbers))
        ):
            return
        dtype = outs[0].dtype
        self.found = {
            "op": getattr(func, "__name__", str(func)).strip("_"),
            "module": self._where[-1] if self._where else None,
            "dtype": str(dtype).removeprefix("torch."),
            "grad_enabled": torch.is_grad_enabled(),
        }
        big = [v for v in numbers if abs(v) > torch.finfo(dtype).max]
        if big:
            self.found["constant"] = big[0]

    def result(self) -> dict[str, Any]:
        """The op found, with the custom Function it ran in (``function``) where one did."""
        found = dict(self.found or {})
        if found.get("grad_enabled") is False:
            bad = [name for name, t in self._custom.values() if not bool(torch.isfinite(t).all())]
            if bad:
                found["function"] = bad[0].removesuffix("Backward")
        self._custom.clear()
        return found


def _nan_inf(tensors: list[torch.Tensor]) -> tuple[bool, bool]:
    """Whether any of ``tensors`` holds a NaN, and whether any holds an inf (one read)."""
    if not tensors:
        return False, False
    device = tensors[0].device
    flags = torch.stack(
        [torch.stack([t.isnan().any(), t.isinf().any()]).to(device) for t in tensors]
    ).any(0)
    nan, inf = flags.tolist()
    return bool(nan), bool(inf)


def _backward(
    rows: list[tuple[torch.nn.Module, torch.Tensor, torch.Tensor | None]],
    out: torch.Tensor,
    grad_output: torch.Tensor,
    replica: torch.nn.Module,
    names: dict[int, str],
    result: dict[str, Any],
) -> dict[str, Any] | None:
    """The replay's backward: max |g| per module output and input, and the first non-finite.

    ``replica``: the module tree the forward ran (its parameters, FP32 copies where upcast,
    named as the model's).
    """
    unique: dict[int, torch.Tensor] = {}
    for _, t, x in rows:
        for held in (t, x):
            if held is not None and held.requires_grad:
                unique.setdefault(id(held), held)
    params = [p for p in replica.parameters() if p.requires_grad]
    wrt = [*unique.values(), *params]
    found = torch.autograd.grad(out, wrt, grad_outputs=grad_output.to(out.dtype), allow_unused=True)
    grads = dict(zip(unique, found[: len(unique)], strict=True))
    keys = list(unique)
    values = dict(zip(keys, _max_abs([grads[k] for k in keys]), strict=True))
    pvals = _max_abs(list(found[len(unique) :]))
    del found, grads
    best: tuple[float, str] = (-1.0, "")

    def seen(v: torch.Tensor | None) -> float:
        return values.get(id(v), 0.0) if v is not None else 0.0

    origin_at = None
    # The module whose backward made it: its output gradient finite, its input gradient not.
    # A parent shares its first child's input and its last child's output, so every ancestor
    # of that module is such a module too: the deepest one is the origin.
    made = []
    for m, t, x in rows:
        g_out, g_in = seen(t), seen(x)
        for g in (g_out, g_in):
            if math.isfinite(g) and g > best[0]:
                best = (g, names.get(id(m), "?"))
        if math.isfinite(g_out) and not math.isfinite(g_in):
            made.append(names.get(id(m), "?"))
    if made:
        where = max(made, key=lambda n: -1 if n.startswith("(") else n.count(".") + 1)
        origin_at = {"module": where, "phase": "backward", "kind": "input gradient"}
    if origin_at is None:
        owners = {id(p): n for n, p in replica.named_parameters()}
        for param, pv in zip(params, pvals, strict=True):
            if not math.isfinite(pv):
                name = owners.get(id(param), "?").rpartition(".")[0] or "?"
                origin_at = {"module": name, "phase": "backward", "kind": "parameter gradient"}
                break
    if best[0] >= 0:
        result["grad_max_abs"], result["grad_max_abs_module"] = best
    return origin_at


def _max_abs(tensors: list[torch.Tensor | None]) -> list[float]:
    """The largest |t| of each tensor (0.0: None or empty; inf or NaN: not finite), one read."""
    parts: list[torch.Tensor | None] = []
    for t in tensors:
        if t is None or t.numel() == 0:
            parts.append(None)
            continue
        lo, hi = torch.aminmax(t.detach())
        parts.append(torch.maximum(-lo, hi).float().reshape(()))  # NaN propagates
    real = [p for p in parts if p is not None]
    if not real:
        return [0.0] * len(parts)
    device = real[0].device
    read = iter(torch.stack([p.to(device) for p in real]).cpu().tolist())
    return [next(read) if p is not None else 0.0 for p in parts]
