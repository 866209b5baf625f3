"""Findings from the GPU timeline (the ``timeline`` section, from a trace or a live run)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ampdiag import units
from ampdiag.analysis import device as D
from ampdiag.analysis.advisors import terms
from ampdiag.analysis.registry import rule
from ampdiag.analysis.rules.distributed import straggler
from ampdiag.session import Finding, Session, Severity


@dataclass(frozen=True)
class Thresholds:
    """This module's thresholds, by name: a typo is a type error, not a run-time KeyError."""

    # Idle share of the GPU span (HTA's idle_time / kernel_time).
    idle_share_medium: float = 0.20
    idle_share_high: float = 0.50
    # Share of GEMM/conv kernel time in FP32 without tensor cores (SIMT sgemm, scudnn, ...),
    # counted only when GEMM/conv kernels are at least this share of computation time.
    fp32_matmul_share_medium: float = 0.50
    fp32_matmul_share_high: float = 0.80
    matmul_share_min: float = 0.10
    # Launch-bound: most kernels are short AND the GPU waits on the host a good part of its span.
    short_kernel_us: float = 10.0
    short_kernel_share: float = 0.50
    host_wait_share_medium: float = 0.20
    host_wait_share_high: float = 0.40
    # Communication not hidden under computation: exposed share of the span, overlap share.
    exposed_comm_share_medium: float = 0.10
    exposed_comm_share_high: float = 0.30
    comm_overlap_max: float = 0.50


THRESHOLDS = Thresholds()


def _ranks(session: Session) -> list[dict[str, Any]]:
    """The ranks whose timeline speaks for itself.

    With a straggler (see `straggler-rank`), only the straggler: the others' idle time and
    exposed communication is waiting for it, and advice about them would point elsewhere.
    """
    ranks = session.section("timeline").get("ranks", [])
    found = [r for r in ranks if isinstance(r, dict) and r.get("activities_in_window")]
    late = straggler(session)
    if late is not None:
        found = [r for r in found if r.get("rank") == late["rank"]]
    return found


@rule("gpu-idle")
def gpu_idle(session: Session) -> Iterator[Finding]:
    """The GPU is idle >= 20% of its span (medium), >= 50% (high); says where idle comes from."""
    ranks = _ranks(session)
    if not ranks:
        return
    r = max(ranks, key=lambda x: x["idle_share"])
    share = float(r["idle_share"])
    if share < THRESHOLDS.idle_share_medium:
        return
    idle = r.get("idle_breakdown", {})
    idle_us = float(r["idle_us"]) or 1.0
    host = float(idle.get("host_wait_us", 0.0))
    kern = float(idle.get("kernel_wait_us", 0.0))
    severity: Severity = "high" if share >= THRESHOLDS.idle_share_high else "medium"
    cause = "waiting on the host" if host >= kern else "with work queued behind other work"
    fix = (
        "Most idle time is the GPU waiting for the CPU to launch work. Cut host overhead:\n"
        "model = torch.compile(model)            # fuse small ops into fewer kernels\n"
        "# or capture a static step in a CUDA graph: torch.cuda.graphs.make_graphed_callables\n"
        "loader = DataLoader(ds, num_workers=4, pin_memory=True)  # keep input off the step\n"
        "x = x.to('cuda', non_blocking=True)     # and avoid .item()/.cpu() syncs in the loop"
        if host >= kern
        else "Idle time is spent with work queued: look for synchronisations and stream waits\n"
        "(torch.cuda.synchronize, .item(), event waits) and overlap copies with compute:\n"
        "x = x.pin_memory().to('cuda', non_blocking=True)"
    )
    yield Finding(
        id="gpu-idle",
        severity=severity,
        title=f"The GPU is idle {share:.0%} of the traced time (rank {r['rank']}), mostly {cause}.",
        evidence={
            "rank": r["rank"],
            "idle_share": round(share, 4),
            "idle_us": round(float(r["idle_us"]), 1),
            "span_us": round(float(r["span_us"]), 1),
            "host_wait_us": round(host, 1),
            "kernel_wait_us": round(kern, 1),
            "other_us": round(float(idle.get("other_us", 0.0)), 1),
            "host_wait_share_of_idle": round(host / idle_us, 4),
            "threshold": THRESHOLDS.idle_share_medium,
        },
        fix=fix,
        section="timeline",
        impact=share,
    )


@rule("fp32-kernels-dominant")
def fp32_kernels_dominant(session: Session) -> Iterator[Finding]:
    """GEMM/conv time is >= 50% FP32 without tensor cores (medium; >= 80% high).

    Only counted when GEMM/conv kernels take >= 10% of the computation-kernel time. The fix
    follows the GPU's compute capability (`ampdiag.analysis.device`): BF16 and TF32 only from
    8.0, FP16 tensor cores from 7.0; below, no tensor cores to move the GEMMs to.
    """
    ranks = [r for r in _ranks(session) if r.get("precision")]
    if not ranks:
        return
    r = max(ranks, key=lambda x: x["precision"]["fp32_matmul_us"])
    p = r["precision"]
    share = float(p["fp32_matmul_share"])
    if (
        share < THRESHOLDS.fp32_matmul_share_medium
        or float(p["matmul_share"]) < THRESHOLDS.matmul_share_min
    ):
        return
    severity: Severity = "high" if share >= THRESHOLDS.fp32_matmul_share_high else "medium"
    top = [k["short_name"] for k in p.get("fp32_matmul_kernels", [])[:5]]
    env = session.environment
    tensor_cores = D.has_tensor_cores(env)
    gpu = units.gpu(env)
    if tensor_cores is False:
        why = (
            f"{gpu} has no tensor cores: FP16 autocast halves the memory traffic (and runs FP16 "
            "at twice the FP32 rate on sm_60 / sm_62), a newer GPU runs these on tensor cores."
        )
    else:
        why = "mixed precision would run these on tensor cores."
    yield Finding(
        id="fp32-kernels-dominant",
        severity=severity,
        title=(
            f"{share:.0%} of GEMM/convolution time runs in FP32 without tensor cores "
            f"(rank {r['rank']}): {why}"
        ),
        evidence={
            "rank": r["rank"],
            "fp32_matmul_share": round(share, 4),
            "fp32_matmul_us": round(float(p["fp32_matmul_us"]), 1),
            "matmul_us": round(float(p["matmul_us"]), 1),
            "compute_kernel_us": round(float(p["compute_kernel_us"]), 1),
            "tensor_core_share": round(float(p["tensor_core_share"]), 4),
            "low_precision_share": round(float(p["low_precision_share"]), 4),
            "top_fp32_kernels": top,
            "threshold": THRESHOLDS.fp32_matmul_share_medium,
            "device": gpu,
            "device_capability": env.get("device_capability"),
        },
        fix=_mixed_precision_fix(env),
        section="timeline",
        impact=share * float(p["matmul_share"]),
    )


def _mixed_precision_fix(env: dict[str, Any] | Any) -> str:
    """Autocast as this GPU runs it: BF16 and TF32 from 8.0, else FP16 with a GradScaler."""
    if D.runs_bf16(env) is False:
        return (
            "Run the forward pass under FP16 autocast with a GradScaler, the mixed precision "
            f"{units.gpu(env)} runs:\n" + terms.training_step("fp16", "cuda")
        )
    unknown = D.runs_bf16(env) is None
    return (
        "Run the forward pass under autocast "
        + ("(bf16 where supported, else fp16 + GradScaler):\n" if unknown else "in BF16:\n")
        + terms.training_step("bf16", "cuda")
        + "\n# At least allow TF32 tensor cores for FP32 matmuls and convolutions:\n"
        "torch.backends.cuda.matmul.allow_tf32 = True\n"
        "torch.backends.cudnn.allow_tf32 = True"
    )


@rule("launch-bound")
def launch_bound(session: Session) -> Iterator[Finding]:
    """Most kernels are short and the GPU waits on the host.

    Fires when >= 50% of kernels run under 10 µs and host wait is >= 20% of the GPU span
    (medium; >= 40% high).
    """
    ranks = [r for r in _ranks(session) if r.get("idle_breakdown")]
    if not ranks:
        return
    r = max(ranks, key=lambda x: x["idle_breakdown"]["host_wait_us"] / (x["span_us"] or 1.0))
    span = float(r["span_us"]) or 1.0
    host_share = float(r["idle_breakdown"]["host_wait_us"]) / span
    short = float(r.get("short_kernel_share", 0.0))
    if short < THRESHOLDS.short_kernel_share or host_share < THRESHOLDS.host_wait_share_medium:
        return
    severity: Severity = "high" if host_share >= THRESHOLDS.host_wait_share_high else "medium"
    dur = r.get("kernel_duration", {})
    lat = r.get("launch_latency", {})
    yield Finding(
        id="launch-bound",
        severity=severity,
        title=(
            f"Launch-bound: {short:.0%} of kernels run under "
            f"{THRESHOLDS.short_kernel_us:.0f} µs "
            f"and the GPU waits on the host {host_share:.0%} of the time (rank {r['rank']})."
        ),
        evidence={
            "rank": r["rank"],
            "short_kernel_share": round(short, 4),
            "median_kernel_us": round(float(dur.get("median_us", 0.0)), 2),
            "kernels": int(dur.get("count", 0)),
            "kernels_per_step": round(float(r.get("kernels_per_step", 0.0)), 1),
            "host_wait_share": round(host_share, 4),
            "launch_latency_median_us": round(float(lat.get("median_us", 0.0)), 2),
            "threshold": THRESHOLDS.host_wait_share_medium,
        },
        fix=(
            "Launch fewer, larger kernels:\n"
            "model = torch.compile(model, mode='reduce-overhead')  # fusion + CUDA graphs\n"
            "# raise the batch size if memory allows, and use fused optimizers:\n"
            "opt = torch.optim.AdamW(model.parameters(), fused=True)"
        ),
        section="timeline",
        impact=host_share,
    )


@rule("comm-not-overlapped")
def comm_not_overlapped(session: Session) -> Iterator[Finding]:
    """Communication is not hidden under computation.

    Fires when communication kernels overlap computation < 50% of their time and the exposed
    part is >= 10% of the GPU span (medium; >= 30% high).
    """
    ranks = [r for r in _ranks(session) if r.get("communication", {}).get("comm_us")]
    if not ranks:
        return
    r = max(ranks, key=lambda x: x["communication"]["exposed_share_of_span"])
    c = r["communication"]
    exposed = float(c["exposed_share_of_span"])
    if (
        exposed < THRESHOLDS.exposed_comm_share_medium
        or float(c["overlap_share"]) >= THRESHOLDS.comm_overlap_max
    ):
        return
    severity: Severity = "high" if exposed >= THRESHOLDS.exposed_comm_share_high else "medium"
    summary = session.section("timeline").get("summary", {})
    yield Finding(
        id="comm-not-overlapped",
        severity=severity,
        title=(
            f"Communication is exposed {exposed:.0%} of the GPU time (rank {r['rank']}): only "
            f"{float(c['overlap_share']):.0%} of it overlaps computation."
        ),
        evidence={
            "rank": r["rank"],
            "comm_us": round(float(c["comm_us"]), 1),
            "exposed_us": round(float(c["exposed_us"]), 1),
            "overlap_share": round(float(c["overlap_share"]), 4),
            "exposed_share_of_span": round(exposed, 4),
            "slowest_rank": summary.get("slowest_rank"),
            "threshold": THRESHOLDS.exposed_comm_share_medium,
        },
        fix=(
            "Overlap gradient all-reduce with the backward pass and send fewer, larger buckets:\n"
            "model = DDP(model, bucket_cap_mb=50, gradient_as_bucket_view=True)\n"
            "# fewer syncs: accumulate gradients and skip the all-reduce on micro-steps\n"
            "with model.no_sync():\n"
            "    loss.backward()\n"
            "# compress what is sent:\n"
            "model.register_comm_hook(None, default_hooks."
            + ("fp16" if D.runs_bf16(session.environment) is False else "bf16")
            + "_compress_hook)"
        ),
        section="timeline",
        impact=exposed,
    )
