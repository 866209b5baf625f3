"""Finding the model, optimizer, GradScaler, loss and autocast state of a live run by itself.

Global hooks (torch's module and optimizer hook registries) and observe-only patches of
``torch.Tensor.backward`` and ``GradScaler.scale/update`` tell the engine what the user's code
does, without the user passing anything. Everything here is removed by `Discovery.close()`.
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

AUTOCAST_DEVICES = ("cuda", "cpu")


def autocast_state() -> str | None:
    """Returns "device:dtype" of the innermost active autocast, or None when none is active."""
    for device in AUTOCAST_DEVICES:
        if torch.is_autocast_enabled(device):
            dtype = torch.get_autocast_dtype(device)
            return f"{device}:{str(dtype).removeprefix('torch.')}"
    return None


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
    ) -> None:
        self._on_model = on_model
        self._on_autocast = on_autocast
        self._on_loss = on_loss
        self._on_scaler = on_scaler
        self._on_scaler_update = on_scaler_update
        # The block observes the thread that entered it; hooks fire in every thread.
        self._thread = threading.get_ident()
        self._depth = 0
        self._roots: set[int] = set()
        self._handles: list[Any] = []
        self._patches = Patches()
        self._global_module_hooks: list[Any] = []
        self._global_module_hooks.append(global_hooks.add(MODULE_PRE, self._forward_pre))
        self._global_module_hooks.append(global_hooks.add(MODULE_POST, self._forward_post))
        self._handles.append(
            global_hooks.add(
                OPTIMIZER_PRE, lambda opt: on_optimizer_pre(opt) if self._mine() else None
            )
        )
        self._handles.append(
            global_hooks.add(
                OPTIMIZER_POST, lambda opt: on_optimizer_post(opt) if self._mine() else None
            )
        )
        self._patch_backward()
        self._patch_scaler()

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
            self._on_model(module)
        if self._depth == 0 and id(module) in self._roots:
            self._on_autocast(autocast_state())
        self._depth += 1

    def _forward_post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if not self._mine():
            return
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
            module.register_forward_pre_hook(
                lambda m, a: self._on_autocast(autocast_state()) if self._mine() else None
            )
        )

    # --- loss and scaler -----------------------------------------------------------------------

    def _patch_backward(self) -> None:
        on_loss = self._on_loss

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
                if self.numel() == 1:
                    with internal_work():
                        on_loss(self.detach(), False)
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
