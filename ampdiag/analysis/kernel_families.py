"""The kernel taxonomy: which GPU kernels communicate and which run on tensor cores, as data.

HTA's kernel types (``kernels.kernel_type``) know only NCCL as communication, and the tensor-core
patterns of ``kernels.precision`` knew only cuBLAS/cuDNN's pre-Hopper names. Modern training
moves data with other libraries (DeepEP and NVSHMEM for expert-parallel all-to-all, custom
all-reduce kernels over NVLink, Transformer Engine's userbuffers) and multiplies with kernels
whose names say so only by their library (``nvjet``, CUTLASS 3 ``device_kernel<...GemmKernel>``,
FlashAttention 3, DeepGEMM). Left unknown, a DeepEP dispatch counts as computation (so the
communication it hides is never seen) and an FP8 grouped GEMM as CUDA-core work.

Each family is one row: its name, what it is (``COMMUNICATION`` or ``COMPUTATION``), whether it
runs on tensor cores and is a matrix multiply, and a regular expression over the kernel's name
(lowercased). The first row that matches decides. Every family has a test with kernel names
taken from real traces or from the library's own source (tests/trace/test_kernel_families.py).
A new library is one new row here and its names there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class Family:
    """One kernel family: what its kernels do, recognized by their name."""

    name: str
    kind: str  # "COMMUNICATION" or "COMPUTATION"
    pattern: str
    tensor_core: bool = False
    matmul: bool = False
    exclude: str | None = None  # names matching this are not of the family


_COMM, _COMP = "COMMUNICATION", "COMPUTATION"


def _tensor_core(name: str, pattern: str, exclude: str | None = None) -> Family:
    """A family of tensor-core GEMM / convolution / attention kernels."""
    return Family(name, _COMP, pattern, tensor_core=True, matmul=True, exclude=exclude)


FAMILIES: tuple[Family, ...] = (
    # --- communication ---------------------------------------------------------------------
    Family("nccl", _COMM, r"^nccl.*kernel"),
    # DeepEP (open source: deep_ep::; DeepSeek's own build: dpsk::ep::) dispatch, combine,
    # notify_dispatch, cached_notify over NVLink (intranode) and RDMA (internode, internode_ll)
    Family("deepep", _COMM, r"(deep_ep|dpsk::ep)::(internode|intranode|internode_ll)::"),
    Family("nvshmem", _COMM, r"nvshmem"),
    Family("all-to-all", _COMM, r"all_?to_?all|alltoall|mscclpp|pplx::"),
    # custom all-reduce over NVLink / NVSwitch: vLLM and SGLang (cross_device_reduce_1stage),
    # TensorRT-LLM (oneShotAllReduceKernel, twoShot..., allreduce_fusion_kernel), PyTorch
    # symmetric memory (one_shot_all_reduce_kernel, multimem_all_reduce_kernel)
    Family(
        "custom-all-reduce",
        _COMM,
        r"cross_device_reduce|(one|two)_?shot_?(all_?reduce|all_?gather|reduce_?scatter)"
        r"|multimem_|allreduce_?fusion|custom_?all_?reduce|lamport",
    ),
    Family("te-userbuffers", _COMM, r"userbuffers"),
    # --- helpers of tensor-core libraries: CUDA-core work under a GEMM / attention name -----
    # FA2's flash_bwd_convert_dq_kernel / flash_bwd_dot_do_o_kernel / splitkv_combine, FA3's
    # FlashAttnBwdPreprocess / FlashAttnBwdPostprocessConvertdQ / prepare_varlen; a GEMM
    # library's transposes (dpsk::grouped_gemm::cuda::utils::transpose)
    Family(
        "attention-helper",
        _COMP,
        r"flash.*(combine|convert_?dq|dot_do_o|prepare|clear_dq|preprocess|postprocess)",
    ),
    Family("gemm-helper", _COMP, r"gemm\w*::(\w+::)*(utils::|transpose)"),
    # --- tensor-core computation -----------------------------------------------------------
    # FlashAttention 2 (flash_fwd_kernel, flash_bwd_*; PyTorch's pytorch_flash::), 3
    # (flash::compute_attn_ws, flash::FlashAttnFwdSm90), cuDNN SDPA, CUTLASS memory-efficient
    # attention in half precision
    _tensor_core(
        "flash-attention",
        r"flash_(fwd|bwd)|flash::|flashattn|flash_attn|fmha_cutlass[fb]_(f16|bf16)|_sdpa_",
    ),
    # FP8 GEMMs (a GEMM word, not fbgemm's FP8 quantize kernels): DeepGEMM
    # (deep_gemm::fp8_gemm_kernel, m_grouped_gemm), DeepSeek's grouped fp8 GEMMs,
    # cuBLASLt / CUTLASS e4m3 / e5m2 GEMMs
    _tensor_core(
        "fp8-gemm",
        r"deep_gemm::|fp8.*(?<![a-z])gemm|(?<![a-z])gemm.*(fp8|e4m3|e5m2)"
        r"|(e4m3|e5m2).*(?<![a-z])gemm",
    ),
    _tensor_core("grouped-gemm", r"grouped_?gemm|gemm_?grouped|m_grouped|k_grouped", r"simt"),
    # cuBLAS 12 on Hopper / Blackwell (nvjet_tst_128x256_64x4_1x2_h_bz_coopa_nnt)
    _tensor_core("nvjet", r"^nvjet"),
    # CUTLASS 3 kernels (cutlass::device_kernel<...GemmKernel...>, cutlass3x_sm90_tensorop_*)
    # and CUTLASS 2 tensor-op GEMMs / convolutions (cutlass_80_tensorop_s1688gemm)
    _tensor_core(
        "cutlass-tensorop", r"tensorop|cutlass::device_kernel<.*gemm|cutlass3x_sm\d+", r"simt"
    ),
    # warpgroup MMA (Hopper) and the MMA instruction names: hmma, imma, wmma, hgmma
    _tensor_core("wgmma", r"wgmma|warpgroup|gmma"),
    _tensor_core("xmma", r"xmma"),
    # cuBLAS / cuDNN names by architecture and instruction shape: sm80_/sm90_/sm100_ GEMMs,
    # volta_h884gemm, turing_fp16_s1688gemm, ampere_bf16_s16816gemm, i8816
    _tensor_core(
        "mma-shape", r"h884|h1688|h16816|s884|s1688|s16816|i8816|i16832|161616|hmma|imma|wmma|_mma"
    ),
    _tensor_core(
        "sm-gemm",
        r"(?<![a-z0-9])sm_?(70|75|80|86|87|89|90a?|100a?|103|110|120)_\w*(gemm|conv|fprop|dgrad"
        r"|wgrad)",
        r"simt|sgemm|dgemm",
    ),
)

_COMPILED = tuple(
    (f, re.compile(f.pattern), re.compile(f.exclude) if f.exclude else None) for f in FAMILIES
)


@lru_cache(maxsize=65536)
def family(name: str) -> Family | None:
    """The first family a kernel name belongs to, or None."""
    low = name.lower()
    for fam, pattern, exclude in _COMPILED:
        if pattern.search(low) and not (exclude is not None and exclude.search(low)):
            return fam
    return None
