"""The step boundaries (and each step's loss) of a run, at the lightest cost: outside a window.

While a window of steps is closed nothing of the diagnosis runs (docs/guide/windows.md); what
is left is counting the steps, at the boundaries `Diagnosis` uses (the first optimizer's
``step()``; with a GradScaler its ``update()``, since ``scaler.step`` may skip
``optimizer.step``; or ``d.step()`` once called), so that the window opens at the step it
names: one global optimizer post-hook and an observe-only patch of ``GradScaler.update``. For
a trigger, each step's losses are summed too (a patch of ``Tensor.backward``) and copied to
the host without waiting (`_host.Deferred`). `StepWatch.close` removes everything.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

import torch

from ampdiag.sources.live import global_hooks
from ampdiag.sources.live.collectors._host import Deferred
from ampdiag.sources.live.collectors.base import is_internal_work
from ampdiag.sources.live.patching import Patches


class StepWatch:
    """Counts step boundaries and, optionally, reads each step's loss.

    Args:
        on_boundary: Called with the index of the step that ended.
        first_step: The index of the step in progress when the watch starts.
        losses: Also sum each step's losses (for a trigger).
        scaler: A GradScaler known from the start (its ``update()`` ends the steps).
    """

    def __init__(
        self,
        on_boundary: Callable[[int], None],
        *,
        first_step: int = 0,
        losses: bool = False,
        scaler: Any = None,
    ) -> None:
        self.step = first_step
        self.paused = False  # a window's block counts the steps itself meanwhile
        self._inflight: list[tuple[int, Deferred]] = []  # step losses on their way
        self._on_boundary = on_boundary
        self._thread = threading.get_ident()
        self._primary: int | None = None
        self._scaler = scaler
        self._manual = False
        self._scaled: torch.Tensor | None = None
        self._plain: torch.Tensor | None = None
        self._losses = losses
        self._patches = Patches()
        self._handle: global_hooks.Handle | None = global_hooks.add(
            global_hooks.OPTIMIZER_POST, self._after_optimizer_step
        )
        self._patch_scaler()
        if losses:
            self._patch_backward()

    def _mine(self) -> bool:
        return not self.paused and threading.get_ident() == self._thread and not is_internal_work()

    def mark(self) -> None:
        """A step boundary marked by hand (``d.step()``): from now on only those count."""
        self._manual = True
        if not self.paused:
            self._boundary()

    def _after_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if not self._mine():
            return
        if self._primary is None:
            self._primary = id(optimizer)
        if self._manual or self._scaler is not None or id(optimizer) != self._primary:
            return
        self._boundary()

    def _boundary(self) -> None:
        step = self.step
        current = self._scaled if self._scaled is not None else self._plain
        self._scaled = self._plain = None
        if current is not None:
            # a loss that cannot be read (a meta tensor): none
            with contextlib.suppress(Exception):
                self._inflight.append((step, Deferred(current, copy=False)))
        self.step = step + 1
        self._on_boundary(step)

    def ready_losses(self) -> list[tuple[int, float]]:
        """(step, loss) of the steps whose loss reached the host, oldest first (no wait)."""
        out: list[tuple[int, float]] = []
        while self._inflight and self._inflight[0][1].ready():
            step, deferred = self._inflight.pop(0)
            values = deferred.values()
            if values:
                out.append((step, values[0]))
        return out

    def _add_loss(self, loss: torch.Tensor, from_scaler: bool) -> None:
        value = loss.detach().reshape(()).float()
        if from_scaler:
            self._scaled = value if self._scaled is None else self._scaled + value
        else:
            self._plain = value if self._plain is None else self._plain + value

    def _patch_scaler(self) -> None:
        watch = self

        def make_scale(original: Callable[..., Any]) -> Callable[..., Any]:
            def scale(scaler: Any, outputs: Any) -> Any:
                if watch._mine():
                    if watch._scaler is None:
                        watch._scaler = scaler
                    if watch._losses and isinstance(outputs, torch.Tensor) and outputs.numel() == 1:
                        watch._add_loss(outputs, True)
                return original(scaler, outputs)

            return scale

        def make_update(original: Callable[..., Any]) -> Callable[..., Any]:
            def update(scaler: Any, *args: Any, **kwargs: Any) -> Any:
                result = original(scaler, *args, **kwargs)
                if watch._mine() and not watch._manual and scaler is watch._scaler:
                    watch._boundary()
                return result

            return update

        self._patches.wrap(torch.amp.GradScaler, "scale", make_scale)
        self._patches.wrap(torch.amp.GradScaler, "update", make_update)

    def _patch_backward(self) -> None:
        watch = self

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def backward(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
                if watch._mine() and tensor.numel() == 1:
                    watch._add_loss(tensor, False)
                return original(tensor, *args, **kwargs)

            backward.__doc__ = original.__doc__
            return backward

        self._patches.wrap(torch.Tensor, "backward", make)

    def close(self) -> None:
        """Removes the hook and the patches. Safe to call twice."""
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.remove()
        self._patches.restore()
        self._scaled = self._plain = None
        self._inflight.clear()
