"""Findings from the memory section: capacity, accumulation, AMP's reach, fragmentation, OOM."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ampdiag.analysis import memory_estimates as estimates
from ampdiag.analysis.advisors import terms
from ampdiag.analysis.compute import computes_in
from ampdiag.analysis.device import advisable
from ampdiag.analysis.registry import rule
from ampdiag.analysis.rules.accumulation import accumulation_broken
from ampdiag.schema import MemorySection
from ampdiag.session import Finding, Session, Severity


@dataclass(frozen=True)
class Thresholds:
    """This module's thresholds, by name: a typo is a type error, not a run-time KeyError."""

    # Peak (CUDA: reserved peak) over capacity (or the limit given).
    near_capacity_medium: float = 0.85
    near_capacity_high: float = 0.95
    # Model state share of the peak above which AMP cannot reduce memory much.
    model_state_share: float = 0.50
    # Activation bytes under autocast over FP32 above which AMP "did not reduce" them.
    amp_activation_ratio: float = 0.80
    # Reserved-but-unallocated share of reserved at the peak, and its minimum size.
    fragmentation_share: float = 0.25
    fragmentation_min_bytes: int = 256 * 1024**2


THRESHOLDS = Thresholds()

MiB = 1024**2


def _mib(n: float) -> str:
    return f"{n / MiB:.1f} MiB"


def _peak_bytes(mem: MemorySection) -> int:
    stats = (mem.get("cuda") or {}).get("stats") or {}
    if stats.get("reserved_peak_bytes"):
        return int(stats["reserved_peak_bytes"])
    return int((mem.get("peak") or {}).get("bytes") or 0)


@rule("memory-near-capacity")
def near_capacity(session: Session) -> Iterator[Finding]:
    """The peak uses >= 85% of the capacity or limit (medium), >= 95% (high)."""
    mem = session.section("memory")
    cap, source = estimates.capacity(mem)
    peak = _peak_bytes(mem)
    if not cap or not peak:
        return
    share = peak / cap
    if share < THRESHOLDS.near_capacity_medium:
        return
    severity: Severity = "high" if share >= THRESHOLDS.near_capacity_high else "medium"
    ms = estimates.model_state_bytes(mem)
    by_cat = (mem.get("peak") or {}).get("by_category") or {}
    yield Finding(
        id="memory-near-capacity",
        severity=severity,
        title=f"Peak memory is {share:.0%} of the {source} ({_mib(peak)} of {_mib(cap)}).",
        evidence={
            "peak_bytes": peak,
            "capacity_bytes": cap,
            "capacity_source": source,
            "share": round(share, 4),
            "activation_bytes": int(by_cat.get("activations", 0)),
            "model_state_bytes": ms,
            "threshold": THRESHOLDS.near_capacity_medium,
        },
        fix=(
            "Lower the activation memory: a smaller micro-batch with gradient accumulation, "
            "activation checkpointing (torch.utils.checkpoint.checkpoint(block, x, "
            "use_reentrant=False)), or autocast to bf16/fp16; and free gradients with "
            "optimizer.zero_grad(set_to_none=True)."
        ),
        section="memory",
        impact=min(1.0, share),
    )


@rule("use-grad-accumulation", "no-micro-batch-fits")
def use_grad_accumulation(session: Session) -> Iterator[Finding]:
    """The target batch does not fit in 90% of the budget (medium).

    The target is ``memory_target_batch``, or the observed batch after an OOM or near capacity;
    a measured per-sample activation size gives the largest micro-batch that fits. Never for a
    run whose accumulation is broken (`grad-accumulation-broken`): fix that first. When not
    even a micro-batch of 1 fits (what does not scale with the batch, the model state first,
    fills the budget), accumulation cannot help, and ``no-micro-batch-fits`` (high) says so.
    """
    if accumulation_broken(session):
        return
    mem = session.section("memory")
    fit = estimates.activation_fit(mem)
    cap, source = estimates.capacity(mem)
    if fit is None or not cap:
        return
    target = mem.get("target_batch")
    if not target:
        pressed = session.status == "error" and _is_oom(session)
        pressed = pressed or _peak_bytes(mem) >= THRESHOLDS.near_capacity_medium * cap
        target = mem.get("observed_batch") if pressed else None
    if not target:
        return
    plan = estimates.plan_accumulation(mem, int(target), fit, cap)
    if plan is None:
        yield _no_micro_batch_fits(
            mem, int(target), fit, cap, source, session.environment, sharded_by(session)
        )
        return
    if plan["fits_without"]:
        return
    micro, steps = plan["micro_batch"], plan["accumulation_steps"]
    yield Finding(
        id="use-grad-accumulation",
        severity="medium",
        title=(
            f"Batch {target} does not fit in {_mib(cap)}: use micro-batches of {micro} and "
            f"accumulate gradients over {steps} steps."
        ),
        evidence={
            "target_batch": int(target),
            "micro_batch": micro,
            "accumulation_steps": steps,
            "per_sample_activation_bytes": round(float(fit["per_sample_bytes"])),
            "activation_fit_source": fit["source"],
            "estimated_peak_bytes": plan["estimated_peak_bytes"],
            "capacity_bytes": cap,
            "capacity_source": source,
            "headroom": estimates.HEADROOM,
        },
        fix=accumulation_fix(session, steps, micro),
        section="memory",
        impact=0.6,
    )


def sharded_by(session: Session) -> str | None:
    """What already shards this run's model state (ZeRO's optimizer, FSDP), if anything.

    A run that shards already is not told to shard: more ranks shard it thinner.
    """
    run = session.section("run")
    if any("ZeroRedundancyOptimizer" in str(o) for o in run.get("optimizers") or []):
        return "ZeroRedundancyOptimizer"
    if any(m.get("fsdp_mixed_precision") for m in run.get("models") or []):
        return "FSDP"
    return None


def _sharding_clause(sharded: str | None, default: str) -> str:
    if sharded is None:
        return default
    return f"more ranks (the state is already sharded by {sharded}: each rank holds 1/N of it), "


def accumulation_fix(session: Session, steps: int, micro: int | None) -> str:
    """The framework's accumulation setting, then the loop in the run's own precision.

    The fix changes the batch, not the precision: a BF16 run needs no scaler, an FP32 run no
    autocast, and an FP16 run keeps its GradScaler (its autocast dtype: `computes_in`).
    """
    loop = terms.accumulation_loop(
        steps, computes_in(session)["autocast"], micro or "batch // accum"
    )
    return terms.with_setting(session, terms.accumulation_setting(session, steps), loop)


def _no_micro_batch_fits(
    mem: MemorySection,
    target: int,
    fit: dict[str, Any],
    cap: int,
    source: str,
    environment: Mapping[str, Any],
    sharded: str | None = None,
) -> Finding:
    """The finding when not even one sample per micro-batch fits.

    What does not scale with the batch (model state, and whatever else the measured peak holds
    besides activations) is over the budget already.
    """
    usable = cap * estimates.HEADROOM
    at_one = estimates.estimate_peak(mem, 1, fit, accumulate=True)
    state = estimates.model_state_bytes(mem)
    return Finding(
        id="no-micro-batch-fits",
        severity="high",
        title=(
            f"Batch {target} cannot fit in {_mib(cap)}, with or without gradient accumulation: "
            f"even a micro-batch of 1 needs about {_mib(at_one)} (model state alone "
            f"{_mib(state)}), over {estimates.HEADROOM:.0%} of the budget."
        ),
        evidence={
            "target_batch": target,
            "estimated_peak_at_micro_batch_1_bytes": int(at_one),
            "usable_bytes": int(usable),
            "model_state_bytes": state,
            "per_sample_activation_bytes": round(float(fit["per_sample_bytes"])),
            "activation_fit_source": fit["source"],
            "capacity_bytes": cap,
            "capacity_source": source,
            "headroom": estimates.HEADROOM,
        },
        fix=(
            "Shrink what does not scale with the batch: an optimizer with less state (SGD "
            "with momentum keeps 1 copy of the weights, Adam 2; 8-bit Adam via bitsandbytes), "
            + _sharding_clause(
                sharded,
                "sharding the model state across devices (torch.distributed.fsdp.fully_shard), ",
            )
            + (
                "BF16 parameters with an optimizer built for them (stochastic rounding or "
                "Kahan-compensated updates), "
                if advisable(environment, "bf16")
                else ""
            )
            + "or a smaller model; or raise the budget "
            "(a device with more memory)."
        ),
        section="memory",
        impact=1.0,
    )


@rule("amp-memory-not-reduced")
def amp_memory_not_reduced(session: Session) -> Iterator[Finding]:
    """Autocast cannot reduce most of the memory (low).

    Under autocast, the model state (FP32 weights, grads, optimizer state) is >= 50% of the
    peak, or the probe measured low-precision activations at >= 80% of FP32's.
    """
    mem = session.section("memory")
    ms = estimates.model_state_bytes(mem)
    peak = int((mem.get("peak") or {}).get("bytes") or 0)
    amp = estimates.amp_comparison(mem)
    autocast = computes_in(session)["autocast"] or (amp or {}).get("dtype")
    if not autocast or not ms:
        return
    share = ms / peak if peak else 0.0
    ratio = amp.get("ratio") if amp else None
    state_bound = peak > 0 and share >= THRESHOLDS.model_state_share
    act_bound = ratio is not None and ratio >= THRESHOLDS.amp_activation_ratio
    if not (state_bound or act_bound):
        return
    st = mem.get("model_state") or {}
    if state_bound:
        title = (
            f"Autocast cannot shrink most of this memory: the FP32 model state (weights, "
            f"gradients, optimizer state) is {share:.0%} of the peak."
        )
    else:
        title = (
            f"Autocast barely reduced activation memory: {ratio:.0%} of FP32's at batch "
            f"{amp['batch'] if amp else '?'}."
        )
    yield Finding(
        id="amp-memory-not-reduced",
        severity="low",
        title=title,
        evidence={
            "autocast": autocast,
            "model_state_bytes": ms,
            "parameter_bytes": st.get("parameters", 0),
            "gradient_bytes": st.get("gradients", 0),
            "optimizer_state_bytes": st.get("optimizer_state", 0),
            "peak_bytes": peak,
            "model_state_share": round(share, 4),
            "activation_ratio_low_vs_fp32": ratio,
            "threshold": THRESHOLDS.model_state_share,
        },
        fix=(
            "Autocast keeps FP32 master weights, gradients and optimizer state; it only "
            "shrinks activations. What shrinks model state: an optimizer with less state "
            "(SGD with momentum: 1 copy instead of Adam's 2; 8-bit Adam via bitsandbytes), "
            + _sharding_clause(
                sharded_by(session),
                "sharding it across GPUs (torch.distributed.fsdp.fully_shard / ZeRO)",
            ).rstrip(", ")
            + (
                ", or BF16 parameters (model.to(torch.bfloat16)) with an optimizer built for "
                "them (stochastic rounding or Kahan-compensated updates): a plain optimizer on "
                "BF16 weights loses small updates, and FP32 master copies take back the memory "
                "saved (see low-precision-params)"
                if advisable(session.environment, "bf16")
                else ""
            )
            + ". If activations did not shrink, check that the "
            "large ops run inside torch.autocast (see the dtype section)."
        ),
        section="memory",
        impact=share if state_bound else 0.2,
    )


@rule("allocator-fragmentation")
def allocator_fragmentation(session: Session) -> Iterator[Finding]:
    """The CUDA caching allocator fragments (medium).

    At the CUDA peak, reserved-but-unallocated memory is >= 25% of reserved and >= 256 MiB, or
    the allocator had to free its cache and retry (num_alloc_retries > 0).
    """
    cuda = session.section("memory").get("cuda") or {}
    peak = cuda.get("peak") or {}
    stats = cuda.get("stats") or {}
    frag = int(peak.get("fragmentation_bytes", 0))
    reserved = int(peak.get("reserved_bytes", 0))
    retries = int(stats.get("num_alloc_retries", 0))
    share = frag / reserved if reserved else 0.0
    fragmented = (
        share >= THRESHOLDS.fragmentation_share and frag >= THRESHOLDS.fragmentation_min_bytes
    )
    if not fragmented and retries == 0:
        return
    yield Finding(
        id="allocator-fragmentation",
        severity="medium",
        title=(
            f"The CUDA allocator held {_mib(frag)} reserved but unused at the peak "
            f"({share:.0%} of reserved)"
            + (f" and retried {retries} allocations after freeing its cache." if retries else ".")
        ),
        evidence={
            "fragmentation_bytes": frag,
            "reserved_bytes": reserved,
            "allocated_bytes": int(peak.get("allocated_bytes", 0)),
            "fragmentation_share": round(share, 4),
            "num_alloc_retries": retries,
            "threshold": THRESHOLDS.fragmentation_share,
        },
        fix=(
            "Let the allocator grow segments instead of splitting fixed ones (set before the "
            "first CUDA call):\n"
            "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n"
            "and keep tensor shapes stable between steps (pad variable-length batches to a few "
            "bucket sizes)."
        ),
        section="memory",
        impact=min(1.0, share),
    )


def _is_oom(session: Session) -> bool:
    err = session.error or {}
    return (
        "OutOfMemoryError" in str(err.get("type", ""))
        or "out of memory" in str(err.get("message", "")).lower()
    )


@rule("out-of-memory")
def out_of_memory(session: Session) -> Iterator[Finding]:
    """The block raised torch.OutOfMemoryError, or the CUDA trace holds an OOM event (high)."""
    mem = session.section("memory")
    cuda = mem.get("cuda") or {}
    ooms = cuda.get("ooms") or []
    if not (_is_oom(session) or ooms or (cuda.get("stats") or {}).get("num_ooms")):
        return
    evidence: dict[str, Any] = {}
    held: dict[str, Any] = {}
    if ooms:
        last = ooms[-1]
        evidence.update(
            requested_bytes=last["requested_bytes"],
            device_free_bytes=last["device_free_bytes"],
            allocated_bytes=last["allocated_bytes"],
            reserved_bytes=last["reserved_bytes"],
            ooms=len(ooms),
        )
        held = last.get("by_category") or {}
        sites = last.get("top_sites") or []
        evidence["top_sites"] = [
            {"bytes": s["bytes"], "count": s["count"], "site": s["frames"][:2]} for s in sites[:3]
        ]
    else:
        held = dict(mem.get("model_state") or {})
        held = {k: held[k] for k in ("parameters", "gradients", "optimizer_state") if k in held}
        pk = mem.get("peak") or {}
        if pk:
            evidence["last_profiled_peak_bytes"] = pk.get("bytes")
            evidence["last_profiled_peak_by_category"] = pk.get("by_category")
    evidence["held_by_category"] = held
    evidence["error"] = (session.error or {}).get("message", "")[:300]
    parts = ", ".join(f"{k} {_mib(v)}" for k, v in sorted(held.items(), key=lambda kv: -kv[1]))
    yield Finding(
        id="out-of-memory",
        severity="high",
        title="The run ran out of memory" + (f"; memory was held by: {parts}." if parts else "."),
        evidence=evidence,
        fix=(
            "Reduce the peak: a smaller micro-batch with gradient accumulation (see the "
            "memory section's what-if table), activation checkpointing, autocast to bf16/fp16, "
            "optimizer.zero_grad(set_to_none=True). Open memory/snapshot.pickle at "
            "https://pytorch.org/memory_viz to see every allocation at the failure."
        ),
        section="memory",
        impact=1.0,
    )
