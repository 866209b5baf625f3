"""Exponent histograms on the device: a few fused kernels for any number of tensors.

Each value is viewed as float32 bits; ``bits >> 23`` is its sign and exponent field
(-256..255), so one ``bincount`` over it plus ``512 * row + 256`` counts every tensor's values
by sign and exponent at once (the sign is folded afterwards, on the host where possible). No
host sync: on CUDA the counting is a scatter-add (``torch.bincount`` on CUDA reads its input's
range on the host).
See ``ampdiag.analysis.fp16range`` for what the bins mean.

Sampling: a tensor with more than ``limit`` values is read through one strided view of
``limit // CHUNK`` runs of ``CHUNK`` consecutive values spread evenly over it (the run starts
step by an amount coprime with the last dimension, so the runs sit at every column offset).
The view costs one call and no copy; the runs are cache-friendly to gather.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from ampdiag.compat.dispatch import below_autograd
from ampdiag.compat.foreach import foreach_copy_

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

BINS = 256
_LAST = "last"  # key of the plan used last in a cache of plans
#: Consecutive values per run of a sample (one 64-byte cache line of float32).
CHUNK = 16


@functools.lru_cache(maxsize=4096)
def _plan(shape: tuple[int, ...], limit: int) -> tuple[int, int, int] | None:
    """(runs, run length, run step) to sample a contiguous tensor of ``shape``; None: all."""
    n = math.prod(shape)
    if limit <= 0 or n <= limit:
        return None
    length = max(1, min(CHUNK, limit))
    runs = max(1, limit // length)
    if runs == 1:
        return 1, length, 0
    step = (n - length) // (runs - 1)  # >= length because n > runs * length
    last = shape[-1] if shape else 1
    while step > length and math.gcd(step, last) != 1:
        step -= 1
    return runs, length, step


def sample_view(t: torch.Tensor, limit: int) -> torch.Tensor:
    """At most ``limit`` values of ``t`` (all when ``limit`` is 0), as a 1-D or 2-D view.

    No copy for a contiguous tensor (the usual case): a strided view into its storage. Keep
    the view only as long as ``t`` may be kept; copy it (``.clone()``) otherwise.
    """
    if not t.is_contiguous():
        t = t.contiguous()
    plan = _plan(tuple(t.shape), limit)
    if plan is None:
        n = t.numel()
        return t.view(-1, CHUNK) if n % CHUNK == 0 and n else t.reshape(-1)
    runs, length, step = plan
    return torch.as_strided(t, (runs, length), (step, 1))


#: CPU buffers of a plan: (one view of the buffer per wide sample, the rest, the buffer's
#: bits and the bin offsets as numpy arrays sharing memory with the tensors).
_HostBuffers = tuple[
    list[torch.Tensor], torch.Tensor, "npt.NDArray[np.int32]", "npt.NDArray[np.int32]"
]


class _GatherPlan:
    """How to sample a list of tensors of given shapes (see `_gather`).

    Attributes:
        wide: (index, size, stride) of the 2-D views of width CHUNK (one cat gathers them).
        whole: Indices of 1-D tensors taken whole, as they are, into the final cat.
        narrow: Indices of the rest (flattened samples; rare).
        order: The tensor index of each sample in gathered order.
        sizes: The sample sizes in gathered order.
        offsets: Per device, the bin offsets of the gathered values (row = tensor index).
        buffers: Per device, a reused float32 buffer the samples are gathered into, with its
            views (wide part as rows of CHUNK, the rest, the whole as int32).
    """

    __slots__ = ("_host", "buffers", "narrow", "offsets", "order", "sizes", "whole", "wide")

    def __init__(self, shapes: tuple[torch.Size, ...], limit: int) -> None:
        self.wide: list[tuple[int, tuple[int, int], tuple[int, int]]] = []
        self.whole: list[int] = []
        self.narrow: list[int] = []
        sizes_w: list[int] = []
        sizes_h: list[int] = []
        sizes_r: list[int] = []
        for i, shape in enumerate(shapes):
            n = math.prod(shape)
            plan = _plan(tuple(shape), limit)
            if plan is None and len(shape) == 1:
                self.whole.append(i)
                sizes_h.append(n)
            elif plan is None and n % CHUNK == 0 and n:
                self.wide.append((i, (n // CHUNK, CHUNK), (CHUNK, 1)))
                sizes_w.append(n)
            elif plan is not None and plan[1] == CHUNK:
                self.wide.append((i, (plan[0], CHUNK), (plan[2], 1)))
                sizes_w.append(plan[0] * CHUNK)
            else:
                self.narrow.append(i)
                sizes_r.append(n if plan is None else plan[0] * plan[1])
        self.order = tuple([w[0] for w in self.wide] + self.whole + self.narrow)
        self.sizes = tuple(sizes_w + sizes_h + sizes_r)
        self.offsets: dict[torch.device, torch.Tensor] = {}
        self.buffers: dict[torch.device, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._host: _HostBuffers | None = None

    def host(self) -> _HostBuffers:
        """The plan's buffers on the CPU, with numpy views (see ``_HostBuffers``)."""
        if self._host is None:
            cpu = torch.device("cpu")
            wide_out, rest_out, bits = self.buffer(cpu)
            slices = list(torch.split(wide_out, [size[0] for _, size, _ in self.wide]))
            self._host = (slices, rest_out, bits.numpy(), _plan_offsets(self, cpu).numpy())
        return self._host

    def buffer(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(wide part as (rows, CHUNK), the rest (1-D), everything as int32) on ``device``."""
        found = self.buffers.get(device)
        if found is None:
            total = sum(self.sizes)
            nwide = sum(self.sizes[: len(self.wide)])
            buf = torch.empty(total, dtype=torch.float32, device=device)
            found = (buf[:nwide].view(-1, CHUNK), buf[nwide:], buf.view(torch.int32))
            self.buffers[device] = found
        return found


@functools.lru_cache(maxsize=256)
def _gather_plan(shapes: tuple[torch.Size, ...], limit: int) -> _GatherPlan:
    return _GatherPlan(shapes, limit)


def _gather(tensors: list[torch.Tensor], limit: int) -> tuple[torch.Tensor, _GatherPlan]:
    plan = _gather_plan(tuple([t.shape for t in tensors]), limit)
    parts = []
    if plan.wide:
        parts.append(torch.cat(_wide_views(tensors, plan)).view(-1))
    if plan.whole:
        parts += [tensors[i] for i in plan.whole]
    if plan.narrow:
        parts += [sample_view(tensors[i], limit).reshape(-1) for i in plan.narrow]
    flat = parts[0] if len(parts) == 1 and plan.wide else torch.cat(parts)
    if flat.dtype != torch.float32:
        flat = flat.float()
    return flat, plan


def _wide_views(tensors: list[torch.Tensor], plan: _GatherPlan) -> list[torch.Tensor]:
    """The strided views (rows of CHUNK values) of the plan's wide samples, in plan order."""
    views = []
    for i, size, stride in plan.wide:
        t = tensors[i]
        views.append((t if t.is_contiguous() else t.contiguous()).as_strided(size, stride))
    return views


def _offsets(rows: tuple[int, ...], sizes: tuple[int, ...], device: torch.device) -> torch.Tensor:
    base = torch.tensor(rows, dtype=torch.int32) * (2 * BINS) + BINS
    return torch.repeat_interleave(base, torch.tensor(sizes, dtype=torch.int64)).to(device)


def _count_codes(codes: torch.Tensor, offsets: torch.Tensor, nrows: int) -> torch.Tensor:
    """Histograms (nrows, 2, 256) of float32 bits ``codes`` (int32, rewritten in place).

    ``bits >> 23`` (arithmetic) is ``exponent - 256`` for a negative value and ``exponent``
    for a positive one, so ``+ 512 * row + 256`` (``offsets``) is the bin: two in-place passes
    and a bincount. Row 0 of the sign axis holds the negative values.
    """
    codes >>= 23  # arithmetic; ``__irshift__`` is a cheaper kernel than bitwise_right_shift_
    codes += offsets
    return count(codes, nrows * 2 * BINS).view(nrows, 2, BINS)


def signed_histograms_of(
    samples: list[torch.Tensor],
    rows: list[int] | None = None,
    nrows: int | None = None,
    cache: dict[tuple[object, ...], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Exponent histograms of whole tensors by sign, shape (nrows, 2, 256), int64, on device.

    ``rows``: the row each sample counts into (default: its position; samples sharing a row
    add up); ``nrows`` default ``max(rows) + 1``; ``cache`` keeps the per-value row offsets.
    Fold the sign on the host: cheaper.
    """
    if rows is None:
        rows = list(range(len(samples)))
    if nrows is None:
        nrows = max(rows) + 1 if rows else 0
    if not samples:
        return torch.zeros(nrows, 2, BINS, dtype=torch.int64)
    flat, plan = _gather(samples, 0)  # our own float32 copy: rewritten in place
    ordered = tuple([rows[i] for i in plan.order])
    key = (plan.sizes, ordered, flat.device)
    offsets = cache.get(key) if cache is not None else None
    if offsets is None:
        offsets = _offsets(ordered, plan.sizes, flat.device)
        if cache is not None:
            if len(cache) > 16:
                cache.clear()
            cache[key] = offsets
    return _count_codes(flat.view(torch.int32), offsets, nrows)


def count(codes: torch.Tensor, bins: int) -> torch.Tensor:
    """``torch.bincount(codes, minlength=bins)`` without a host sync on CUDA (int64)."""
    if codes.device.type == "cpu":
        return torch.bincount(codes, minlength=bins)
    out = torch.zeros(bins, dtype=torch.int64, device=codes.device)
    return out.index_add_(0, codes, torch.ones_like(codes, dtype=torch.int64))


def _plan_for(tensors: list[torch.Tensor], limit: int, cache: dict[Any, Any]) -> _GatherPlan:
    """The cached plan for the shapes of ``tensors`` (the last one used is checked first)."""
    shapes = [t.shape for t in tensors]
    last = cache.get(_LAST)
    if last is not None and last[1] == limit and last[0] == shapes:
        found: _GatherPlan = last[2]
        return found
    key = (tuple(shapes), limit)
    plan: _GatherPlan | None = cache.get(key)
    if plan is None:
        if len(cache) > 16:
            cache.clear()
        plan = cache[key] = _GatherPlan(*key)
    cache[_LAST] = (shapes, limit, plan)
    return plan


def _sampled_bits(
    tensors: list[torch.Tensor], limit: int, cache: dict[Any, Any]
) -> tuple[torch.Tensor, _GatherPlan]:
    """The samples of ``tensors`` as float32 bits (int32), in ``plan.order``, and the plan.

    The plan (kept in ``cache`` by the shapes, so its device memory goes with the caller)
    holds the views' geometry, the bin offsets and a reused buffer, so a call is the strided
    views and a cat into the buffer (and one of the small vectors behind it). The returned
    tensor is that buffer (or, for an odd shape, a new tensor): ours to rewrite in place.
    """
    plan = _plan_for(tensors, limit, cache)
    if plan.narrow or any(t.dtype != torch.float32 for t in tensors):
        flat, _ = _gather(tensors, limit)  # the same geometry and order as ``plan``
        return flat.view(torch.int32), plan
    wide_out, rest_out, bits = plan.buffer(tensors[0].device)
    if plan.wide:
        torch.cat(_wide_views(tensors, plan), out=wide_out)
    if plan.whole:
        torch.cat([tensors[i] for i in plan.whole], out=rest_out)
    return bits, plan


def _plan_offsets(plan: _GatherPlan, device: torch.device) -> torch.Tensor:
    offsets = plan.offsets.get(device)
    if offsets is None:
        offsets = plan.offsets[device] = _offsets(plan.order, plan.sizes, device)
    return offsets


def sampled_signed_histograms(
    tensors: list[torch.Tensor], limit: int, cache: dict[Any, Any]
) -> torch.Tensor:
    """Per-tensor exponent histograms by sign of at most ``limit`` values each (n, 2, 256).

    The fast path of the gradient statistics on an accelerator: the strided views, a cat
    into a reused buffer (`_sampled_bits`), two in-place bit operations and a count, all on
    the device (see `host_signed_histograms` for CPU tensors).
    """
    if not tensors:
        return torch.zeros(0, 2, BINS, dtype=torch.int64)
    codes, plan = _sampled_bits(tensors, limit, cache)
    return _count_codes(codes, _plan_offsets(plan, codes.device), len(tensors))


def host_signed_histograms(
    tensors: list[torch.Tensor], limit: int, cache: dict[Any, Any]
) -> npt.NDArray[np.int64]:
    """`sampled_signed_histograms` of CPU tensors, as a numpy array (n, 2, 256), int64.

    The gather is the same; the shift, the offsets and the count run in numpy on the
    gathered buffer (no copy): on small arrays a numpy call costs a fraction of a torch
    op's dispatch, and ``np.bincount`` needs no separate min and max reductions.
    """
    import numpy as np

    n = len(tensors)
    if not tensors:
        return np.zeros((0, 2, BINS), dtype=np.int64)
    plan = _plan_for(tensors, limit, cache)
    if plan.narrow:
        flat, _ = _gather(tensors, limit)  # the same geometry and order as ``plan``
        codes = flat.view(torch.int32).numpy()
        offsets = _plan_offsets(plan, flat.device).numpy()
    else:
        slices, rest_out, codes, offsets = plan.host()
        with below_autograd():  # only reads into our own buffer
            if plan.wide:  # _foreach_copy_ converts dtypes (as ``.float()``)
                foreach_copy_(slices, _wide_views(tensors, plan))
            if plan.whole:
                torch.cat([tensors[i] for i in plan.whole], out=rest_out)
    codes >>= 23  # arithmetic (int32)
    codes += offsets
    return np.bincount(codes, minlength=n * 2 * BINS).reshape(n, 2, BINS)


def shares(counts: Mapping[str, Any], overflow: bool = False) -> dict[str, float]:
    """The shares of a histogram's `fp16range.range_counts`, as the sections state them.

    Zero: of all values; flush, subnormal (and overflow): of the finite nonzero ones.
    """
    nz = counts["n"] - counts["zero"] - counts["nonfinite"]
    out = {
        "zero_fraction": counts["zero"] / counts["n"] if counts["n"] else 0.0,
        "flush_fraction": counts["flush"] / nz if nz > 0 else 0.0,
        "subnormal_fraction": counts["subnormal"] / nz if nz > 0 else 0.0,
    }
    if overflow:
        out["overflow_fraction"] = counts["overflow"] / nz if nz > 0 else 0.0
    return out
