"""Device -> host copies that do not stall the training loop.

A collector packs a step's small device results into one float64 tensor and hands it to
`Deferred`. On CUDA the copy goes to pinned memory with ``non_blocking=True`` and an event;
the values are read at a later step (the copy is long finished by then), so the host never
waits on the device mid-step. On the CPU the copy is immediate. Either way: one transfer per
sampled step.
"""

from __future__ import annotations

import torch


class Deferred:
    """One packed device tensor on its way to the host.

    Args:
        packed: A 1-D tensor (any dtype convertible to float64).
    """

    def __init__(self, packed: torch.Tensor) -> None:
        packed = packed.detach().reshape(-1).to(torch.float64)
        self._event: torch.cuda.Event | None = None
        if packed.is_cuda:
            host = torch.empty(packed.shape, dtype=torch.float64, pin_memory=True)
            host.copy_(packed, non_blocking=True)
            self._event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self._event.record()
            self._host = host
        else:
            self._host = packed.clone() if packed.device.type == "cpu" else packed.cpu()

    def ready(self) -> bool:
        """Whether reading now would not wait for the device."""
        return self._event is None or bool(self._event.query())  # type: ignore[no-untyped-call]

    def values(self) -> list[float]:
        """The values (waits for the copy when it is still running)."""
        if self._event is not None:
            self._event.synchronize()
        return [float(v) for v in self._host.tolist()]


def pack(parts: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Concatenates tensors (any shape and dtype) into one 1-D float64 tensor on ``device``."""
    if not parts:
        return torch.zeros(0, dtype=torch.float64, device=device)
    return torch.cat([p.detach().reshape(-1).to(device=device, dtype=torch.float64) for p in parts])
