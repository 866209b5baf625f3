"""torch's FP8 dtypes and its private scaled matmul (``torch._scaled_mm``), version-guarded.

FP8 training (torchao's float8, Transformer Engine) multiplies FP8 operands with
``torch._scaled_mm``: the operands' dequantization scales go in, the product comes out in a
high precision, accumulated in FP32. Running the same op is what makes the FP8 A/B's numerics
those a GPU computes; the op is private, so it is reached only here. Where a torch lacks it
(or the device's build refuses an operand layout) the product is the dequantized operands'
FP32 matmul: the same rounding of the operands, another order of accumulation.
"""

from __future__ import annotations

from typing import Any

import torch

E4M3: torch.dtype | None = getattr(torch, "float8_e4m3fn", None)
E5M2: torch.dtype | None = getattr(torch, "float8_e5m2", None)
_SCALED_MM: Any = getattr(torch, "_scaled_mm", None)

#: The CUDA compute capability from which GPUs have FP8 tensor cores (Ada 8.9, Hopper 9.0).
FP8_CAPABILITY = (8, 9)


def available() -> bool:
    """Whether this torch has both FP8 dtypes (the numerics can be measured)."""
    return E4M3 is not None and E5M2 is not None


def device_has_fp8(device: torch.device) -> bool:
    """Whether ``device`` computes FP8 matmuls natively (a CUDA GPU of capability >= 8.9)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    return tuple(torch.cuda.get_device_capability(device)) >= FP8_CAPABILITY


def scaled_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    out_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``a @ b`` of FP8 operands times their dequantization scales (``_scaled_mm``'s contract).

    ``scale_a`` is a scalar or one per row of ``a`` (shape ``(m, 1)``), ``scale_b`` a scalar or
    one per column of ``b`` (``(1, n)``).
    """
    if _SCALED_MM is not None:
        # the kernel's layouts: ``a`` row-major, ``b`` column-major (the values are unchanged)
        a, b = a.contiguous(), b.t().contiguous().t()
        try:
            out: torch.Tensor = _SCALED_MM(
                a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype
            )
            return out
        except (RuntimeError, TypeError, ValueError):
            pass  # an operand layout or shape this build's kernel refuses
    return ((a.float() * scale_a) @ (b.float() * scale_b)).to(out_dtype)
