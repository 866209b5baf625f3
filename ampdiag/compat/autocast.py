"""Private torch APIs the precision audit needs.

The autocast state at an op's entry, autocast kernels in the dispatcher, the CUDA autocast
policy torch ships, "is backward running", and autocast held off inside a forward that
enters it itself.

Checked on torch 2.4-2.13. Every function has a fallback when the private API is missing:

- `entry_autocast_state` reads the TLS stashed when the op entered the dispatcher
  (``torch._C._RestorePythonTLSSnapshot``): inside a TorchDispatchMode handler autocast is always
  excluded, so ``torch.is_autocast_enabled()`` there says nothing about the caller. Fallback:
  ``None`` (unknown), and the caller uses the state seen at the model's forward.
- `has_autocast_kernel` asks the dispatcher (``torch._C._dispatch_has_kernel_for_dispatch_key``)
  whether an op has a kernel for ``Autocast<DEVICE>``. Fallback: ``None``.
- `cuda_policy` derives CUDA autocast's per-op cast policy from what the wheel ships: the
  ``AT_FORALL_*`` op lists of ``include/ATen/autocast_mode.h`` (the lists torch registers for
  AutocastCUDA), each entry cross-checked against the dispatcher's AutocastCUDA registrations;
  ops the dispatcher has an AutocastCUDA kernel for but the header does not list get the policy
  ``"registered"``. Nothing is typed in by hand.
- `AutocastHeldOff` is a ``torch.overrides.TorchFunctionMode`` (not in the module's
  ``__all__``; checked on torch 2.4-2.13) that runs every torch call with autocast off.
- `in_backward` reads ``torch._C._current_graph_task_id()`` (-1 outside the autograd engine).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

#: The macro lists of ATen/autocast_mode.h and the cast policy each stands for.
HEADER_LISTS: dict[str, str] = {
    "AT_FORALL_LOWER_PRECISION_FP": "lower_precision_fp",
    "AT_FORALL_FP32": "fp32",
    "AT_FORALL_FP32_SET_OPT_DTYPE": "fp32_set_opt_dtype",
    "AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE": "fp32_append_dtype",
    "AT_FORALL_PROMOTE": "promote",
}

#: Policies under which autocast runs an op in FP32 whatever its input dtype.
FP32_POLICIES = frozenset({"fp32", "fp32_set_opt_dtype", "fp32_append_dtype"})

_DISPATCH_KEYS = {"cpu": "AutocastCPU", "cuda": "AutocastCUDA"}


def autocast_dispatch_key(device_type: str) -> str:
    """The dispatcher key autocast registers under for a device type, e.g. ``AutocastCPU``."""
    return _DISPATCH_KEYS.get(device_type, "Autocast" + device_type.upper())


def snapshot_available() -> bool:
    """Whether the stashed dispatcher-entry TLS can be read (``_RestorePythonTLSSnapshot``)."""
    return hasattr(torch._C, "_RestorePythonTLSSnapshot")


def entry_autocast_state(devices: Iterable[str]) -> dict[str, bool] | None:
    """Autocast enabled per device as it was when the current op entered the dispatcher.

    Only meaningful inside a ``__torch_dispatch__`` handler. Returns None when the private guard
    is missing (the caller must fall back to another source).
    """
    guard = getattr(torch._C, "_RestorePythonTLSSnapshot", None)
    if guard is None:
        return None
    with guard():
        return {d: torch.is_autocast_enabled(d) for d in devices}


@lru_cache(maxsize=4096)
def has_autocast_kernel(qualified_name: str, device_type: str) -> bool | None:
    """Whether ``Autocast<device>`` has a kernel for an op.

    The op is named ``"aten::layer_norm"``, with an overload ``"aten::softmax.int"``. None when
    the dispatcher cannot be asked.
    """
    probe = getattr(torch._C, "_dispatch_has_kernel_for_dispatch_key", None)
    if probe is None:
        return None
    try:
        return bool(probe(qualified_name, autocast_dispatch_key(device_type)))
    except Exception:
        return None


def op_has_autocast_kernel(op: Any, device_type: str) -> bool | None:
    """`has_autocast_kernel` for an OpOverload: its overload, or the bare name for default."""
    name = op._schema.name  # e.g. "aten::softmax"
    overload = op._overloadname
    full = name if overload in ("default", "") else f"{name}.{overload}"
    return has_autocast_kernel(full, device_type)


_GRAPH_TASK_ID = getattr(torch._C, "_current_graph_task_id", None)


def in_backward() -> bool:
    """Whether the autograd engine is running a backward pass on this thread."""
    if _GRAPH_TASK_ID is None:
        return False
    try:
        return int(_GRAPH_TASK_ID()) >= 0
    except Exception:
        return False


def autocast_header() -> Path | None:
    """The ATen autocast header shipped in the wheel's include dir, if there."""
    path = Path(torch.__file__).parent / "include" / "ATen" / "autocast_mode.h"
    return path if path.is_file() else None


def parse_autocast_header(text: str) -> dict[str, str]:
    """Op name (with overload, ``"softmax.int"``) -> policy, from the ``AT_FORALL_*`` macros."""
    policy: dict[str, str] = {}
    for macro, name in HEADER_LISTS.items():
        match = re.search(r"#define\s+" + macro + r"\(_\)(.*?)(?:\n\s*\n|\n#|\Z)", text, re.S)
        if not match:
            continue
        body = match.group(1).replace("\\\n", " ")
        if name == "fp32_append_dtype":
            entries = re.findall(r"_\(\s*ADD_NS\((\w+)\)\s*,\s*\"([\w.]+)\"", body)
            for _, full in entries:
                policy.setdefault(full, name)
            continue
        for op, overload in re.findall(r"_\(\s*(\w+)\s*(?:,\s*(\w+)\s*)?\)", body):
            if overload in ("", "deprecated", "input"):
                policy.setdefault(op, name)
            else:
                policy.setdefault(f"{op}.{overload}", name)
    return policy


def _registered_any_overload(op: str, device_type: str) -> bool | None:
    """`has_autocast_kernel` for ``name.overload``, or for any overload of a bare name."""
    if "." in op:
        return has_autocast_kernel(f"aten::{op}", device_type)
    packet = getattr(torch.ops.aten, op, None)
    if packet is None:
        return None
    answers = [
        has_autocast_kernel(f"aten::{op}" if ov == "default" else f"aten::{op}.{ov}", device_type)
        for ov in packet.overloads()
    ]
    if any(answers):
        return True
    return None if all(a is None for a in answers) else False


@lru_cache(maxsize=1)
def cuda_policy() -> tuple[dict[str, str], str]:
    """CUDA autocast's policy per op, and where it came from.

    Returns:
        (policy, source): policy maps ``"layer_norm"`` or ``"softmax.int"`` to one of
        ``lower_precision_fp``, ``fp32``, ``fp32_set_opt_dtype``, ``fp32_append_dtype``,
        ``promote``; source is ``"header+dispatcher"``, ``"header"`` or ``"unavailable"``.
        Header entries the dispatcher says have no AutocastCUDA kernel are dropped.
    """
    header = autocast_header()
    if header is None:
        return {}, "unavailable"
    try:
        parsed = parse_autocast_header(header.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return {}, "unavailable"
    checked: dict[str, str] = {}
    verified = False
    for op, pol in parsed.items():
        known = _registered_any_overload(op, "cuda")
        if known is None:
            checked[op] = pol
            continue
        verified = True
        if known:
            checked[op] = pol
    return checked, ("header+dispatcher" if verified else "header")


@lru_cache(maxsize=4096)
def cuda_policy_for(op_name: str, overload: str = "default") -> str | None:
    """CUDA autocast's policy for an op as the dispatch mode sees it (after decomposition).

    Looks up ``name.overload``, then ``name``, then the name with a leading ``_`` or
    ``native_`` or a trailing ``_forward`` removed (``_softmax`` -> ``softmax``,
    ``native_layer_norm`` -> ``native_layer_norm``/``layer_norm``, ``nll_loss_forward`` ->
    ``nll_loss``), since autocast registers on the composite op the user called. Returns
    ``"registered"`` for an AutocastCUDA kernel the header does not list, None for none.
    """
    policy, _ = cuda_policy()
    candidates = [f"{op_name}.{overload}", *policy_candidates(op_name)]
    for c in candidates:
        if c in policy:
            return policy[c]
    for c in candidates:  # the composite was registered under an overload: softmax.int
        for key, pol in policy.items():
            if key.split(".", 1)[0] == c:
                return pol
    for c in candidates:
        if has_autocast_kernel(f"aten::{c}", "cuda"):
            return "registered"
    return None


def policy_candidates(op_name: str) -> list[str]:
    """Names autocast may have registered the composite op under, for a decomposed op name.

    ``_softmax`` -> ``softmax``; ``native_layer_norm`` -> ``layer_norm``;
    ``nll_loss_forward`` -> ``nll_loss``; ``_scaled_dot_product_flash_attention_for_cpu`` ->
    ``_scaled_dot_product_flash_attention``.
    """
    out = [op_name]
    base = op_name
    for prefix in ("_", "native_"):
        if base.startswith(prefix):
            base = base[len(prefix) :]
            out.append(base)
    for name in (op_name, base):
        for suffix in ("_forward", "_for_cpu"):
            if name.endswith(suffix):
                out.append(name[: -len(suffix)])
    return out


@lru_cache(maxsize=4096)
def autocast_registered(op_name: str, overload: str, device_type: str) -> bool | None:
    """Whether ``Autocast<device>`` has a kernel for the op or the composite it decomposes from.

    ``op_name`` is the bare ATen name (``"_softmax"``); overloads of the candidates are tried
    from the op's registered overload names. None when the dispatcher cannot be asked.
    """
    answers: list[bool | None] = []
    first = op_name if overload in ("default", "") else f"{op_name}.{overload}"
    answers.append(has_autocast_kernel(f"aten::{first}", device_type))
    for cand in policy_candidates(op_name):
        packet = getattr(torch.ops.aten, cand, None)
        overloads = packet.overloads() if packet is not None else []
        for ov in overloads:
            full = cand if ov == "default" else f"{cand}.{ov}"
            answers.append(has_autocast_kernel(f"aten::{full}", device_type))
    if any(a for a in answers):
        return True
    if all(a is None for a in answers):
        return None
    return False


def dispatch_mode_class() -> Any:
    """Torch's TorchDispatchMode base class (``torch.utils._python_dispatch``)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


#: Autocast devices held off (the ones ampdiag's discovery reads).
_HELD_OFF_DEVICES = ("cpu", "cuda")
_LOW_DTYPES = (torch.float16, torch.bfloat16)


class AutocastHeldOff(torch.overrides.TorchFunctionMode):
    """Every torch call inside runs with autocast off, even where the code enters autocast.

    Why: ampdiag's FP32 replay runs the model's own forward, and a forward that enters
    autocast itself (Accelerate's ``prepare`` wraps ``model.forward`` in it; a user's forward
    may say ``with torch.autocast(...)``) would compute in FP16 under any autocast(enabled=False)
    around it. ``torch.autocast.__enter__`` sets the thread's state directly, so it cannot be
    refused; instead each call (torch functions, Tensor methods, ``torch.ops``: everything that
    honors ``__torch_function__``) finds autocast off for its duration, and the state the code
    set is put back after it, exception or not. Thread-local, like the mode stack: nothing
    another thread or the code after the block sees changes.

    ``low`` names the first call that still returned a float16/bfloat16 tensor (an explicit
    cast, low-precision parameters, a kernel outside torch): then the computation is not FP32.
    ``entered``: some call found autocast on (the code entered it).
    """

    def __init__(self) -> None:
        super().__init__()
        self.low: str | None = None
        self.entered = False

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: Any = (),
        kwargs: Any = None,
    ) -> Any:
        on = [d for d in _HELD_OFF_DEVICES if torch.is_autocast_enabled(d)]
        self.entered = self.entered or bool(on)
        for d in on:
            torch.set_autocast_enabled(d, False)
        try:
            out = func(*args, **(kwargs or {}))
        finally:
            for d in on:
                torch.set_autocast_enabled(d, True)
        if self.low is None and isinstance(out, torch.Tensor) and out.dtype in _LOW_DTYPES:
            self.low = f"{getattr(func, '__name__', func)!s} returned {out.dtype}"
        return out
