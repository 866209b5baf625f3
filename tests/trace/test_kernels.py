import pytest

from ampdiag.analysis.kernels import kernel_type, precision, short_name


@pytest.mark.parametrize(
    ("name", "prec", "tc", "mm"),
    [
        ("volta_sgemm_128x64_nn", "fp32", False, True),
        ("ampere_sgemm_32x32_sliced1x4_tn", "fp32", False, True),
        ("cudnn_ampere_scudnn_128x64_relu_xregs_large_nn_v1", "fp32", False, True),
        ("volta_h884gemm_64x64_ldg8_nn", "fp16", True, True),
        ("turing_fp16_s1688gemm_fp16_128x128_ldg8_f2f_nn", "fp16", True, True),
        ("ampere_fp16_s16816gemm_fp16_128x64_ldg8_f2f_stages_64x4_tn", "fp16", True, True),
        ("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x4_tn", "bf16", True, True),
        (
            "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4>(T1::Params)",
            "tf32",
            True,
            True,
        ),
        ("ampere_s16816gemm_128x64_ldg8_stages_32x5_tn", "tf32", True, True),
        (
            "sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw",
            "tf32",
            True,
            True,
        ),
        ("sm80_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_tilesize96x128x32", "bf16", True, True),
        ("sm90_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n_tilesize128x128x64", "fp8", True, True),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
            "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>)",
            "fp32",
            False,
            False,
        ),
        (
            "void at::native::vectorized_elementwise_kernel<4, "
            "at::native::CUDAFunctor_add<c10::Half>>",
            "fp16",
            False,
            False,
        ),
        (
            "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<c10::BFloat16, Sum>>",
            "bf16",
            False,
            False,
        ),
        ("triton_poi_fused_add_cos_sin_0", "unknown", False, False),
        (
            "void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 128, true, 1>",
            "fp32",
            False,
            False,
        ),
    ],
)
def test_precision_from_names(name, prec, tc, mm):
    assert precision(name) == (prec, tc, mm)


@pytest.mark.parametrize(
    ("name", "ktype"),
    [
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, ...)", "COMMUNICATION"),
        ("ncclDevKernel_SendRecv(ncclDevComm*)", "COMMUNICATION"),
        ("Memcpy HtoD (Pageable -> Device)", "MEMORY"),
        ("Memset (Device)", "MEMORY"),
        ("volta_sgemm_128x64_nn", "COMPUTATION"),
        ("Event Sync", "OTHER"),  # HTA: names matching .*Sync are not computation
        ("my_cudaMemcpy_kernel", "OTHER"),
    ],
)
def test_kernel_types_are_htas(name, ktype):
    get_kernel_type = pytest.importorskip("hta.utils.utils").get_kernel_type  # the oracle

    assert kernel_type(name) == ktype == get_kernel_type(name)


def test_short_name():
    assert short_name("void foo<int>(int, float)") == "foo<int>"
    assert short_name("Memcpy HtoD (Pageable -> Device)") == "Memcpy HtoD (Pageable -> Device)"
    assert len(short_name("k" * 500)) == 90
