"""The CUDA autocast policy comes from torch's own header and dispatcher, not a typed list."""

from __future__ import annotations

import torch

from ampdiag.compat import autocast as ac

SNIPPET = """
#define AT_FORALL_FP32(_) \\
  _(acos)                 \\
  _(pow, Tensor_Scalar)

#define AT_FORALL_LOWER_PRECISION_FP(_) \\
  _(conv_transpose2d, input)            \\
  _(mm)

#define AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(_)  \\
  _(ADD_NS(norm),                                    \\
    "norm.Scalar",                                   \\
    Tensor(const Tensor&, const Scalar&),            \\
    fp32_append_dtype)
"""


def test_parse_header_snippet() -> None:
    assert ac.parse_autocast_header(SNIPPET) == {
        "acos": "fp32",
        "pow.Tensor_Scalar": "fp32",
        "conv_transpose2d": "lower_precision_fp",
        "mm": "lower_precision_fp",
        "norm.Scalar": "fp32_append_dtype",
    }


def test_cuda_policy_from_shipped_header_agrees_with_dispatcher() -> None:
    policy, source = ac.cuda_policy()
    assert source == "header+dispatcher"
    assert policy["layer_norm"] == "fp32" and policy["mm"] == "lower_precision_fp"
    assert policy["softmax.int"] == "fp32_set_opt_dtype"
    for op in policy:
        assert ac._registered_any_overload(op, "cuda"), op
    # The ops CPU and CUDA treat differently: CPU autocast has no rule for these.
    assert not ac.has_autocast_kernel("aten::layer_norm", "cpu")
    assert not ac.has_autocast_kernel("aten::softmax.int", "cpu")


def test_decomposed_names_map_to_the_composite_policy() -> None:
    assert ac.cuda_policy_for("_softmax") == "fp32_set_opt_dtype"
    assert ac.cuda_policy_for("native_layer_norm") == "fp32"
    assert ac.cuda_policy_for("nll_loss_forward") == "fp32"
    assert ac.cuda_policy_for("addmm") == "lower_precision_fp"
    assert ac.cuda_policy_for("native_batch_norm") is None


def test_entry_state_and_backward_flags() -> None:
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: list[tuple[bool | None, bool]] = []

    class Probe(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            state = ac.entry_autocast_state(("cpu",))
            seen.append(((state or {}).get("cpu"), ac.in_backward()))
            return func(*args, **(kwargs or {}))

    x = torch.randn(3, 3, requires_grad=True)
    with Probe():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = (x @ x).float().sum()
        y.backward()
    assert (True, False) in seen and (False, True) in seen
    assert all(not in_bw for on, in_bw in seen if on)
