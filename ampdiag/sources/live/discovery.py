"""Finding the model, optimizer, GradScaler, loss and autocast state of a live run by itself.

Global hooks (torch's module and optimizer hook registries) and observe-only patches of
``torch.Tensor.backward`` and ``GradScaler.scale/update`` tell the engine what the user's code
does, without the user passing anything. Everything here is removed by `Discovery.close()`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_module

from ampdiag.sources.live.collectors.base import internal_work
from ampdiag.sources.live.patching import Patches

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


class Discovery:
    """Installs the global hooks and patches; calls back into the engine as things are seen.

    Args:
        on_model: Called with a root module (one with parameters, called outside any other
            module) the first time it runs.
        on_optimizer_pre: Called before every optimizer step with the optimizer.
        on_optimizer_post: Called after every optimizer step with the optimizer.
        on_loss: Called with each scalar passed to backward or to GradScaler.scale (detached),
            and whether it came from the scaler (unscaled loss).
        on_scaler: Called with a GradScaler the first time its scale() runs.
        on_scaler_update: Called after each GradScaler.update().
        on_autocast: Called with the autocast state at each root module's forward.
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
        self._on_autocast = on_autocast
        self._on_loss = on_loss
        self._on_scaler = on_scaler
        self._on_scaler_update = on_scaler_update
        self._on_backward = on_backward
        self._on_accumulated = on_accumulated
        self._depth = 0
        self._roots: set[int] = set()
        self._handles: list[Any] = []
        self._patches = Patches()
        self._global_module_hooks: list[Any] = []
        self._global_module_hooks.append(
            nn_module.register_module_forward_pre_hook(self._forward_pre)
        )
        self._global_module_hooks.append(
            nn_module.register_module_forward_hook(self._forward_post, always_call=True)
        )
        self._handles.append(
            optim_module.register_optimizer_step_pre_hook(
                lambda opt, args, kwargs: on_optimizer_pre(opt)
            )
        )
        self._handles.append(
            optim_module.register_optimizer_step_post_hook(
                lambda opt, args, kwargs: on_optimizer_post(opt)
            )
        )
        self._patch_backward()
        self._patch_scaler()

    # --- modules -------------------------------------------------------------------------------

    def _forward_pre(self, module: torch.nn.Module, args: Any) -> None:
        is_new = self._depth == 0 and id(module) not in self._roots
        if is_new and any(True for _ in module.parameters()):
            self._roots.add(id(module))
            self._on_model(module)
        if self._depth == 0 and id(module) in self._roots:
            self._on_autocast(autocast_state())
        self._depth += 1

    def _forward_post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self._depth = max(0, self._depth - 1)

    def stop_searching_models(self) -> None:
        """Removes the global module hooks (called once the first step ended: a cost saver).

        Root modules already found keep a forward pre-hook of their own that records autocast.
        """
        for handle in self._global_module_hooks:
            handle.remove()
        self._global_module_hooks.clear()
        self._depth = 0

    def watch_root(self, module: torch.nn.Module) -> None:
        """Records the autocast state at each forward of a known root module."""
        self._handles.append(
            module.register_forward_pre_hook(lambda m, a: self._on_autocast(autocast_state()))
        )
        reference = reference_parameter(module)
        if reference is not None:
            on_accumulated = self._on_accumulated
            self._handles.append(
                reference.register_post_accumulate_grad_hook(  # type: ignore[no-untyped-call]
                    lambda p: on_accumulated()
                )
            )

    # --- loss and scaler -----------------------------------------------------------------------

    def _patch_backward(self) -> None:
        on_loss, on_backward = self._on_loss, self._on_backward

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
                if self.numel() == 1:
                    with internal_work():
                        on_loss(self.detach(), False)
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
                        on_loss(outputs.detach(), True)
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

    def close(self) -> None:
        """Removes every hook and patch. Safe to call twice."""
        self.stop_searching_models()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._patches.restore()
