"""The kernel taxonomy against real kernel names, and the DeepSeek-V3 trace against a direct count.

The names come from real traces (../shared/traces and the public DeepSeek-V3 profile of
github.com/deepseek-ai/profile-data, trimmed under tests/data/traces/deepseek_v3) and from the
libraries' own kernel names (DeepEP, vLLM, TensorRT-LLM, PyTorch symmetric memory, Transformer
Engine, FlashAttention, DeepGEMM, cuBLAS, CUTLASS).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from ampdiag.analysis.kernel_families import FAMILIES, family
from ampdiag.analysis.kernels import kernel_type, precision
from tests.trace.conftest import FIXTURES

DEEPSEEK = FIXTURES / "deepseek_v3" / "train_rank0_window40ms.json.gz"

NAMES: dict[str, list[str]] = {
    "nccl": [
        "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, ncclDevFuncs*, unsigned long)",
        "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    ],
    "deepep": [
        "void dpsk::ep::internode::dispatch<false, 8, true, 8>(int4*, float*, long*, float*)",
        "void dpsk::ep::internode::combine<false, 8, __nv_bfloat16, 8, 2, 16, 24>(int4*)",
        "void dpsk::ep::internode::notify_dispatch<false, 8>(int const*, long*, int)",
        "void dpsk::ep::internode::cached_notify<false>(int, int, int, int, int*, int)",
        "void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*, long*)",
        "void deep_ep::intranode::cached_notify_combine<8>(void**, int*, int, int, int)",
        "void deep_ep::internode_ll::combine<false, 7168>(void*, void*, int*, void*)",
    ],
    "nvshmem": [
        "void nvshmemi_barrier_allonstream_kernel(int)",
        "nvshmemi_proxy_quiet_entrypoint",
    ],
    "all-to-all": [
        "void pplx::a2a_dispatch_kernel<__nv_bfloat16, 8>(int, int, int, unsigned long)",
        "void mscclpp::allreduce_allpairs<__nv_bfloat16>(__nv_bfloat16*, int)",
        "void fused_all_to_all_kernel<float>(float const*, float*, int)",
    ],
    "custom-all-reduce": [
        "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, "
        "vllm::RankSignals, vllm::Signal*, __nv_bfloat16*, int, int)",
        "void vllm::cross_device_reduce_2stage<c10::Half, 4>(vllm::RankData*)",
        "void tensorrt_llm::kernels::oneShotAllReduceKernel<__nv_bfloat16, 8>(AllReduceParams)",
        "void tensorrt_llm::kernels::twoShotAllReduceKernel<float, 4>(AllReduceParams)",
        "void c10d::symmetric_memory::one_shot_all_reduce_kernel<c10::BFloat16, 8>(long)",
        "void c10d::symmetric_memory::two_shot_all_reduce_kernel<c10::BFloat16, 16, 8>(long)",
        "void c10d::symmetric_memory::multimem_all_reduce_kernel<c10::BFloat16, 16>(unsigned)",
    ],
    "te-userbuffers": [
        "void userbuffers_fp16_sum_inplace_gpu_rr_rs(int, int, int, int, int, int, void**)",
        "void kuserbuffers_pushsendrecv(int*, int*, int4*, int4*, int, int, int*)",
    ],
    "flash-attention": [
        # FlashAttention 3 in the DeepSeek-V3 trace
        "void flash::compute_attn_ws<Flash_fwd_kernel_traits<192, 128, 128, 12, 2, false, 1, "
        "cutlass::bfloat16_t, 128>, true, flash::SingleTileScheduler>(flash::Params)",
        "void cutlass::device_kernel<flash::FlashAttnBwd<flash::CollectiveMainloopBwd<2>>>"
        "(flash::FlashAttnBwd::Params)",
        # FlashAttention 2, and PyTorch's copy of it
        "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
        "cutlass::bfloat16_t>, false, true, false, false, true, true>(Flash_fwd_params)",
        "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits"
        "<64, 128, 128, 8, 4, 2, 2>, true, false>(pytorch_flash::Flash_bwd_params)",
        "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel)",
    ],
    "fp8-gemm": [
        # the DeepSeek-V3 trace's FP8 (grouped) GEMMs
        "void cutlass::device_kernel<dpsk::grouped_gemm::cuda::fp8_ptp128c::GemmKernel>"
        "(dpsk::grouped_gemm::cuda::fp8_ptp128c::GemmKernel::Params)",
        "void cutlass::device_kernel<dpsk::grouped_gemm::cuda::m_grouped_fp8_ptp128c::GemmKernel>"
        "(dpsk::grouped_gemm::cuda::m_grouped_fp8_ptp128c::GemmKernel::Params)",
        # DeepGEMM
        "void deep_gemm::fp8_gemm_kernel<128u, 128u, 128u, 1u, 8u, 128u, 5u, "
        "deep_gemm::GemmType::GroupedContiguous>(__nv_bfloat16*, float*, int*, unsigned)",
        "sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x128x128_warpgroupsize1x1x1",
    ],
    "grouped-gemm": [
        "void cutlass::Kernel<cutlass::gemm::kernel::GemmGrouped<cutlass::gemm::threadblock::"
        "MmaMultistage<cutlass::gemm::GemmShape<128, 128, 32>>>>(Params)",
        "void megablocks::grouped_gemm_kernel<__nv_bfloat16>(GroupedGemmParams)",
    ],
    "nvjet": ["nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", "nvjet_hsh_256x128_64x4_2x1_v_bz_TNT"],
    "cutlass-tensorop": [
        "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4>(T1::Params)",
        "void cutlass_cudnn_train::Kernel<cutlass_tensorop_s1688wgrad_optimized_tf32_256x128_"
        "16x3_nhwc_align4>(cutlass_tensorop_s1688wgrad_optimized_tf32_256x128_16x3_nhwc_align4::"
        "Params)",
        "void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cute::tuple<int, int, "
        "int, int>, cutlass::gemm::collective::CollectiveMma<cutlass::gemm::"
        "MainloopSm90TmaGmmaWarpSpecialized<4, cute::tuple<cute::C<2>>>>>>(Params)",
        "cutlass3x_sm100_tensorop_s256x128x16gemm_bf16_bf16_f32_bf16_bf16_256x128x64_2x1x1_0_tnn",
    ],
    "wgmma": [
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_"
        "segment_k_off_kernel__5x_cublas",
    ],
    "xmma": [
        "sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x"
        "16_stage4_warpsize2x2x1_g1_tensor16x8x8_execute_kernel_cudnn",
    ],
    "mma-shape": [
        "volta_h884gemm_64x64_ldg8_nn",
        "volta_fp16_s884gemm_fp16_128x128_ldg8_f2f_nn",
        "turing_fp16_s1688gemm_fp16_128x128_ldg8_f2f_nn",
        "ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x4_tn",
        "ampere_s16816gemm_128x64_ldg8_stages_32x5_tn",
        "void cudnn::detail::implicit_convolve_hmma<__half, 128, 6, 7, 3, 3, 5, 1>(Params)",
    ],
    "sm-gemm": [
        "sm100_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize256x128x64_cluster2x1x1_cublas",
        "sm86_gemm_f16f16_f16f32_f32_nn_n_tilesize64x64x32_stage5",
    ],
    # CUDA-core work under a GEMM or attention library's name
    "attention-helper": [
        "void cutlass::device_kernel<flash::FlashAttnBwdPreprocess<cute::tuple<cute::C<64>>>>()",
        "void cutlass::device_kernel<flash::FlashAttnBwdPostprocessConvertdQ<cute::tuple<cute::C"
        "<64>, cute::C<192>>, cutlass::bfloat16_t, 3, cutlass::gemm::GemmShape<1>>>(Params)",
        "void flash_bwd_convert_dq_kernel<Flash_bwd_kernel_traits<64, 128, 128, 8>, true>(Params)",
        "void flash_fwd_splitkv_combine_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4>>(Params)",
    ],
    "gemm-helper": [
        "void dpsk::grouped_gemm::cuda::utils::transpose<512, 128, 4, 4>(unsigned char const*)",
        "dpsk::grouped_gemm::cuda::utils::fill_tensormaps_kernel(CUtensorMap_st, void*, int)",
    ],
}

COMMUNICATING = {f.name for f in FAMILIES if f.kind == "COMMUNICATION"}
TENSOR_CORE = {f.name for f in FAMILIES if f.tensor_core}


def test_every_family_has_names() -> None:
    assert set(NAMES) == {f.name for f in FAMILIES}


@pytest.mark.parametrize(("fam", "name"), [(fam, n) for fam, names in NAMES.items() for n in names])
def test_family_of_real_names(fam: str, name: str) -> None:
    got = family(name)
    assert got is not None and got.name == fam
    if fam in COMMUNICATING:
        assert kernel_type(name) == "COMMUNICATION"
    else:
        assert kernel_type(name) == "COMPUTATION"
        assert precision(name)[1] is (fam in TENSOR_CORE)
        assert precision(name)[2] is (fam in TENSOR_CORE)


@pytest.mark.parametrize(
    "name",
    [
        # fbgemm's FP8 quantize kernels (in ../shared/traces): "fp8" and "fbgemm", no GEMM
        "void fbgemm_gpu::(anonymous namespace)::_compute_FP8_quantize_cuda_kernel<float>(float "
        "const*, float const*, int, int, unsigned char*, bool)",
        "void cuda::per_token_cast_to_fp8_with_channels<__nv_bfloat16, 128, false, 128, false>()",
        "void cutlass::Kernel<cutlass_80_simt_sgemm_128x32_8x5_nn_align1>(T1::Params)",
        "ampere_sgemm_128x64_nn",
        "void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add<c10::BFloat16>>",
    ],
)
def test_no_tensor_cores_where_the_name_says_none(name: str) -> None:
    assert kernel_type(name) == "COMPUTATION"
    assert precision(name)[1] is False


# --- the DeepSeek-V3 trace: a direct count over the raw events ------------------------------


def _events() -> list[dict[str, Any]]:
    doc = json.loads(gzip.decompress(DEEPSEEK.read_bytes()))
    events: list[dict[str, Any]] = doc["traceEvents"]
    return events


def _union(iv: list[tuple[float, float]]) -> list[list[float]]:
    out: list[list[float]] = []
    for s, e in sorted(iv):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def _length(iv: list[list[float]]) -> float:
    return sum(e - s for s, e in iv)


def _overlap(a: list[list[float]], b: list[list[float]]) -> float:
    total, j = 0.0, 0
    for s, e in a:
        while j < len(b) and b[j][1] <= s:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            total += max(0.0, min(e, b[k][1]) - max(s, b[k][0]))
            k += 1
    return total


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from ampdiag.analysis import analyze
    from ampdiag.sources.traces import session_from_traces

    session = session_from_traces(DEEPSEEK)
    analyze(session)
    return {"session": session, "rank": session.section("timeline")["ranks"][0]}


def test_deepseek_communication_is_a_direct_count(deepseek: dict[str, Any]) -> None:
    kernels = [e for e in _events() if e.get("cat") == "kernel"]
    is_comm = [str(e["name"]).startswith(("void dpsk::ep::", "nccl")) for e in kernels]
    comm = _union(
        [(e["ts"], e["ts"] + e["dur"]) for e, c in zip(kernels, is_comm, strict=True) if c]
    )
    other = _union(
        [(e["ts"], e["ts"] + e["dur"]) for e, c in zip(kernels, is_comm, strict=True) if not c]
    )
    truth_comm, truth_overlap = _length(comm), _overlap(comm, other)
    assert sum(is_comm) >= 12 and truth_comm > 10_000  # DeepEP dispatch, combine, notify
    got = deepseek["rank"]["communication"]
    assert got["comm_us"] == pytest.approx(truth_comm, rel=0.02)
    # overlapped with computation on the other streams: measured as such
    assert got["overlapped_us"] == pytest.approx(truth_overlap, rel=0.02)
    assert truth_overlap > 0.5 * truth_comm


def test_deepseek_fp8_gemms_and_flash_attention_are_tensor_core_work(
    deepseek: dict[str, Any],
) -> None:
    kernels = [e for e in _events() if e.get("cat") == "kernel"]

    def counted(name: str) -> bool:
        fp8_gemm = "GemmKernel" in name and "fp8" in name
        attention = "flash::" in name and "process" not in name
        return fp8_gemm or attention

    main = [e for e in kernels if counted(str(e["name"]))]
    assert len(main) > 40
    assert all(precision(str(e["name"]))[1] for e in main)
    truth_us = sum(float(e["dur"]) for e in main)
    p = deepseek["rank"]["precision"]
    assert p["tensor_core_us"] >= truth_us
    assert p["by_precision_us"]["fp8"] >= sum(
        float(e["dur"]) for e in main if "fp8" in str(e["name"])
    )


def test_deepseek_nothing_of_it_is_in_the_hta_manifest() -> None:
    # HTA calls DeepEP computation: the HTA-parity tests read MANIFEST.tsv, which lists only
    # the shared (NCCL) traces, so they stay as they were.
    assert "deepseek" not in (FIXTURES / "MANIFEST.tsv").read_text()
    assert Path(DEEPSEEK).is_file()


def test_nccl_traces_keep_htas_kernel_types() -> None:
    """Every kernel name of the committed NCCL (and other shared) traces: HTA's type, unchanged."""
    get_kernel_type = pytest.importorskip("hta.utils.utils").get_kernel_type  # the oracle
    names: set[str] = set()
    for path in FIXTURES.glob("*/**/*.json.gz"):
        if "deepseek" in str(path):
            continue
        doc = json.loads(gzip.decompress(path.read_bytes()))
        events = doc.get("traceEvents", []) if isinstance(doc, dict) else []
        names |= {
            str(e["name"])
            for e in events
            if isinstance(e, dict) and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
        }
    assert len(names) > 250 and any(n.startswith("nccl") for n in names)
    assert [n for n in names if kernel_type(n) != get_kernel_type(n)] == []
