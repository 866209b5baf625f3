"""Device -> host copies that do not stall the training loop.

A collector hands a step's small device results to `Deferred` (one packed tensor, or a few).
On CUDA each goes to pinned memory with ``non_blocking=True`` and one event is recorded; the
values are read at a later step (the copy is long finished by then), so the host never waits
on the device mid-step. On the CPU there is nothing to copy. Either way: one transfer (one
event) per sampled step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt


class Deferred:
    """Device tensors on their way to the host.

    Args:
        packed: A tensor, or a list of tensors (any shapes and dtypes).
        copy: Snapshot CPU tensors (clone). Pass False for tensors made for this transfer
            that nothing else writes to (saves a copy); a live tensor (a GradScaler's scale)
            must be snapshotted.
    """

    def __init__(self, packed: torch.Tensor | list[torch.Tensor], copy: bool = True) -> None:
        self._event: torch.cuda.Event | None = None
        self._host: list[torch.Tensor] = []
        self._arrays: list[npt.NDArray[np.generic]] | None = None
        cuda = False
        for part in [packed] if isinstance(packed, torch.Tensor) else packed:
            if part.requires_grad:
                part = part.detach()
            if part.is_cpu:
                self._host.append(part.clone() if copy else part)
            elif part.is_cuda:
                host = torch.empty(part.shape, dtype=part.dtype, pin_memory=True)
                host.copy_(part, non_blocking=True)
                self._host.append(host)
                cuda = True
            else:
                self._host.append(part.cpu())
        if cuda:
            self._event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self._event.record()

    @classmethod
    def on_host(cls, arrays: list[npt.NDArray[np.generic]]) -> Deferred:
        """Results already on the host (a CPU run): `arrays` returns ``arrays`` as they are."""
        self = cls.__new__(cls)
        self._event = None
        self._host = []
        self._arrays = arrays
        return self

    def ready(self) -> bool:
        """Whether reading now would not wait for the device."""
        return self._event is None or bool(self._event.query())  # type: ignore[no-untyped-call]

    def _wait(self) -> None:
        if self._event is not None:
            self._event.synchronize()

    def arrays(self) -> list[npt.NDArray[np.generic]]:
        """The parts as numpy arrays, in the given order (waits for a running copy)."""
        if self._arrays is not None:
            return self._arrays
        self._wait()
        return [(p.float() if p.dtype == torch.bfloat16 else p).numpy() for p in self._host]

    def values(self) -> list[float]:
        """All values as floats, parts concatenated flat (waits for a running copy)."""
        return [float(v) for a in self.arrays() for v in a.reshape(-1).tolist()]


def pack(parts: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Concatenates tensors (any shape and dtype) into one 1-D float64 tensor on ``device``."""
    if not parts:
        return torch.zeros(0, dtype=torch.float64, device=device)
    return torch.cat([p.detach().reshape(-1).to(device=device, dtype=torch.float64) for p in parts])


def absorb_ready(
    pending: list[tuple[Any, ...]], absorb: Callable[..., None], wait: bool
) -> list[tuple[Any, ...]]:
    """Calls ``absorb(*item)`` for each pending item whose copy is done; returns the others.

    Each item's last element is its `Deferred`. With ``wait`` every item is absorbed (at the
    end of the run), waiting for copies still running.
    """
    keep = []
    for item in pending:
        if wait or item[-1].ready():
            absorb(*item)
        else:
            keep.append(item)
    return keep


def grown(arr: Any, extra: int, tail: tuple[int, ...], dtype: Any) -> Any:
    """``arr`` (None: empty) with ``extra`` more rows of zeros, each of shape ``tail``."""
    import numpy as np

    more = np.zeros((extra, *tail), dtype=dtype)
    return more if arr is None else np.concatenate([arr, more])
