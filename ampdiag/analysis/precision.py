"""Pure summaries of the precision audit section (no torch).

Shares, top FP32 ops, casts, per-module work and the ops that would run differently under CUDA
autocast.

Only the forward and backward of the audited step count (``phase`` forward/backward); ops after
the backward (GradScaler unscale, gradient clipping) are left out. Casts are overhead, counted
apart from the low-precision and FP32 work.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ampdiag.analysis.derive import part
from ampdiag.schema import PrecisionSection, PrecisionSummary
from ampdiag.session import Session

#: CUDA autocast policies that run an op in FP32 whatever its input dtype.
FP32_POLICIES = frozenset({"fp32", "fp32_set_opt_dtype", "fp32_append_dtype"})

#: The fix for each reason an op ran in FP32.
REASON_FIXES: dict[str, str] = {
    "autocast-fp32-policy": (
        "Expected: autocast keeps this op in FP32 for accuracy. Fuse it or use a fused "
        "kernel (e.g. F.scaled_dot_product_attention instead of a hand-written softmax "
        "attention); do not force it to low precision."
    ),
    "promotion": (
        "An FP32 input promotes the op to FP32. Keep the tensors it mixes in the same dtype, "
        "e.g. add an FP32 parameter after casting it: x + self.pos.to(x.dtype)."
    ),
    "user-cast": (
        "The code casts to FP32 by hand (.float()). Keep the cast only where accuracy needs "
        "it (the loss), and cast as late as possible: logits = self.head(x); "
        "loss = F.cross_entropy(logits.float(), y)."
    ),
    "outside-autocast": (
        "The op runs outside the autocast region. Move the work inside it:\n"
        "with torch.autocast(device_type, dtype=amp_dtype):   # the run's autocast dtype\n"
        "    out = model(x)\n"
        "    loss = loss_fn(out, y)"
    ),
    "unknown-op": (
        "Autocast has no rule for this op (custom or non-ATen op): it runs in its input "
        "dtype. Register one: torch.library.register_autocast('ns::op', device_type, "
        "torch.bfloat16), or cast its inputs inside the op."
    ),
}

SDPA_FIX = (
    "Attention dropout 0 where the run trains on a CPU (GPT-2: GPT2Config(attn_pdrop=0.0); "
    "others: attention_dropout=0.0; or dropout_p=0.0 in the call) lets SDPA run its fused "
    "kernel in the autocast dtype; a CUDA GPU's fused kernels take dropout, so there the "
    "fallback does not happen."
)


def sdpa_fallback_why(section: PrecisionSection) -> str | None:
    """Why ``F.scaled_dot_product_attention`` ran its math path, from the calls the audit saw."""
    whys = []
    for call in section.get("sdpa") or []:
        if not call.get("math"):
            continue
        if float(call.get("dropout_p") or 0.0) > 0 and call.get("device") == "cpu":
            why = f"dropout_p={call['dropout_p']:g} on the CPU, which no fused CPU kernel takes"
        else:
            parts = [f"a {call['mask']} mask" if call.get("mask") else None,
                     f"head size {call['head_dim']}" if call.get("head_dim") else None]  # fmt: skip
            why = (
                "the fused kernels did not take this call ("
                + (", ".join(p for p in parts if p) or "no mask")
                + ")"
            )
        if why not in whys:
            whys.append(why)
    return "; ".join(whys) or None


def reason_fixes(section: PrecisionSection) -> dict[str, str]:
    """The fix for each FP32 reason, for this run: a model on SDPA is never told to use it."""
    fixes = dict(REASON_FIXES)
    if section.get("sdpa"):
        fixes["autocast-fp32-policy"] = (
            "Expected: autocast keeps this op in FP32 for accuracy; do not force it to low "
            "precision."
        )
    why = sdpa_fallback_why(section)
    fixes["sdpa-math-fallback"] = (
        f"F.scaled_dot_product_attention ran its math path ({why or 'not its fused kernel'}), "
        "which computes in FP32 itself. " + SDPA_FIX
    )
    return fixes


_WORK = ("low", "fp32")

COMMUNICATION_OP_PREFIXES = ("c10d::", "_c10d_functional::", "c10d_functional::", "fsdp::")
"""Collectives (and FSDP's buffer copies around them): they move gradients and parameters in
the dtype the strategy chose (DDP reduces in FP32 by design), compute nothing, and their time is
mostly waiting for the other ranks; counted as FP32 work they made ``fp32-ops-in-autocast``
blame an all-reduce with "register an autocast rule"."""


def is_communication_op(name: str) -> bool:
    """Whether an op name is a collective or a communication buffer copy (never compute)."""
    return name.startswith(COMMUNICATION_OP_PREFIXES)


def _work_rows(section: PrecisionSection) -> list[dict[str, Any]]:
    return [
        r
        for r in section.get("ops", [])
        if r.get("phase") in ("forward", "backward")
        and not is_communication_op(str(r.get("op", "")))
    ]


def _time(r: dict[str, Any]) -> float:
    return float(r.get("device_time_us", r.get("time_us", 0.0)))


def _share(part: float, whole: float) -> float:
    return part / whole if whole > 0 else 0.0


def summarize(section: PrecisionSection, top: int = 10) -> PrecisionSummary:
    """The precision summary of an audit section (its keys: `ampdiag.schema.PrecisionSummary`)."""
    totals = _Totals()
    for r in _work_rows(section):
        totals.add(r)
    flops, time_us, matmul, casts = totals.flops, totals.time_us, totals.matmul, totals.casts
    work_flops = flops["low"] + flops["fp32"]
    work_time = time_us["low"] + time_us["fp32"]
    mm_total = matmul["low"] + matmul["fp32"]
    ops_list = list(totals.fp32_ops.values())
    total_casts = {k: sum(c[k] for c in casts.values()) for k in ("count", "bytes", "time_us")}
    by_flops = sorted((o for o in ops_list if o["flops"] > 0), key=lambda o: -o["flops"])[:top]
    by_time = sorted(ops_list, key=lambda o: -o["time_us"])[:top]
    return {
        "flops": flops,
        "time_us": time_us,
        "fp32_flops_share": _share(flops["fp32"], work_flops),
        "fp32_time_share": _share(time_us["fp32"], work_time),
        "cast_time_share": _share(time_us["cast"], work_time + time_us["cast"]),
        "matmul": {
            "low_flops": matmul["low"],
            "fp32_flops": matmul["fp32"],
            "fp32_share": _share(matmul["fp32"], mm_total),
            "autocast_share": _share(matmul["autocast"], mm_total),
        },
        "top_fp32_by_flops": by_flops,
        "top_fp32_by_time": by_time,
        # One row per (op, module, reason, phase): the FLOP-heavy ones, then the slow ones.
        "top_fp32": list({id(o): o for o in by_flops + by_time}.values()),
        "reasons": dict(totals.reasons),
        "casts": {**dict(casts), "total": total_casts},
        "modules": dict(totals.modules),
        "device_differences": device_differences(section),
    }


class _Totals:
    """The audit's rows summed: by precision, matmul FLOPs, FP32 reason and op, cast, module."""

    def __init__(self) -> None:
        self.flops = {"low": 0, "fp32": 0, "cast": 0}
        self.time_us = {"low": 0.0, "fp32": 0.0, "cast": 0.0}
        self.matmul = {"low": 0, "fp32": 0, "autocast": 0}
        self.reasons: dict[str, dict[str, float]] = defaultdict(
            lambda: {"count": 0, "flops": 0, "time_us": 0.0}
        )
        self.fp32_ops: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        self.casts: dict[str, dict[str, float]] = defaultdict(
            lambda: {"count": 0, "bytes": 0, "time_us": 0.0}
        )
        self.modules: dict[str, dict[str, float]] = defaultdict(
            lambda: {"low_time_us": 0.0, "fp32_time_us": 0.0, "low_flops": 0, "fp32_flops": 0}
        )

    def add(self, r: dict[str, Any]) -> None:
        """Adds one audit row."""
        prec = r.get("precision")
        t = _time(r)
        f = int(r.get("flops", 0))
        if prec == "cast":
            c = self.casts[str(r.get("cast_origin"))]
            c["count"] += r.get("count", 0)
            c["bytes"] += r.get("cast_bytes", 0)
            c["time_us"] += t
            self.time_us["cast"] += t
            return
        if prec not in _WORK:
            return
        self.flops[prec] += f
        self.time_us[prec] += t
        mod = self.modules[str(r.get("module"))]
        mod[f"{prec}_time_us"] += t
        mod[f"{prec}_flops"] += f
        if f > 0:
            self.matmul[prec] += f
            if r.get("autocast"):
                self.matmul["autocast"] += f
        if prec == "fp32":
            self._add_fp32(r, t, f)

    def _add_fp32(self, r: dict[str, Any], t: float, f: int) -> None:
        reason = str(r.get("reason"))
        key = (str(r.get("op")), str(r.get("module")), reason, str(r.get("phase")))
        agg = self.fp32_ops.setdefault(
            key,
            {"op": key[0], "module": key[1], "reason": reason, "phase": key[3],
             "count": 0, "flops": 0, "time_us": 0.0},
        )  # fmt: skip
        for into in (self.reasons[reason], agg):  # the reason's totals, and the op's
            into["count"] += r.get("count", 0)
            into["flops"] += f
            into["time_us"] += t


def device_differences(section: PrecisionSection) -> list[dict[str, Any]]:
    """Forward ops of a CPU run inside autocast that CUDA autocast would run in another dtype.

    Uses each op's ``cuda_policy`` (derived by the collector from torch's own autocast header
    and dispatcher registrations): an FP32 policy on an op that ran in low precision on CPU
    (layer_norm, softmax, ...), or a low-precision policy on an op that ran in FP32 on CPU.
    """
    if section.get("device_type") != "cpu":
        return []
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for r in section.get("ops", []):
        if r.get("phase") != "forward" or not r.get("autocast"):
            continue
        if is_communication_op(str(r.get("op", ""))):
            continue
        policy = r.get("cuda_policy")
        prec = r.get("precision")
        if policy is None or prec not in _WORK:
            continue
        if policy in FP32_POLICIES and prec == "low":
            cuda = "float32"
        elif policy == "lower_precision_fp" and prec == "fp32":
            cuda = "low precision"
        else:
            continue
        key = (str(r.get("op")), str(r.get("module")))
        agg = found.setdefault(
            key,
            {
                "op": key[0],
                "module": key[1],
                "cpu_dtype": (r.get("out_dtypes") or ["?"])[0],
                "cuda_policy": policy,
                "cuda_dtype": cuda,
                "count": 0,
                "time_us": 0.0,
            },
        )
        agg["count"] += r.get("count", 0)
        agg["time_us"] += _time(r)
    return sorted(found.values(), key=lambda d: -d["time_us"])


@part("precision")
def derived_summary(session: Session) -> PrecisionSummary | None:
    """The audited step's summary, with the fix for each FP32 reason seen (derived part)."""
    audit = session.section("precision")
    if not audit.get("audited"):
        return None
    summary = summarize(audit)
    fixes = reason_fixes(audit)
    summary["reason_fixes"] = {r: fixes[r] for r in summary["reasons"] if r in fixes}
    return summary
