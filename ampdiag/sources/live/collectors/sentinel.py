"""The divergence sentinel: on every step, where the first inf/NaN came from.

Sampled statistics can miss the step a run diverges on (a NaN at step 33 of 50 falls between
sampled steps, and the profiler's window is never sampled). The sentinel watches every step,
cheaply enough to leave on:

* forward: a pre-hook on every module reduces its first floating input to one sum
  (`finite_token`: inf/NaN propagate into it) before the module runs, and a forward hook its
  first floating output after, in execution order, with the call running when it started (its
  parent). One token per distinct tensor: a tensor already reduced (the previous module's
  output is the next one's input) is looked up by identity (a weak reference, so nothing is
  kept alive) and its version counter (changed in place since: reduced again). torch's global
  pre-hook gets no keyword arguments: a call with no floating positional input has the
  tensors it got by keyword (``attn(hidden_states=h)``; not a mask) read after the forward
  and ordered where the call began, where they provably did not change in between, and not
  counted where the call absorbed them (its output finite) (`Sentinel._keyword_input`);
* loss: every loss given to backward (or to ``GradScaler.scale``), as a 0-dim tensor;
* backward: the forward hook puts one tensor hook on each distinct floating tensor that is a
  module's input or output and requires grad, with the roles it played (input or output of
  which calls); in the backward it reduces the gradient with respect to that tensor to one
  sum, in backward order. A root module's output gradient is the one arriving from the loss;
* gradients: at the step's end, one value over all parameter gradients (`_finite.max_abs_token`):
  non-finite, or zero (all gradients zero); the CPU check without module hooks reads one sum
  per gradient with its other values instead, and the largest |g| only where the sums cannot
  decide (`_grads_state`).

The values stay on the device; at the step's end they are stacked and copied to the host in
one transfer (`_host.Deferred`, read at a later step on CUDA). The first non-finite entry in
that order is the origin (`origin.py`): the deepest module whose input was finite and whose
output is not (forward), or whose output gradient was finite and input gradient is not
(backward); a parent's own code between two children when the value was already non-finite
where a child began (or its gradient where a child's backward began); or the loss. Hooks
never change a tensor (they return None), and every hook is removed on exit.

The first non-finite step is also replayed in FP32 (and BF16), before its weights change, by
`divergence_replay.ReplayKeeper` (the section's ``replay``): whether precision caused it.
"""

from __future__ import annotations

import math
import weakref
from collections import deque
from collections.abc import Callable
from contextlib import ExitStack, nullcontext
from functools import partial
from itertools import chain
from typing import Any, cast

import torch

from ampdiag.compat import scaler as compat_scaler
from ampdiag.compat.autograd import version
from ampdiag.compat.dtensor import is_dtensor, local_tensor
from ampdiag.compat.modules import State, uncompiled
from ampdiag.schema import Origin, SentinelSection
from ampdiag.sources.live import global_hooks
from ampdiag.sources.live.collectors import COLLECTORS, origin
from ampdiag.sources.live.collectors._finite import max_abs_token
from ampdiag.sources.live.collectors._host import Deferred, absorb_ready
from ampdiag.sources.live.collectors.base import Collector, RunContext, internal_work, tensors_in
from ampdiag.sources.live.collectors.divergence_replay import (
    ReplayKeeper,
    RootCall,
    _gathers_across_ranks,
)
from ampdiag.sources.live.collectors.fp32_replay import MAX_OUTPUT_VALUES, replaying

#: The pseudo-module named when the loss (forward) or its backward holds the first inf/NaN.
LOSS = origin.LOSS
#: Steps listed in full in the section.
MAX_LISTED = 100
#: Finite step losses kept before the first non-finite one: the run's first, and its last.
LOSS_HEAD, LOSS_TAIL = 8, 56
#: A root output (and the gradient at it) of at most this many values is reduced at the
#: step's check, with the rest: one torch call fewer in each hook. A larger one is reduced at
#: once, while it is in the cache, and is not kept alive until the check (bench_sentinel:
#: TinyGPT's 262,144 logits kept cost more than the calls they save).
DEFER_MAX = 1 << 16


def finite_token(t: torch.Tensor) -> torch.Tensor:
    """A 0-dim float32 tensor that is finite exactly when every value of ``t`` is.

    A sum: inf/NaN propagate into it (inf - inf is NaN). FP32, FP64 and BF16 are summed in
    their own dtype (BF16 has FP32's range, so a sum of finite BF16 values overflows only where
    FP32's would): ``torch.sum(t, dtype=float32)`` of a BF16 tensor first makes a full FP32 copy
    on the CPU, which would show in the run's memory peak as the user's. FP16 is summed in
    FP16 (float32 inside, rounded once at the end) and, only when that is not finite -- a real
    inf/NaN, or a sum beyond 65504 -- in float32, which decides: on the CPU that sum is read at
    once (no device to wait for); on a GPU the float32 sum is cheap and needs no read.
    """
    if t.dtype == torch.float16:
        if t.device.type == "cpu":
            quick = t.sum()
            if math.isfinite(float(quick)):
                return quick.float()
        return torch.sum(t, dtype=torch.float32)
    return _as_float32(t.sum())


def _as_float32(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32 (itself when it is: no call into torch on every step)."""
    return t if t.dtype == torch.float32 else t.float()


def _stacked(parts: list[torch.Tensor]) -> torch.Tensor:
    """The step's 0-dim float32 values as one tensor (on the first one's device)."""
    try:  # one device: the usual case, asked of torch.stack rather than of each part
        return torch.stack(parts)
    except RuntimeError:
        device = parts[0].device
        return torch.stack([p.to(device) for p in parts])


def _grads_state(grads: list[torch.Tensor], sums: list[float]) -> tuple[bool, bool]:
    """(any gradient non-finite, every gradient zero) from one sum per gradient.

    A sum is non-finite when a value is (inf/NaN propagate) and not zero when a value is not,
    so finite sums, one of them not zero, decide alone; otherwise (an inf/NaN, finite values
    whose sum overflows, all zero or cancelling) the largest |g| decides
    (`_finite.max_abs_token`). A sum is the cheapest pass over the gradients on a CPU.
    """
    if not grads:
        return False, False
    if all(math.isfinite(v) for v in sums) and any(v != 0 for v in sums):
        return False, False
    with internal_work():
        largest = float(max_abs_token(grads))
    return not math.isfinite(largest), largest == 0


def _step_loss(values: list[float], scaled: list[bool]) -> float:
    """The step's loss as `steps.StepLog` sums it: the losses given to GradScaler.scale."""
    unscaled = [v for v, s in zip(values, scaled, strict=True) if s]
    return sum(unscaled) if unscaled else sum(values)


def _when_training(hook: Callable[..., None], idx: int, *args: Any) -> None:
    """``hook(idx, ...)`` on the forwards the module callbacks see (`global_hooks`)."""
    if global_hooks.training_forward():
        hook(idx, *args)


def _autocast(states: list[tuple[str, torch.dtype]]) -> Any:
    """Enters the autocast states a forward ran under (none: a null context)."""
    if not states:
        return nullcontext()
    stack = ExitStack()
    for dev, dtype in states:
        stack.enter_context(torch.autocast(dev, dtype=dtype))
    return stack


def _first_tensor(value: Any, max_depth: int = 2) -> torch.Tensor | None:
    """The first tensor of a module's inputs or outputs (a bare tensor or ``args[0]``: fast)."""
    if isinstance(value, torch.Tensor):
        return value
    if type(value) is tuple and value and isinstance(value[0], torch.Tensor):
        return value[0]
    return next(tensors_in(value, max_depth=max_depth), None)


class _Seen:
    """What the step knows of one tensor, looked up by its id.

    A weak reference (nothing is kept alive), its version counter when seen (changed in place
    since: a new entry), its token's position (-1: not reduced) and the roles its gradient
    hook reports (None: no hook).
    """

    __slots__ = ("ref", "roles", "token", "version")

    def __init__(self, t: torch.Tensor, v: int) -> None:
        self.ref, self.version = weakref.ref(t), v
        self.token = -1
        self.roles: list[int] | None = None

    def holds(self, t: torch.Tensor, v: int) -> bool:
        """Whether this entry is ``t`` as it is now (same object, unchanged in place)."""
        return self.ref() is t and self.version == v


def _autocast_now() -> list[tuple[str, torch.dtype]]:
    """The autocast states enabled now (device type, dtype): what a replay enters again."""
    states: list[tuple[str, torch.dtype]] = []
    for dev in ("cpu", "cuda"):  # (a loop: no comprehension's frame on every forward)
        if torch.is_autocast_enabled(dev):
            states.append((dev, torch.get_autocast_dtype(dev)))
    return states


@COLLECTORS.register
class Sentinel(Collector):
    """First inf/NaN per step: module outputs, the loss, input gradients, parameter grads."""

    name = "sentinel"
    enabled_by = "sentinel"
    run_wide = True  # a divergence at step 5 000 comes before the window it opens

    def __init__(self) -> None:
        self._names: list[str] = []
        self._index: dict[int, int] = {}
        self._handles: list[Any] = []
        self._params: list[tuple[str, torch.nn.Parameter]] = []
        self._grad_params: list[torch.nn.Parameter] = []  # the same, without their names
        self._sharded = False  # a parameter is a DTensor (FSDP2): gradients read by shard
        self._cpu = True  # every parameter on the CPU: the step's check reads value by value
        # This step's calls, the role that computed each forward token, the calls running
        # now, and the tensors seen by id. Keyword input tokens, read after their call:
        # token -> (tokens before the call started, call) -- where they belong in the order.
        self._calls: list[origin.Call] = []
        self._fwd_idx: list[int] = []
        self._early: dict[int, tuple[int, int]] = {}
        self._stack: list[int] = []
        self._seen: dict[int, _Seen] = {}
        self._fwd: list[torch.Tensor] = []
        self._bwd_idx: list[list[int]] = []
        self._bwd: list[torch.Tensor] = []
        self._loss: list[torch.Tensor] = []
        self._loss_scaled: list[bool] = []  # each loss: given to GradScaler.scale (unscaled)
        self._loss_of: torch.Tensor | None = None  # the latest loss given to GradScaler.scale
        self._pending: list[
            tuple[
                int,
                tuple[list[origin.Call], list[int]],
                list[list[int]],
                list[bool],
                bool,
                Deferred,
            ]
        ] = []
        self._steps = 0
        self._forward_origin: Origin | None = None
        self._backward_origin: Origin | None = None
        self._nonfinite: list[int] = []
        self._backward_only: list[int] = []
        self._loss_bad: list[int] = []
        self._zero_grads: list[int] = []
        # The last step checked, and whether its loss was non-finite: a long run's listed
        # steps stop at MAX_LISTED, and a run watched past its window ends after its steps.
        self._last_step: int | None = None
        self._last_loss_bad = False
        # The finite step losses up to the first non-finite forward or loss: the first ones
        # and the last ones before it, so that the loss's trend into a divergence is known
        # where the session's steps are not those steps (a window's).
        self._loss_head: list[tuple[int, list[float], list[bool]]] = []
        self._loss_tail: deque[tuple[int, list[float], list[bool]]] = deque(maxlen=LOSS_TAIL)
        self._errors: list[str] = []
        self._replay = ReplayKeeper()  # the first non-finite step, replayed
        # Every-step module hooks (``exact``: a model on a GPU, where the step's check is
        # read at a later step) or the root model's forwards alone, the origin localized by
        # replaying the first non-finite step with the module hooks (`_localize`).
        self._exact: bool | None = None
        self._root: torch.nn.Module | None = None
        self._run: RunContext | None = None
        # The first model's forwards this step (both modes: what the replay keeper reads),
        # and what its root pre-hook saw (the RNG state only where the replay localizes).
        self._root_calls: list[RootCall] = []
        self._pre_rng: torch.Tensor | None = None
        self._pre_state: State = []
        self._checked = False

    # --- lifecycle --------------------------------------------------------------------------

    def on_model(self, run: RunContext, model: torch.nn.Module) -> None:
        """Hooks every module of the model, for the whole run."""
        prefix = "" if len(run.models) <= 1 else f"model{len(run.models) - 1}."
        if self._exact is None:
            # exact where the step's check is read later (a GPU) or no replay can run
            self._exact = any(p.is_cuda for p in model.parameters()) or bool(
                _gathers_across_ranks(model)
            )
            self._root, self._run = model, run
            self._handles.append(global_hooks.on_root(model, self._root_pre, self._root_post))
            self._replay.on_model(model)
        # a compiled model's submodules by the names the user knows (no "_orig_mod.")
        inner = uncompiled(model)[0]
        for name, module in chain(inner.named_modules(), model.named_modules()):
            if id(module) in self._index:
                continue
            idx = len(self._names)
            self._index[id(module)] = idx
            self._names.append(prefix + name if name else prefix + f"({type(module).__name__})")
            if not self._exact:
                continue
            pre = partial(self._pre, idx)
            self._handles.append(global_hooks.on_module(module, global_hooks.MODULE_PRE, pre))
            hook = partial(self._forward, idx)
            self._handles.append(
                global_hooks.on_module(module, global_hooks.MODULE_POST_KWARGS, hook)
            )
        known = {id(p) for _, p in self._params}
        for name, p in inner.named_parameters():
            if p.requires_grad and id(p) not in known:
                self._params.append((prefix + name, p))
                self._grad_params.append(p)
                known.add(id(p))
                self._sharded = self._sharded or is_dtensor(p)
                self._cpu = self._cpu and p.device.type == "cpu"

    def stop(self, run: RunContext) -> None:
        """Removes every hook; reads what is still on its way to the host."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._replay.stop()
        self._resolve(wait=True)

    # --- the root model's forwards (one record each, what the check and the replay read) -----

    def _recording(self) -> bool:
        """Whether the root's forwards are recorded now.

        In the block's thread only; in the exact mode only while the replay keeper may yet
        replay (it alone reads them there).
        """
        run = self._run
        return (
            run is not None and run.on_block_thread() and (not self._exact or self._replay.watching)
        )

    def _root_pre(self, module: torch.nn.Module, args: Any) -> None:
        if not self._recording():
            return
        try:
            self._pre_state = self._replay.state_now()
            if not self._exact:
                # what its dropout draws from, replayed (`torch.get_rng_state`'s own call)
                self._pre_rng = torch.default_generator.get_state()
        except Exception as exc:  # observing must never break the user's step
            self._error(exc)

    def _root_post(self, module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        if not self._recording():
            return
        try:
            # the wrapper's own tuple and dict (nothing else holds or changes them)
            call = RootCall(args, kwargs or {}, self._pre_state, _autocast_now(), self._pre_rng)
            self._pre_rng, self._pre_state = None, []
            self._root_calls.append(call)
            t = _first_tensor(output, 4)
            if t is None or not t.is_floating_point():
                return
            with internal_work():  # ours, not the model's ops (the precision audit skips them)
                d = t.detach()
                # a small output: reduced at the step's check with the rest (`_check`)
                call.out.append(finite_token(d) if self._exact or d.numel() > DEFER_MAX else d)
            grad_fn = t.grad_fn
            if grad_fn is not None:  # the gradient at the output, as a tensor hook gets it
                grad_fn.register_prehook(partial(self._root_grad, call, t.output_nr))
            elif t.requires_grad:
                hook = partial(self._root_grad, call, 0)
                t.register_hook(lambda g: hook((g,)))  # type: ignore[no-untyped-call]
        except Exception as exc:  # observing must never break the user's step
            self._error(exc)

    def _root_grad(self, call: RootCall, index: int, grads: Any) -> None:
        try:
            grad = grads[index]  # the gradient at the root's output (its node's input ``index``)
            if grad is None:
                return
            if grad.requires_grad:  # a backward with create_graph: its graph is not kept
                with internal_work():
                    grad = grad.detach()
            n = grad.numel()
            # the largest output gradient kept (fp32_replay's bound): bounded memory
            if call.grad is None and n <= MAX_OUTPUT_VALUES:
                call.grad = grad  # a reference: nothing writes into it
                scaler = self._run.scaler if self._run is not None else None
                live = compat_scaler.scale_tensor(scaler) if scaler is not None else None
                if live is not None:  # updated in place by ``update()``: this step's value
                    with internal_work():
                        call.scale = live.detach().clone()
            if self._exact or n > DEFER_MAX:
                with internal_work():  # ours, not the model's ops (the audit skips them)
                    call.grads.append(finite_token(grad))
            else:  # a small one: reduced at the step's check (`_check`)
                call.grads.append(grad)
        except Exception as exc:  # observing must never break the user's backward
            self._error(exc)

    # --- hooks ------------------------------------------------------------------------------

    def _pre(self, idx: int, module: torch.nn.Module, args: Any) -> None:
        try:
            call, stack = len(self._calls), self._stack
            record = origin.Call(idx, stack[-1] if stack else -1, len(self._fwd))
            self._calls.append(record)
            stack.append(call)
            a = _first_tensor(args)
            if a is not None and a.is_floating_point():
                record.inp = self._token(a, call * 2 + origin.INPUT)
        except Exception as exc:  # observing must never break the user's step
            self._error(exc)

    def _entry(self, t: torch.Tensor) -> _Seen:
        """What is known of ``t`` this step (a new entry when it is new or changed in place)."""
        entry = self._seen.get(id(t))
        v = version(t)
        if entry is None or not entry.holds(t, v):
            entry = self._seen[id(t)] = _Seen(t, v)
        return entry

    def _token(self, t: torch.Tensor, role: int) -> int:
        """The position of ``t``'s finiteness token, reduced now unless it already was."""
        entry = self._entry(t)
        if entry.token < 0:
            with internal_work():
                token = finite_token(t.detach())
            entry.token = len(self._fwd)
            self._fwd.append(token)
            self._fwd_idx.append(role)
        return entry.token

    def _role(self, t: torch.Tensor, role: int) -> None:
        """Adds a role to ``t``'s gradient hook (registered with its first role)."""
        entry = self._entry(t)
        roles = entry.roles
        if roles is None:
            roles = entry.roles = []
            t.register_hook(partial(self._grad, roles))  # type: ignore[no-untyped-call]
        roles.append(role)

    def _close(self, idx: int) -> int:
        """The call of module ``idx`` that ends now (popped from the running calls)."""
        stack = self._stack
        for i in range(len(stack) - 1, -1, -1):
            if self._calls[stack[i]].module == idx:
                call = stack[i]
                del stack[i:]
                return call
        # no pre-hook seen (hooked while it ran): a call with no input token
        self._calls.append(origin.Call(idx, stack[-1] if stack else -1, -1))
        return len(self._calls) - 1

    def _forward(
        self, idx: int, module: torch.nn.Module, args: Any, kwargs: Any, output: Any
    ) -> None:
        try:
            self._watch_forward(idx, module, args, kwargs, output)
        except Exception as exc:  # observing must never break the user's step
            self._error(exc)

    def _error(self, exc: Exception) -> None:
        if len(self._errors) < 10:
            self._errors.append(repr(exc))

    def _watch_forward(
        self, idx: int, module: torch.nn.Module, args: Any, kwargs: Any, output: Any
    ) -> None:
        call = self._close(idx)
        if kwargs and self._calls[call].inp < 0:
            self._keyword_input(call, kwargs)
        t = _first_tensor(output, 4)
        floating = t is not None and t.is_floating_point()
        if t is not None and floating:
            self._calls[call].out = self._token(t, call * 2 + origin.OUTPUT)
        if not torch.is_grad_enabled():
            return
        inputs = tensors_in(args, max_depth=2)
        if kwargs:  # by keyword: a module's own input too (its backward's input gradient)
            inputs = chain(inputs, tensors_in(kwargs, max_depth=1))
        for a in inputs:
            # Not leaves: a parameter or input kept across steps would collect a hook per step.
            if a.requires_grad and a.grad_fn is not None and a.is_floating_point():
                self._role(a, call * 2 + origin.INPUT)
        if t is not None and floating and t.requires_grad and t.grad_fn is not None:
            self._role(t, call * 2 + origin.OUTPUT)

    def _keyword_input(self, call: int, kwargs: dict[str, Any]) -> None:
        """The input tokens of a call whose floating input came by keyword (none positional).

        torch's global pre-hook gets no keyword arguments, so each floating tensor given by
        keyword is read after the forward, from the same objects, and its token is ordered
        where the call began (`_in_start_order`): a keyword's position says nothing of its
        role, so every one counts. That is its value at the start only where it provably did
        not change in the forward: it was reduced before the call began and its version is
        the same now, or its version is 0 (never changed in place); otherwise it stays unread,
        as before. An argument named like a mask is skipped: an additive mask holds -inf by
        design (and a non-finite keyword input the call absorbed is not one, `_absorbed`).
        """
        record = self._calls[call]
        start = record.start
        if start < 0:
            return
        for key, t in kwargs.items():
            if not isinstance(t, torch.Tensor) or not t.is_floating_point() or "mask" in key:
                continue
            entry = self._seen.get(id(t))
            v = version(t)
            known = entry if entry is not None and entry.holds(t, v) and entry.token >= 0 else None
            if known is not None and self._key(known.token) < (start, 0, call):
                record.inp = known.token
                continue
            if v != 0:
                continue
            if known is not None:
                token = self._fwd[known.token]
            else:
                with internal_work():
                    token = finite_token(t.detach())
                self._entry(t).token = len(self._fwd)
            record.inp = len(self._fwd)
            self._early[len(self._fwd)] = (start, call)
            self._fwd.append(token)
            self._fwd_idx.append(call * 2 + origin.INPUT)

    def _key(self, token: int) -> tuple[int, int, int]:
        """Where a forward token belongs in the step's order.

        A keyword input at its call's start: before anything the call computed, outer calls
        first.
        """
        early = self._early.get(token)
        return (early[0], 0, early[1]) if early else (token, 1, 0)

    def _absorbed(self) -> None:
        """A keyword input's token, finite where its call's output is (on the device).

        A non-finite value a module was given and absorbed (its output finite: a -inf bias
        added before a softmax) is the module's design, not a divergence; positional inputs
        are read as before.
        """
        with internal_work():
            for token, (_, call) in self._early.items():
                out = self._calls[call].out
                if out >= 0:
                    t = self._fwd[token]
                    self._fwd[token] = torch.where(
                        torch.isfinite(self._fwd[out]), torch.zeros_like(t), t
                    )

    def _in_start_order(self) -> None:
        """Reorders the step's forward tokens so that keyword inputs come where read."""
        self._absorbed()
        order = sorted(range(len(self._fwd)), key=self._key)
        self._fwd = [self._fwd[i] for i in order]
        self._fwd_idx = [self._fwd_idx[i] for i in order]
        self._early = {}

    def _grad(self, roles: list[int], grad: torch.Tensor) -> None:
        if grad is None:
            return
        try:
            with internal_work():
                token = finite_token(grad.detach())
        except Exception as exc:  # observing must never break the user's backward
            self._error(exc)
            return
        self._bwd.append(token)
        self._bwd_idx.append(roles)

    def on_loss(self, run: RunContext, loss: torch.Tensor, from_scaler: bool) -> None:
        """Keeps the loss (one value) for the step's check."""
        if self._exact:
            self._seen = {}  # the forward is over: what it saw is not looked up again
        if not loss.is_floating_point():
            return
        if loss is self._loss_of and not from_scaler:
            # a disabled GradScaler's scale() returned it, now given to backward: the value
            # read is the unscaled one already kept (the step's loss, `_keep_loss`)
            return
        t = loss.detach()
        token = _as_float32(t if t.dim() == 0 else t.reshape(()))
        self._loss_of = loss if from_scaler else None
        self._loss.append(token)
        self._loss_scaled.append(from_scaler)
        if self._root_calls:  # the latest forward's loss, in the replay keeper's check
            self._root_calls[-1].losses.append(token)

    def before_optimizer_step(self, run: RunContext, optimizer: torch.optim.Optimizer) -> None:
        """Replays the step in FP32 when it is the first non-finite one (weights unchanged)."""
        finite, self._loss_of = False, None  # the user's loss: not held past its backward
        if not self._exact and not self._checked:
            self._checked = True
            finite = self._check(run, run.step)
        self._replay.before_optimizer_step(run, self._root_calls, finite)

    # --- steps ------------------------------------------------------------------------------

    def on_step_end(self, run: RunContext, step: int) -> None:
        """Stacks the step's values with the gradients' max |g| and sends them to the host."""
        if not self._exact:
            finite = not self._checked and self._check(run, step)
            self._replay.on_step_end(run, step, self._root_calls, finite)
            self._steps += 1
            self._checked = False
            self._root_calls, self._loss, self._loss_scaled, self._loss_of = [], [], [], None
            return
        self._replay.on_step_end(run, step, self._root_calls)
        self._root_calls = []
        if self._early:
            self._in_start_order()
        with internal_work():
            # DTensor gradients (FSDP2): this rank's shard is what this rank can see
            grads = [local_tensor(p.grad) for _, p in self._params if p.grad is not None]
            parts = [*self._fwd, *self._loss, *self._bwd]
            if grads:
                parts.append(max_abs_token(grads))
            if parts:
                deferred = Deferred(_stacked(parts), copy=False)
                fwd = (self._calls, self._fwd_idx)
                self._pending.append(
                    (step, fwd, self._bwd_idx, self._loss_scaled, bool(grads), deferred)
                )
        self._steps += 1
        self._fwd, self._fwd_idx, self._bwd, self._bwd_idx, self._loss = [], [], [], [], []
        self._loss_scaled, self._loss_of = [], None
        self._calls, self._stack, self._seen = [], [], {}
        if self._pending:
            self._resolve(wait=False)

    def _resolve(self, wait: bool) -> None:
        self._pending = absorb_ready(self._pending, self._absorb, wait)

    def _absorb(
        self,
        step: int,
        fwd: tuple[list[origin.Call], list[int]],
        bwd: list[list[int]],
        scaled: list[bool],
        grads: bool,
        d: Deferred,
    ) -> None:
        import numpy as np

        values = d.arrays()[0].astype(np.float64)
        finite = np.isfinite(values)
        calls, owners = fwd
        k, n = len(owners), len(owners) + len(scaled)
        if scaled and self._forward_origin is None:
            self._keep_loss(step, values[k:n].tolist(), scaled)
        bad_fwd = bool((~finite[:k]).any())
        bad_bwd = bool((~finite[n : n + len(bwd)]).any())
        zero = bool(grads and finite[-1] and values[-1] == 0)

        def fwd_origin() -> dict[str, Any] | None:
            if not bad_fwd:
                return None
            return origin.forward(calls, owners, finite[:k].tolist(), self._names)

        def bwd_origin() -> dict[str, Any] | None:
            if not bad_bwd:
                return None
            return origin.backward(calls, bwd, finite[n : n + len(bwd)].tolist(), self._names)

        bad_loss = not finite[k:n].all()
        bad_grads = bool(grads and not finite[-1])
        self._record(step, bad_fwd, bad_loss, bad_bwd or bad_grads, zero, fwd_origin, bwd_origin)

    def _record(
        self,
        step: int,
        bad_fwd: bool,
        bad_loss: bool,
        bad_bwd: bool,
        zero_grads: bool,
        fwd_origin: Callable[[], dict[str, Any] | None],
        bwd_origin: Callable[[], dict[str, Any] | None],
    ) -> None:
        """Notes a checked step; the first non-finite forward's (and backward's) origin."""
        if zero_grads:
            self._zero_grads.append(step)
        if bad_loss:
            self._loss_bad.append(step)
        self._last_step, self._last_loss_bad = step, bool(bad_loss)
        if not (bad_fwd or bad_loss or bad_bwd):
            return
        self._nonfinite.append(step)
        if bad_fwd or bad_loss:
            if self._forward_origin is None:
                found = fwd_origin()
                if found is None:
                    found = {"phase": "loss", "module": LOSS, "kind": "value", "parent_code": False}
                self._forward_origin = cast(Origin, {"step": step, **found})
            return
        self._backward_only.append(step)
        if self._backward_origin is None:
            found = bwd_origin()
            if found is None:
                found = {
                    "phase": "backward",
                    "module": self._grad_owner(),
                    "kind": "parameter gradient",
                    "parent_code": False,
                }
            self._backward_origin = cast(Origin, {"step": step, **found})

    # --- the step's check without module hooks, and the replay that localizes ---------------

    def _check(self, run: RunContext, step: int) -> bool:
        """The step's check from the root's outputs, the losses and the gradients (one read).

        Before the optimizer step (the weights still the step's own) or, where none ran (a
        GradScaler's skip: the weights unchanged), at the step's end. The root's outputs, the
        gradients at them and the parameter gradients are summed here (inf/NaN propagate into
        a sum; the cheapest pass on a CPU, where a fused 2-norm measured slower) and read with
        the losses: on the CPU a float per value (in a training step, bench_sentinel's MLP,
        that measured cheaper than stacking them and reading the stack once), on another
        device in one transfer. When a sum is not finite (an inf/NaN, or a low-precision
        sum that overflowed) or every gradient is zero, each value is decided exactly
        (`finite_token`, `_grads_state`). The
        first non-finite forward (and backward) is then localized by `_localize`. Returns
        whether every value was finite (the replay keeper then reads nothing again).
        """
        calls, losses, scaled = self._root_calls, self._loss, self._loss_scaled
        grads = [g for p in self._grad_params if (g := p.grad) is not None]
        if self._sharded:  # DTensor gradients (FSDP2): this rank's shard
            grads = [local_tensor(g) for g in grads]
        if len(calls) == 1:  # one forward (no micro-batches): its lists as they are
            outs, ogs = calls[0].out, calls[0].grads
        else:
            outs = [t for c in calls for t in c.out]
            ogs = [t for c in calls for t in c.grads]
        tensors = [*outs, *ogs, *grads]
        if not tensors and not losses:
            return False
        with internal_work():
            if self._cpu:  # a float per value: no stacked tensor made (it cost more in a step)
                values = [float(t.sum()) for t in tensors]
                values += map(float, losses)
            else:  # one transfer (stacked in the widest dtype: float32 from the losses)
                values = _stacked([*[t.sum() for t in tensors], *losses]).tolist()
        a, b, c = len(outs), len(outs) + len(ogs), len(tensors)
        # every value finite (a sum of finite float32 values is a finite float), one gradient
        # not zero: the step is clean (the usual case)
        if math.isfinite(sum(values)) and (not grads or any(values[b:c])):
            if scaled and self._forward_origin is None:
                self._keep_loss(step, values[c:], scaled, finite=True)
            self._last_step, self._last_loss_bad = step, False  # `_record` of a clean step
            return True
        if scaled and self._forward_origin is None:
            self._keep_loss(step, values[c:], scaled)
        with internal_work():  # each value exactly, as tokens (what the replay keeper reads)
            for call in calls:
                call.out = [finite_token(t) if t.dim() else t for t in call.out]
                call.grads = [finite_token(t) if t.dim() else t for t in call.grads]
            exact = [*(t for call in calls for t in call.out), *(t for c in calls for t in c.grads)]
            tokens = _stacked(exact).tolist() if exact else []
        bad_out = not all(map(math.isfinite, tokens[:a]))
        bad_loss = not all(map(math.isfinite, values[c:]))
        bad_grads, zero = _grads_state(grads, values[b:c])
        bad_bwd = not all(map(math.isfinite, tokens[a:])) or bad_grads

        def fwd_origin() -> dict[str, Any] | None:
            return self._localize(run, backward=False) if bad_out else None

        def bwd_origin() -> dict[str, Any] | None:
            return self._localize(run, backward=True)

        self._record(step, bad_out, bad_loss, bad_bwd, zero, fwd_origin, bwd_origin)
        return not (bad_out or bad_loss or bad_bwd)

    def _localize(self, run: RunContext, backward: bool) -> dict[str, Any] | None:
        """The origin, from the step's forwards (and backwards) replayed with module hooks.

        Each of the step's root forwards (micro-batches) in turn, from its own inputs, with
        the autocast state and the RNG state it started with, on a hook-free replica sharing
        the weights (`fp32_replay.replaying`: RNG forked, buffers restored), before the
        weights change; the backward from the gradient that arrived at its output (the loss
        scale it carried included), by ``torch.autograd.grad`` (no ``.grad`` touched). The
        module hooks record what they record on every step in the exact mode, and
        `origin.py` reads it. Where no replay makes a non-finite value, the origin says
        ``reproduced: False`` and names what the step's check saw (the forward: the root's
        output; the backward: the first non-finite parameter gradient's module).
        """
        model = self._root
        if model is None:
            return None
        for call in self._root_calls:
            try:
                found = self._replay_call(model, call, backward)
            except Exception as exc:  # a failed replay costs the origin, never the user's run
                self._error(exc)
                found = None
            finally:
                self._reset_recording()
            if found is not None:
                return found
        if backward:
            module, kind = self._grad_owner(), "parameter gradient"
        else:
            module, kind = self._names[self._index.get(id(model), 0)], "output"
        return {
            "phase": "backward" if backward else "forward",
            "module": module,
            "kind": kind,
            "parent_code": False,
            "reproduced": False,
        }

    def _reset_recording(self) -> None:
        self._fwd, self._fwd_idx, self._bwd, self._bwd_idx = [], [], [], []
        self._calls, self._stack, self._seen, self._early = [], [], {}, {}

    def _replay_call(
        self, model: torch.nn.Module, call: RootCall, backward: bool
    ) -> dict[str, Any] | None:
        grad = call.grad if backward else None
        if backward and grad is None:
            return None
        device = grad.device if grad is not None else torch.device("cpu")
        self._reset_recording()
        with replaying(model, device) as (replica, originals):
            handles = []
            for m in replica.modules():
                idx = self._index.get(id(originals[id(m)]))
                if idx is None:
                    continue
                handles.append(m.register_forward_pre_hook(partial(_when_training, self._pre, idx)))
                hook = partial(_when_training, self._forward, idx)
                handles.append(m.register_forward_hook(hook, with_kwargs=True))
            try:
                if call.rng is not None:
                    torch.set_rng_state(call.rng)
                with _autocast(call.autocast):
                    out = _first_tensor(replica(*call.args, **call.kwargs), 4)
                self._seen = {}
                if grad is not None and out is not None and out.requires_grad:
                    if out.shape != grad.shape:
                        return None
                    wrt = [p for p in replica.parameters() if p.requires_grad]
                    torch.autograd.grad(out, wrt, grad_outputs=grad, allow_unused=True)
            finally:
                for h in handles:
                    h.remove()
        if self._early:
            self._in_start_order()
        with internal_work():
            fwd = torch.stack(self._fwd).tolist() if self._fwd else []
            bwd = torch.stack(self._bwd).tolist() if self._bwd else []
        fwd_ok = [math.isfinite(v) for v in fwd]
        if not all(fwd_ok):
            return origin.forward(self._calls, self._fwd_idx, fwd_ok, self._names)
        if not backward:
            return None
        bwd_ok = [math.isfinite(v) for v in bwd]
        return origin.backward(self._calls, self._bwd_idx, bwd_ok, self._names)

    def _keep_loss(
        self, step: int, values: list[float], scaled: list[bool], finite: bool = False
    ) -> None:
        """Keeps the step's losses when their sum is finite (``finite``: known to be).

        As read: summed (`_step_loss`) only for the section, not on every step.
        """
        if not finite and not math.isfinite(_step_loss(values, scaled)):
            return
        if len(self._loss_head) < LOSS_HEAD:
            self._loss_head.append((step, values, scaled))
        else:
            self._loss_tail.append((step, values, scaled))

    def _grad_owner(self) -> str:
        """The module of the first parameter whose gradient is non-finite now (or "?")."""
        for name, p in self._params:
            if p.grad is not None and not bool(torch.isfinite(p.grad).all()):
                return name.rpartition(".")[0] or name
        return "?"

    def section(self) -> SentinelSection | None:
        """The first inf/NaN by phase, and the steps that held any."""
        self._resolve(wait=True)
        if not self._steps:
            return None
        return {
            "steps_watched": self._steps,
            "forward_origin": self._forward_origin,
            "backward_origin": self._backward_origin,
            "nonfinite_steps": self._nonfinite[:MAX_LISTED],
            "nonfinite_step_count": len(self._nonfinite),
            "backward_only_steps": self._backward_only[:MAX_LISTED],
            "loss_nonfinite_steps": self._loss_bad[:MAX_LISTED],
            "zero_grad_steps": self._zero_grads[:MAX_LISTED],
            "last_step": self._last_step,
            "last_loss_nonfinite": self._last_loss_bad,
            "loss_history": [
                [s, _step_loss(v, k)] for s, v, k in [*self._loss_head, *self._loss_tail]
            ],
            "errors": self._errors,
            "replay": self._replay.section(),
        }
