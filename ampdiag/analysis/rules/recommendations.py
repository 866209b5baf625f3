"""Advisors: recommendations computed from several findings at once (see analysis/advisors.py).

Each advisor reads the findings the rules produced (by their stable ids and documented evidence
keys) and the session's environment, and returns one recommendation with the numbers it rests
on, merging the findings it explains:

========================  ==================================================================
recommendation            evidence it merges (``explains``)
========================  ==================================================================
prefer-bf16               fp16-grad-underflow, grad-scaler-missing, grad-scaler-disabled,
                          skipped-steps, loss-scale-collapse, activation-overflow,
                          nonfinite-origin -- on a device that runs BF16
tune-grad-scaler          fp16-grad-underflow, grad-scaler-missing, grad-scaler-disabled,
                          skipped-steps, loss-scale-collapse -- on a device without BF16
use-grad-accumulation     memory-near-capacity (activations >= 50% of the peak)
tune-input-pipeline       dataloader-bound, gpu-idle (the idle time is the data wait)
increase-batch-size       gpu-idle, launch-bound (no data wait, memory not near capacity)
========================  ==================================================================
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from ampdiag.analysis.advisors import Advice, advisor, find, number, worst_severity
from ampdiag.analysis.rules.accumulation import accumulation_broken
from ampdiag.analysis.rules.numerics import fp16_in_use
from ampdiag.session import Finding, Session

THRESHOLDS: dict[str, float] = {
    # tune-grad-scaler: skips per step beyond the start-up backoff that are tolerated; the
    # recommended growth_interval keeps growth-caused skips at this rate (1 / rate).
    "target_skip_rate": 0.0005,
    # tune-grad-scaler: growth_interval when gradients underflow and nothing overflows, so the
    # scale follows gradients that shrink during training 4x faster than the default 2000.
    "growth_interval_underflow": 500,
    # use-grad-accumulation: activations must be at least this share of the peak.
    "activation_share_min": 0.5,
    # use-grad-accumulation / increase-batch-size: keep the peak under (1 - headroom) x capacity.
    "memory_headroom": 0.15,
    # tune-input-pipeline: worker count bounds.
    "num_workers_min": 2,
    "num_workers_max": 16,
    # increase-batch-size: the idle share to reach, and the largest batch multiplier advised.
    "target_idle_share": 0.10,
    "batch_multiplier_max": 8,
}

FP16_UNDERFLOW = "fp16-grad-underflow"
SCALER_MISUSE = ("grad-scaler-missing", "grad-scaler-disabled")
SCALE_TROUBLE = ("skipped-steps", "loss-scale-collapse")
RANGE_TROUBLE = ("activation-overflow", "nonfinite-origin")
DEFAULT_INIT_SCALE = 2.0**16
DEFAULT_GROWTH_INTERVAL = 2000


def _actionable(findings: list[Finding], *ids: str) -> list[Finding]:
    return [f for f in find(findings, *ids) if f.severity != "info"]


def bf16_supported(session: Session) -> bool | None:
    """Whether the run's device runs BF16: True, False, or None when the session cannot say."""
    env = session.environment
    value = env.get("bf16_supported")
    if isinstance(value, bool):
        return value
    cap = env.get("device_capability")
    if isinstance(cap, str) and cap.replace(".", "", 1).isdigit():
        return float(cap) >= 8.0
    return None


def device_type(session: Session) -> str:
    """The run's device type ("cuda" when the session does not say)."""
    return str(session.environment.get("device_type") or "cuda")


def batch_size(session: Session, *findings: Finding) -> int | None:
    """The batch size from evidence, the memory section or the speed probe, if any records it."""
    candidates: list[Any] = [f.evidence.get("batch_size") for f in findings]
    candidates.append(session.section("memory").get("observed_batch"))
    candidates.append(session.section("speed_probe").get("batch_size"))
    for value in candidates:
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _pow2_ceil(x: float) -> float:
    return float(2.0 ** math.ceil(math.log2(max(x, 1.0))))


def _pow2_floor(x: float) -> float:
    return float(2.0 ** math.floor(math.log2(max(x, 1.0))))


def _fp16_evidence(merged: list[Finding]) -> dict[str, Any]:
    """The key numbers of the merged FP16 findings, flattened under their documented keys."""
    out: dict[str, Any] = {}
    keys = {
        FP16_UNDERFLOW: ("underflow_fraction", "recommended_init_scale"),
        "skipped-steps": ("skipped", "steps"),
        "loss-scale-collapse": ("scale_initial", "scale_min"),
        "activation-overflow": ("module", "max_abs"),
    }
    for f in merged:
        for key in keys.get(f.id, ()):
            if key in f.evidence and key not in out:
                out[key] = f.evidence[key]
    return out


def computes_fp16(session: Session) -> bool:
    """Whether the run computes in FP16 (autocast or parameters).

    The only runs FP16 advice is for: a BF16 or FP32 run's inf/NaN points at its origin,
    not at the dtype.
    """
    autocast = str(session.environment.get("autocast") or "")
    return fp16_in_use(session) or autocast.endswith(":float16")


@advisor("prefer-bf16", "tune-grad-scaler")
def precision_advice(session: Session, findings: list[Finding]) -> Iterator[Advice]:
    """FP16 trouble answered by BF16 where the device runs it, else by GradScaler settings.

    prefer-bf16: any of fp16-grad-underflow, grad-scaler-missing/-disabled, skipped-steps,
    loss-scale-collapse, activation-overflow, nonfinite-origin (not info) on a device with
    ``environment.bf16_supported`` (CUDA capability >= 8.0; any CPU). BF16 has FP32's
    exponent range: no underflow at 2^-24, no overflow at 65504, no GradScaler needed.
    Neither is advised to a run that does not compute in FP16 (`computes_fp16`).

    tune-grad-scaler: the same evidence (less the forward-range findings, which no loss scale
    fixes) where BF16 is not supported or unknown. ``init_scale`` = the underflow finding's
    ``recommended_init_scale`` rounded up to a power of two, capped by the lowest scale the run
    backed off to (``scale_min``: above it, gradients overflowed); when the underflow bound is
    above the overflow bound FP16's range is too narrow (``range_conflict``).
    ``growth_interval`` = 1 / target_skip_rate (2000) when the run skipped steps beyond the
    start-up backoff (log2(scale_initial / scale_min) skips), 500 when gradients underflow and
    nothing overflows, else torch's default 2000.
    """
    scaler_ids = (FP16_UNDERFLOW, *SCALER_MISUSE, *SCALE_TROUBLE)
    trouble = _actionable(findings, *scaler_ids, *RANGE_TROUBLE)
    if not trouble or not computes_fp16(session):
        return
    env = session.environment
    dev = device_type(session)
    bf16 = bf16_supported(session)
    if bf16:
        evidence: dict[str, Any] = {
            "autocast": env.get("autocast"),
            "device_type": dev,
            "bf16_supported": True,
        }
        evidence.update(_fp16_evidence(trouble))
        note = ""
        if dev == "cpu" and env.get("bf16_native") is False:
            evidence["bf16_native"] = False
            note = (
                "\n# This CPU has no native BF16 (no AVX512_BF16/AMX): BF16 runs emulated and can"
                "\n# be slower than FP32 (see autocast-slower); FP32 is the fast exact option here."
            )
        rec = Finding(
            id="prefer-bf16",
            severity=worst_severity(trouble),  # type: ignore[arg-type]
            title=(
                f"Train in BF16 instead of FP16: this {dev} device runs BF16, whose FP32-sized "
                f"exponent range removes the {len(trouble)} FP16 range problem(s) found."
            ),
            evidence=evidence,
            fix=(
                f"with torch.autocast(device_type={dev!r}, dtype=torch.bfloat16):\n"
                "    loss = loss_fn(model(x), y)\n"
                "loss.backward()        # no GradScaler: BF16 neither underflows nor overflows\n"
                "optimizer.step()\n"
                "optimizer.zero_grad(set_to_none=True)" + note
            ),
            section="precision",
            impact=min(1.0, 0.6 + 0.1 * len(trouble)),
        )
        yield Advice(rec, trouble)
        return
    merged = _actionable(findings, *scaler_ids)
    if not merged:
        return
    yield Advice(_grad_scaler_settings(session, merged, bf16), merged)


def _grad_scaler_settings(session: Session, merged: list[Finding], bf16: bool | None) -> Finding:
    by_id = {f.id: f for f in merged}
    under = by_id.get(FP16_UNDERFLOW)
    collapse = by_id.get("loss-scale-collapse")
    skips = by_id.get("skipped-steps")
    rec_scale = number(under.evidence, "recommended_init_scale") if under else None
    scale_min = number(collapse.evidence, "scale_min") if collapse else None
    scale_initial = number(collapse.evidence, "scale_initial") if collapse else None
    upper = _pow2_floor(scale_min) if scale_min else None
    conflict = bool(rec_scale and upper and _pow2_ceil(rec_scale) > upper)
    if rec_scale and not conflict:
        init_scale = _pow2_ceil(rec_scale)
    elif upper:
        init_scale = upper
    else:
        init_scale = DEFAULT_INIT_SCALE
    skipped = number(skips.evidence, "skipped") if skips else None
    steps = number(skips.evidence, "steps") if skips else None
    startup = 0
    if scale_initial and scale_min and scale_initial > scale_min:
        startup = round(math.log2(scale_initial / scale_min))
    steady = max(0.0, (skipped or 0.0) - startup)
    evidence: dict[str, Any] = {
        "init_scale": init_scale,
        "growth_interval": DEFAULT_GROWTH_INTERVAL,
        "bf16_supported": bf16,
    }
    evidence.update(_fp16_evidence(merged))
    rate = THRESHOLDS["target_skip_rate"]
    if steps and steady / steps > rate:
        evidence["growth_interval"] = math.ceil(1 / rate)
        evidence["steady_skip_rate"] = round(steady / steps, 4)
        evidence["implied_growth_interval"] = max(1, round(steps / steady) - 1)
    elif under is not None and not conflict:
        evidence["growth_interval"] = int(THRESHOLDS["growth_interval_underflow"])
    if startup:
        evidence["startup_skips"] = startup
    if conflict:
        evidence["range_conflict"] = True
    dev = device_type(session)
    conflict_note = (
        "\n# The scale that avoids underflow overflows other gradients: FP16's range is too narrow"
        "\n# for this model. Keep the overflowing modules in FP32 (torch.autocast(..., enabled="
        "False)\n# around them) or train in BF16 on a device that supports it."
        if conflict
        else ""
    )
    unknown_note = (
        "\n# If this GPU supports BF16 (compute capability >= 8.0), prefer BF16 autocast and drop"
        "\n# the scaler."
        if bf16 is None
        else ""
    )
    return Finding(
        id="tune-grad-scaler",
        severity=worst_severity(merged),  # type: ignore[arg-type]
        title=(
            f"Use a GradScaler with init_scale={init_scale:.0f} and growth_interval="
            f"{evidence['growth_interval']}, computed from the measured FP16 gradient range."
        ),
        evidence=evidence,
        fix=(
            f"scaler = torch.amp.GradScaler({dev!r}, init_scale={init_scale:.0f}, "
            f"growth_interval={evidence['growth_interval']})\n"
            f"with torch.autocast(device_type={dev!r}, dtype=torch.float16):\n"
            "    loss = loss_fn(model(x), y)\n"
            "scaler.scale(loss).backward()\n"
            "scaler.unscale_(optimizer)   # before clipping, if you clip\n"
            "scaler.step(optimizer)\n"
            "scaler.update()" + conflict_note + unknown_note
        ),
        section="gradscaler",
        impact=min(1.0, 0.5 + 0.1 * len(merged)),
    )


@advisor("use-grad-accumulation")
def memory_advice(session: Session, findings: list[Finding]) -> Iterator[Advice]:
    """Memory near capacity with activations >= 50% of the peak: accumulate gradients.

    With a rule's own use-grad-accumulation finding present, memory-near-capacity is merged into
    it. Otherwise, from memory-near-capacity's ``peak_bytes``, ``capacity_bytes`` and
    ``activation_bytes`` (activations scale with the micro-batch, the rest does not): the target
    peak is (1 - 0.15) x capacity; accumulation_steps = ceil(activation_bytes / (target - (peak
    - activation_bytes))); micro_batch = floor(batch / steps) where the batch size is known.
    Nothing is advised when the non-activation memory alone exceeds the target, nor to a run
    whose accumulation is broken (grad-accumulation-broken: more micro-batches would be lost).
    """
    if accumulation_broken(session) or find(findings, "grad-accumulation-broken"):
        return
    near = find(findings, "memory-near-capacity")
    existing = find(findings, "use-grad-accumulation")
    if existing:
        yield Advice(existing[0], near)
        return
    if not near:
        return
    mnc = near[0]
    ev = mnc.evidence
    peak, cap = number(ev, "peak_bytes"), number(ev, "capacity_bytes")
    act = number(ev, "activation_bytes")
    if not (peak and cap and act) or act / peak < THRESHOLDS["activation_share_min"]:
        return
    target = cap * (1 - THRESHOLDS["memory_headroom"])
    fixed = peak - act
    budget = target - fixed
    if budget <= 0 or peak <= target:
        return
    steps = max(2, math.ceil(act / budget))
    batch = batch_size(session, mnc)
    micro: int | None = None
    if batch is not None:
        if batch < 2:
            return
        micro = max(1, batch // steps)
        steps = math.ceil(batch / micro)
    fraction = (micro / batch) if (micro and batch) else 1 / steps
    evidence: dict[str, Any] = {
        "micro_batch": micro,
        "accumulation_steps": steps,
        "batch_size": batch,
        "activation_share": round(act / peak, 4),
        "peak_bytes": int(peak),
        "capacity_bytes": int(cap),
        "expected_peak_bytes": int(fixed + act * fraction),
        "target_peak_bytes": int(target),
    }
    loader = f"DataLoader(dataset, batch_size={micro})" if micro else "a batch 1/steps as large"
    rec = Finding(
        id="use-grad-accumulation",
        severity=mnc.severity,
        title=(
            f"Accumulate gradients over {steps} micro-batches"
            + (f" of {micro}" if micro else "")
            + f": activations are {act / peak:.0%} of the peak, which would fall to about "
            f"{(fixed + act * fraction) / cap:.0%} of capacity."
        ),
        evidence=evidence,
        fix=(
            f"accum = {steps}   # same effective batch, activations for 1/{steps} of it\n"
            f"# loader: {loader}\n"
            "for i, (x, y) in enumerate(loader):\n"
            "    with torch.autocast(device_type=..., dtype=...):\n"
            "        loss = loss_fn(model(x), y) / accum\n"
            "    scaler.scale(loss).backward()\n"
            "    if (i + 1) % accum == 0:\n"
            "        scaler.step(optimizer)\n"
            "        scaler.update()\n"
            "        optimizer.zero_grad(set_to_none=True)"
        ),
        section="memory",
        impact=act / peak,
    )
    yield Advice(rec, [mnc])


@advisor("tune-input-pipeline", "increase-batch-size")
def throughput_advice(session: Session, findings: list[Finding]) -> Iterator[Advice]:
    """The device waits: feed it faster (data loading) or give it more work per launch.

    tune-input-pipeline: dataloader-bound present (data_share >= 10%, its rule's threshold);
    gpu-idle is merged into it. num_workers = ceil(data_ms / compute_ms) + 1 in [2, 16] (W
    workers deliver a batch every data_ms / W), pin_memory on CUDA.

    increase-batch-size: gpu-idle (idle_share above 10%) with no data wait and no
    memory-near-capacity; launch-bound merged. With a fixed per-step host overhead, a batch k
    times larger gives idle share s / (s + (1 - s) k); k = ceil(s (1 - t) / (t (1 - s))) reaches
    t = 10%, capped at 8.
    """
    dl = _actionable(findings, "dataloader-bound")  # an uncertain (info) one advises nothing
    idle = find(findings, "gpu-idle")
    dev = device_type(session)
    if dl:
        yield _input_pipeline(dl[0], idle, dev)
        return
    if not idle or find(findings, "memory-near-capacity"):
        return
    gi = idle[0]
    s = number(gi.evidence, "idle_share")
    t = THRESHOLDS["target_idle_share"]
    if s is None or s <= t or s >= 1:
        return
    k = min(int(THRESHOLDS["batch_multiplier_max"]), math.ceil(s * (1 - t) / (t * (1 - s))))
    if k < 2:
        return
    batch = batch_size(session, gi)
    explained = [gi, *find(findings, "launch-bound")]
    expected_idle = s / (s + (1 - s) * k)
    rec = Finding(
        id="increase-batch-size",
        severity=worst_severity(explained),  # type: ignore[arg-type]
        title=(
            f"The GPU is idle {s:.0%} of the time: a {k}x larger batch"
            + (f" ({batch} -> {batch * k})" if batch else "")
            + f" would bring idle to about {expected_idle:.0%}."
        ),
        evidence={
            "idle_share": s,
            "batch_multiplier": k,
            "batch_size": batch,
            "suggested_batch_size": batch * k if batch else None,
            "expected_idle_share": round(expected_idle, 4),
        },
        fix=(
            f"loader = DataLoader(dataset, batch_size={batch * k if batch else f'{k} * batch'}, "
            "...)\n"
            f"# scale the learning rate with the batch (e.g. lr *= {k} for SGD, sqrt({k}) for "
            "Adam),\n# or cut the per-step launch overhead instead:\n"
            'model = torch.compile(model, mode="reduce-overhead")   # CUDA graphs'
        ),
        section="time",
        impact=s,
    )
    yield Advice(rec, explained)


def _input_pipeline(dl: Finding, idle: list[Finding], dev: str) -> Advice:
    ev = dl.evidence
    share = number(ev, "data_share") or 0.0
    data_ms = number(ev, "data_ms_per_step")
    step_ms = number(ev, "step_ms")
    if data_ms is not None and step_ms is not None and step_ms > data_ms:
        ratio = data_ms / (step_ms - data_ms)
    else:
        ratio = share / max(1e-9, 1 - share)
    lo, hi = int(THRESHOLDS["num_workers_min"]), int(THRESHOLDS["num_workers_max"])
    workers = max(lo, min(hi, math.ceil(ratio) + 1))
    pin = dev == "cuda"
    evidence: dict[str, Any] = {
        "data_share": share,
        "data_ms_per_step": data_ms,
        "step_ms": step_ms,
        "num_workers": workers,
        "pin_memory": pin,
    }
    if step_ms is not None and data_ms is not None:
        evidence["expected_step_ms"] = round(max(step_ms - data_ms, data_ms / workers), 3)
    rec = Finding(
        id="tune-input-pipeline",
        severity=worst_severity([dl, *idle]),  # type: ignore[arg-type]
        title=(
            f"Data loading takes {share:.0%} of each step: load in {workers} worker processes"
            + (" with pinned memory" if pin else "")
            + " so batches are ready when the model asks."
        ),
        evidence=evidence,
        fix=(
            f"loader = DataLoader(dataset, batch_size=..., num_workers={workers}, "
            f"pin_memory={pin},\n"
            "                    persistent_workers=True, prefetch_factor=2)"
            + ("\nx = x.to('cuda', non_blocking=True)   # overlaps the copy" if pin else "")
        ),
        section="time",
        impact=share,
    )
    return Advice(rec, [dl, *idle])
