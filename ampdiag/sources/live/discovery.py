"""Finding the model, optimizer, GradScaler, loss and autocast state of a live run by itself.

Global hooks (torch's module and optimizer hook registries) and observe-only patches of
``torch.Tensor.backward`` and ``GradScaler.scale/update`` tell the engine what the user's code
does, without the user passing anything. Everything here is removed by `Discovery.close()`.

**Where autocast is seen.** What counts is the autocast state the model's ops actually ran
in, wherever autocast was entered: around the loop, inside ``forward``, in a wrapped forward
(Accelerate and so HF Trainer do ``model.forward = autocast(...)(model.forward)``, entered
*after* the root's call begins), in a framework's precision plugin, or around part of the
model. So a root forward counts under the state at its entry, or, when that is none, under
the first low-precision state that ``torch.autocast.__enter__`` set while it ran (patched:
observed, then passed through) -- a model whose embedding runs outside autocast and the rest
inside still computes under autocast. Nothing runs per module. The precision audit records,
op by op, the state every op ran in on its step; tests hold the two to the same answer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from ampdiag.sources.live import global_hooks
from ampdiag.sources.live.collectors.base import internal_work, is_internal_work
from ampdiag.sources.live.global_hooks import MODULE_POST, MODULE_PRE, OPTIMIZER_POST, OPTIMIZER_PRE
from ampdiag.sources.live.patching import Patches
from ampdiag.trace.step_breakdown import CLOSURE_PREFIX

AUTOCAST_DEVICES = ("cuda", "cpu")


def autocast_state() -> str | None:
    """Returns "device:dtype" of the innermost active autocast, or None when none is active."""
    for device in AUTOCAST_DEVICES:
        if torch.is_autocast_enabled(device):
            dtype = torch.get_autocast_dtype(device)
            return f"{device}:{str(dtype).removeprefix('torch.')}"
    return None


def reference_parameter(module: torch.nn.Module) -> torch.Tensor | None:
    """The module's first parameter that requires a gradient.

    Every backward through the model reaches it, so its accumulations count the backward
    passes (micro-batches).
    """
    return next((p for p in module.parameters() if p.requires_grad), None)


def split_parameters(
    model: torch.nn.Module, optimizers: list[torch.optim.Optimizer]
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The model's parameters as the optimizer sees them: ``(updated, frozen)``.

    A module the loop calls often holds more than it trains: timm's wrapper keeps a frozen EMA
    copy beside the model, distillation a teacher. Updated: the parameters some optimizer's
    param groups hold (where no optimizer is known, those that require a gradient); frozen:
    the rest, held (and in memory) but never updated -- stated apart, so that a 207,323
    parameter model with its EMA copy reads 207,323, not 414,646.
    """
    params: list[torch.Tensor] = list(model.parameters())
    held = {id(p) for o in optimizers for g in o.param_groups for p in g.get("params", [])}
    if held:
        updated = [p for p in params if id(p) in held]
    else:
        updated = [p for p in params if p.requires_grad]
    ids = {id(p) for p in updated}
    return updated, [p for p in params if id(p) not in ids]


def frozen_holders(model: torch.nn.Module, frozen: list[torch.Tensor], limit: int = 4) -> list[str]:
    """The model's direct children that hold only frozen parameters (``ema``, ``teacher``)."""
    ids = {id(p) for p in frozen}
    out = []
    for name, child in model.named_children():
        own = list(child.parameters())
        if own and all(id(p) in ids for p in own):
            out.append(name)
    return out[:limit]


def dominant_autocast(seen: dict[str, int]) -> str | None:
    """The low-precision autocast state most forwards ran under ("cpu:bfloat16"), or None.

    ``seen`` is the run's ``autocast_seen`` ("device:dtype" or "none" -> forwards); this is
    what the environment header, the speed probe and the rules call *the* autocast of a run.
    """
    states = {k: v for k, v in seen.items() if k != "none"}
    return max(states, key=states.__getitem__) if states else None


class AutocastWatch:
    """The autocast state each forward of the watched roots computed in (see the module doc).

    Args:
        on_state: Called once per root forward with its state ("device:dtype" or None).
    """

    def __init__(self, on_state: Callable[[str | None], None]) -> None:
        self._on_state = on_state
        self._handles: list[Any] = []
        self._root: int | None = None
        self._state: str | None = None

    def watch(self, root: torch.nn.Module) -> None:
        """Watches a root model's forwards (entry and exit)."""
        self._handles.append(global_hooks.on_root(root, self._pre, self._post))

    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        if self._root is not None:  # a root called inside another root's forward
            return
        self._root = id(module)
        self._state = autocast_state()

    def entered(self) -> None:
        """``torch.autocast`` was entered in this thread (its state is set now)."""
        if self._root is not None and self._state is None:
            self._state = autocast_state()

    def _post(self, module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        if self._root != id(module):
            return
        self._root = None
        self._on_state(self._state)

    def close(self) -> None:
        """Removes every hook. Safe to call twice."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


class Discovery:
    """Installs the global hooks and patches; calls back into the engine as things are seen.

    Args:
        on_model: Called with a root module (one with parameters, called outside any other
            module) the first time it runs.
        on_optimizer_pre: Called with the optimizer when its step is about to use the
            gradients: before ``step()``, or, for ``step(closure)`` (Lightning, LBFGS), after
            the closure (which runs forward and backward) first returned. LBFGS calls the
            closure again within the step (its iterations and line search): those
            *re-evaluations* of the step are not reported at all (no ``on_loss``,
            ``on_backward``, ``on_accumulated``, nor another ``on_optimizer_pre``): the step
            is one batch's forward and backward, its loss the first evaluation's.
        on_optimizer_post: Called after every optimizer step with the optimizer.
        on_loss: Called with each scalar passed to backward or to GradScaler.scale (the live
            tensor, before its backward: collectors may walk its graph; never modify it),
            and whether it came from the scaler (unscaled loss).
        on_scaler: Called with a GradScaler the first time its scale() runs.
        on_scaler_update: Called after each GradScaler.update().
        on_autocast: Called with the autocast state each root forward computed in
            (`AutocastWatch`).
        on_backward: Called with the tensor itself before each ``Tensor.backward``.
        on_accumulated: Called after each backward pass accumulated a gradient into a root
            model's first trainable parameter (one call per backward pass that reached it).
    """

    def __init__(
        self,
        *,
        on_model: Callable[[torch.nn.Module], None],
        on_optimizer_pre: Callable[[torch.optim.Optimizer], None],
        on_optimizer_post: Callable[[torch.optim.Optimizer], None],
        on_loss: Callable[[torch.Tensor, bool], None],
        on_scaler: Callable[[Any], None],
        on_scaler_update: Callable[[Any], None],
        on_autocast: Callable[[str | None], None],
        on_backward: Callable[[torch.Tensor], None] = lambda t: None,
        on_accumulated: Callable[[], None] = lambda: None,
    ) -> None:
        self._on_model = on_model
        self._on_optimizer_pre = on_optimizer_pre
        self._autocast = AutocastWatch(on_autocast)
        self._on_loss = on_loss
        self._on_scaler = on_scaler
        self._on_scaler_update = on_scaler_update
        self._on_backward = on_backward
        self._on_accumulated = on_accumulated
        # The block observes the thread that entered it; hooks fire in every thread.
        self._thread = threading.get_ident()
        self._depth = 0
        #: The module whose first forward is being reported to ``on_model`` (else None).
        self.discovering: torch.nn.Module | None = None
        self._reevaluating = False  # inside a closure the optimizer called again in its step
        self._roots: set[int] = set()
        self._handles: list[Any] = []
        self._patches = Patches()
        self._global_module_hooks: list[Any] = []
        self._global_module_hooks.append(global_hooks.add(MODULE_PRE, self._forward_pre))
        self._global_module_hooks.append(global_hooks.add(MODULE_POST, self._forward_post))
        self._on_optimizer_post = on_optimizer_post
        self._handles.append(global_hooks.add(OPTIMIZER_PRE, self._step_pre))
        self._handles.append(global_hooks.add(OPTIMIZER_POST, self._step_post))
        self._patch_backward()
        self._patch_scaler()
        self._patch_autocast()

    # --- modules -------------------------------------------------------------------------------

    def _mine(self) -> bool:
        """Whether a hook fired for the block's own work (its thread, not ampdiag's probes)."""
        return threading.get_ident() == self._thread and not is_internal_work()

    def _forward_pre(self, module: torch.nn.Module, args: Any) -> None:
        if not self._mine():
            return
        is_new = self._depth == 0 and id(module) not in self._roots
        if is_new and any(True for _ in module.parameters()):
            self._roots.add(id(module))
            self.discovering = module
            try:
                self._on_model(module)
            finally:
                self.discovering = None
            if self._depth == 0:  # the root callbacks registered now see this forward too
                global_hooks.first_call(module, args)
        self._depth += 1

    def _forward_post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if not self._mine():
            return
        self._depth = max(0, self._depth - 1)

    def stop_searching_models(self) -> None:
        """Removes the global module hooks (called once the first step ended: a cost saver).

        Root modules already found keep hooks of their own that record autocast.
        """
        for handle in self._global_module_hooks:
            handle.remove()
        self._global_module_hooks.clear()
        self._depth = 0

    def watch_root(self, module: torch.nn.Module) -> None:
        """Records the autocast state each forward of a known root module computed in."""
        self._autocast.watch(module)  # counts only forwards of the block's thread
        reference = reference_parameter(module)
        if reference is not None:
            on_accumulated = self._on_accumulated
            self._handles.append(
                reference.register_post_accumulate_grad_hook(  # type: ignore[no-untyped-call]
                    lambda p: None if self._reevaluating else on_accumulated()
                )
            )

    # --- optimizer -----------------------------------------------------------------------------

    def _step_pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> Any:
        """Reports the step before it uses the gradients: after its closure, if it has one.

        Lightning runs forward and backward inside ``optimizer.step(closure)``: at the step's
        pre-hook no gradient of this step exists yet. The closure is handed on wrapped (same
        call, same result) so that the report comes when it returns, before the update.
        """
        if threading.get_ident() != self._thread or is_internal_work():  # not `_mine`: a frame
            return None
        # args[0] is the optimizer itself (the hook sees step's own arguments).
        closure = kwargs.get("closure") if kwargs else None
        in_args = closure is None and len(args) > 1 and callable(args[1])
        if in_args:
            closure = args[1]
        if closure is None:
            self._on_optimizer_pre(optimizer)
            return None
        on_pre = self._on_optimizer_pre
        label = CLOSURE_PREFIX + type(optimizer).__name__
        calls = 0

        def closure_then_report() -> Any:
            nonlocal calls
            calls += 1
            if calls > 1:  # the same step re-evaluated (LBFGS): not another micro-batch
                return self._reevaluate(closure, label)
            # Marked in the trace: the step split counts it as forward/backward, not optimizer.
            with torch.profiler.record_function(label):
                result = closure()
            on_pre(optimizer)
            return result

        if in_args:
            return (args[0], closure_then_report, *args[2:]), kwargs
        return args, {**kwargs, "closure": closure_then_report}

    def _step_post(self, optimizer: torch.optim.Optimizer) -> None:
        if threading.get_ident() == self._thread and not is_internal_work():
            self._on_optimizer_post(optimizer)

    def _reevaluate(self, closure: Callable[[], Any], label: str) -> Any:
        """Runs a closure the optimizer called again in its step, its backward unreported."""
        previous, self._reevaluating = self._reevaluating, True
        try:
            with torch.profiler.record_function(label):
                return closure()
        finally:
            self._reevaluating = previous

    # --- loss and scaler -----------------------------------------------------------------------

    def _patch_backward(self) -> None:
        on_loss, on_backward, discovery = self._on_loss, self._on_backward, self

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
                if not discovery._reevaluating:
                    if self.numel() == 1:
                        with internal_work():
                            on_loss(self, False)
                    on_backward(self)
                return original(self, *args, **kwargs)

            backward.__doc__ = original.__doc__
            return backward

        self._patches.wrap(torch.Tensor, "backward", make)

    def _patch_scaler(self) -> None:
        scaler_cls = torch.amp.GradScaler
        on_loss, on_scaler, on_update = self._on_loss, self._on_scaler, self._on_scaler_update
        seen: set[int] = set()

        def make_scale(original: Callable[..., Any]) -> Callable[..., Any]:
            def scale(self: Any, outputs: Any) -> Any:
                if id(self) not in seen:
                    seen.add(id(self))
                    on_scaler(self)
                if isinstance(outputs, torch.Tensor) and outputs.numel() == 1:
                    with internal_work():
                        on_loss(outputs, True)
                return original(self, outputs)

            return scale

        def make_update(original: Callable[..., Any]) -> Callable[..., Any]:
            def update(self: Any, *args: Any, **kwargs: Any) -> Any:
                result = original(self, *args, **kwargs)
                on_update(self)
                return result

            return update

        self._patches.wrap(scaler_cls, "scale", make_scale)
        self._patches.wrap(scaler_cls, "update", make_update)

    def _patch_autocast(self) -> None:
        watch = self._autocast

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def enter(self: Any) -> Any:
                result = original(self)
                watch.entered()
                return result

            return enter

        self._patches.wrap(torch.amp.autocast_mode.autocast, "__enter__", make)

    def close(self) -> None:
        """Removes every hook and patch. Safe to call twice."""
        self.stop_searching_models()
        self._autocast.close()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._patches.restore()
