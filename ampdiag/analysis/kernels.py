"""What GPU kernel names say: HTA's kernel types, and the precision the kernel computed in.

Kernel types follow HTA 0.5 (``hta.utils.utils.get_kernel_type``, the regexes below), so the
timeline's compute / non-compute split is HTA's, with one deliberate difference: the
communication families of the kernel taxonomy (`ampdiag.analysis.kernel_families`: DeepEP,
NVSHMEM, other all-to-all, custom all-reduce, Transformer Engine userbuffers) are
COMMUNICATION too, where HTA calls them computation. On NCCL-only traces the two agree exactly.

Precision is read from the names the libraries give their kernels (cuBLAS/cuDNN, CUTLASS and
XMMA, the template arguments of ATen kernels: `_PRECISION_RULES`). A name that says nothing
is "unknown"; nothing is guessed.
"""

from __future__ import annotations

import re
from functools import lru_cache

from ampdiag.analysis.kernel_families import family

COMPUTATION, COMMUNICATION, MEMORY, OTHER = "COMPUTATION", "COMMUNICATION", "MEMORY", "OTHER"
KERNEL_TYPES = (COMPUTATION, COMMUNICATION, MEMORY)

_NCCL = re.compile(r"^nccl.*Kernel")
_MEMORY = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_NOT_COMPUTE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")

PRECISIONS = ("fp8", "int8", "bf16", "fp16", "tf32", "fp32", "fp64", "unknown")
_PRECISION_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("fp8", re.compile(r"e4m3|e5m2|fp8|float8")),
    ("bf16", re.compile(r"bf16|bfloat16")),
    ("fp16", re.compile(r"fp16|f16f16|_f16|h884|h1688|h16816|hgemm|hcudnn|c10::half|__half")),
    ("tf32", re.compile(r"tf32|(?<![a-z0-9])s1688gemm|_s1688gemm|_s16816gemm|tensorop_s")),
    ("int8", re.compile(r"int8|i8816|imma|s8s8")),
    ("fp64", re.compile(r"dgemm|double|fp64|f64")),
    ("fp32", re.compile(r"sgemm|cgemm|scudnn|sgemv|float|f32|fp32")),
)
_MATMUL = re.compile(r"gemm|gemv|conv|scudnn|hcudnn|winograd|fprop|dgrad|wgrad|xmma|fft")


@lru_cache(maxsize=65536)
def kernel_type(name: str) -> str:
    """HTA's kernel type of a GPU activity name (COMPUTATION, COMMUNICATION, MEMORY, OTHER)."""
    if _NCCL.match(name):
        return COMMUNICATION
    fam = family(name)
    if fam is not None and fam.kind == COMMUNICATION:
        return COMMUNICATION
    if _MEMORY.match(name):
        return MEMORY
    if not _NOT_COMPUTE.match(name):
        return COMPUTATION
    return OTHER


@lru_cache(maxsize=65536)
def precision(name: str) -> tuple[str, bool, bool]:
    """(precision in PRECISIONS, runs on tensor cores, is a GEMM/convolution) as a name says.

    Tensor cores only where the name belongs to a tensor-core family of the kernel taxonomy.
    """
    low = name.lower()
    prec = "unknown"
    for label, pattern in _PRECISION_RULES:
        if pattern.search(low):
            prec = label
            break
    fam = family(name)
    tensor_core = fam is not None and fam.kind == COMPUTATION and fam.tensor_core
    # a family's word is final: a GEMM library's transpose is no GEMM
    matmul = fam.matmul if fam is not None else bool(_MATMUL.search(low))
    return prec, tensor_core, matmul


def short_name(name: str, width: int = 90) -> str:
    """A kernel name without its argument list, cut to width characters."""
    cut = name.split("(", 1)[0] if not name.startswith(("Memcpy", "Memset")) else name
    cut = cut.removeprefix("void ")
    return cut if len(cut) <= width else cut[: width - 1] + "…"
