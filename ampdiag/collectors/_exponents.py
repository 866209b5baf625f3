"""Exponent histograms on the device: a few fused kernels for any number of tensors.

Each value is viewed as float32 bits; ``bits >> 23`` (an arithmetic shift) is its sign and
exponent field in one int (-256..255), so one ``bincount`` over ``shift + offset`` counts every
tensor's values by exponent at once. No host sync: the result stays on the device.
See ``ampdiag.analysis.fp16range`` for what the bins mean.
"""

from __future__ import annotations

import math

import torch

BINS = 256


def sample_flat(t: torch.Tensor, limit: int) -> torch.Tensor:
    """The values of ``t`` as a 1-D float32 tensor: all of them, or an even spread of ``limit``.

    The stride is chosen coprime with the last dimension, so a strided sample of a matrix
    visits every column rather than the same few.
    """
    flat = t.detach().reshape(-1)
    n = flat.numel()
    if limit > 0 and n > limit:
        stride = math.ceil(n / limit)
        last = t.shape[-1] if t.dim() > 0 else 1
        while math.gcd(stride, last) != 1:
            stride += 1
        flat = flat[::stride][:limit]
    if flat.dtype != torch.float32:
        flat = flat.float()
    return flat


def raw_histograms(
    tensors: list[torch.Tensor], limit: int, cache: dict[tuple[object, ...], torch.Tensor]
) -> torch.Tensor:
    """Per-tensor exponent histograms, shape (len(tensors), 256), int64, on the device.

    Args:
        tensors: Floating tensors on one device.
        limit: Values examined per tensor (0: all).
        cache: Holds the offsets tensor between calls (same sizes -> reused).
    """
    flats = [sample_flat(t, limit) for t in tensors]
    sizes = tuple(f.numel() for f in flats)
    device = flats[0].device
    key = (sizes, str(device))
    offsets = cache.get(key)
    if offsets is None:
        base = torch.arange(len(flats), dtype=torch.int32) * (2 * BINS) + BINS
        counts = torch.tensor(sizes, dtype=torch.int64)
        offsets = torch.repeat_interleave(base, counts).to(device)
        cache.clear()
        cache[key] = offsets
    bits = torch.cat(flats).view(torch.int32)
    codes = torch.bitwise_right_shift(bits, 23).add_(offsets)
    counts2 = torch.bincount(codes, minlength=len(flats) * 2 * BINS)
    # Fold the sign: (tensor, sign, exponent) -> (tensor, exponent).
    return counts2.view(len(flats), 2, BINS).sum(dim=1)


def raw_histogram(t: torch.Tensor, limit: int) -> torch.Tensor:
    """One tensor's exponent histogram (256 bins, int64, on its device)."""
    bits = sample_flat(t, limit).view(torch.int32)
    codes = torch.bitwise_right_shift(bits, 23).add_(BINS)
    return torch.bincount(codes, minlength=2 * BINS).view(2, BINS).sum(dim=0)
