"""What-if estimates from a memory section: pure arithmetic on measured numbers.

Activation memory is modelled as ``fixed + per_sample * batch``, with both terms fitted to
activation bytes *measured* at two or more batch sizes (by `ampdiag.memory_probe`, or by the
live run when its batch size varied). Activations are the storages autograd saved for the
backward, parameters and their autocast copies excluded
(`ampdiag.sources.live.saved_activations`); the per-sample slope is never negative.

The peak at another batch ``b``: the timeline gives two measured points at the observed batch
``B``, the overall peak (total ``T1``, activations ``A1`` live then; often the optimizer step,
with no activations) and the point with the most activations (``T2``, ``A2``; the start of the
backward), each at the batch of its own step. Each point's activations scale with the batch, by
``k = act(b) / act(B)``, the rest stays: ``peak(b) = max(T1 + A1 (k1 - 1), T2 + A2 (k2 - 1))``.
Backward temporaries that grow with the batch (the gradients of activations) are not in ``A``,
so this is a lower bound for a larger batch. A plan that accumulates (two or more micro-batches)
when the measured run did not also holds every gradient through each micro-batch, and each
parameter's new gradient before it is added to ``.grad``: ``G - G_i + G_max`` is added to each
point where not every gradient is live yet (``G`` all gradients' bytes, ``G_i`` those live at
the point, ``G_max`` the largest parameter's); a point where all are (after the backward: the
optimizer step, say) holds no gradient in flight, and accumulating adds nothing there.
Without the activation point it is ``T1 + per_sample * (b - B)``; without a measured peak,
model state + fixed + ``per_sample * b``. Nothing here is assumed: when there are no two
measured batch sizes, estimates that need ``per_sample`` are absent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ampdiag import units
from ampdiag.analysis.derive import part
from ampdiag.schema import MemoryWhatIf, WhatIfRow
from ampdiag.session import Session

#: Fraction of the capacity a plan may use (the rest is left for the allocator and spikes).
HEADROOM = 0.90


def fit_linear(points: Sequence[Sequence[float]]) -> dict[str, float] | None:
    """Least-squares ``bytes = fixed + per_sample * batch`` over [[batch, bytes], ...].

    Returns None with fewer than two distinct batch sizes.
    """
    pts = [(float(b), float(v)) for b, v in points]
    xs = {b for b, _ in pts}
    if len(xs) < 2:
        return None
    n = len(pts)
    mx = sum(b for b, _ in pts) / n
    my = sum(v for _, v in pts) / n
    sxx = sum((b - mx) ** 2 for b, _ in pts)
    sxy = sum((b - mx) * (v - my) for b, v in pts)
    slope = max(0.0, sxy / sxx)  # activations never shrink as the batch grows
    return {"per_sample_bytes": slope, "fixed_bytes": my - slope * mx}


def model_state_bytes(section: Mapping[str, Any]) -> int:
    """Parameters + gradients + optimizer state, from the live tensors."""
    ms = section.get("model_state") or {}
    return int(sum(int(ms.get(k, 0)) for k in ("parameters", "gradients", "optimizer_state")))


def activation_fit(section: Mapping[str, Any]) -> dict[str, Any] | None:
    """The activation model: from the probe (preferred) or from the live run's batch sizes."""
    for probe in reversed(section.get("probes") or []):
        fit = fit_linear(probe.get("points") or [])
        if fit is not None:
            return {**fit, "source": "memory_probe", "points": probe["points"]}
    live = section.get("live_activation_points") or []
    fit = fit_linear(live)
    if fit is not None:
        return {**fit, "source": "live run", "points": live}
    return None


def estimate_peak(
    section: Mapping[str, Any], batch: int, fit: Mapping[str, Any], accumulate: bool = False
) -> float:
    """Estimated peak bytes at ``batch`` (module docstring).

    With ``accumulate``, as one micro-batch of several (all gradients held throughout).
    """
    per = float(fit["per_sample_bytes"])
    fixed = float(fit["fixed_bytes"])
    observed = section.get("observed_batch")
    pk = section.get("peak") or {}
    peak = pk.get("bytes")
    if not (observed and peak):
        return model_state_bytes(section) + fixed + per * batch
    state = section.get("model_state") or {}
    extra = accumulate and int(section.get("micro_batches_max") or 1) < 2
    grads, largest = float(state.get("gradients", 0)), float(state.get("largest_gradient", 0))

    def held(point: Mapping[str, Any]) -> float:
        live = float((point.get("by_category") or {}).get("gradients", point.get("gradients", 0)))
        if not extra or live >= grads:
            return 0.0  # every gradient already live there: the backward is over, none in flight
        return grads - live + largest

    most = section.get("activation_peak") or {}
    if not most.get("activations"):
        return float(peak) + per * (batch - int(observed)) + held(pk)

    def grown(total: float, acts: float, at: int) -> float:
        now = fixed + per * at
        return total + acts * ((fixed + per * batch) / now - 1) if now > 0 else total

    acts = (pk.get("by_category") or {}).get("activations", 0)
    return max(
        grown(float(peak), float(acts), int(observed)) + held(pk),
        grown(float(most["bytes"]), float(most["activations"]), int(most.get("batch") or observed))
        + held(most),
    )


def capacity(section: Mapping[str, Any]) -> tuple[int | None, str]:
    """The memory budget: the limit given, else the device's capacity; and where it came from."""
    if section.get("limit_bytes"):
        return int(section["limit_bytes"]), "limit given"
    if section.get("capacity_bytes"):
        return int(section["capacity_bytes"]), str(section.get("capacity_source", "device"))
    return None, "unknown"


def plan_accumulation(
    section: Mapping[str, Any], target_batch: int, fit: Mapping[str, Any], budget: float
) -> dict[str, Any] | None:
    """For a target effective batch: the largest micro-batch that fits and the accumulation.

    Returns ``{micro_batch, accumulation_steps, estimated_peak_bytes, fits_without}`` or None
    when not even a micro-batch of 1 fits.
    """
    per = float(fit["per_sample_bytes"])
    usable = budget * HEADROOM
    if estimate_peak(section, target_batch, fit) <= usable:
        return {
            "target_batch": target_batch,
            "micro_batch": target_batch,
            "accumulation_steps": 1,
            "estimated_peak_bytes": int(estimate_peak(section, target_batch, fit)),
            "fits_without": True,
        }
    if per <= 0:
        return None
    if estimate_peak(section, 1, fit, accumulate=True) > usable:
        return None
    lo, hi = 1, target_batch  # estimate_peak grows with the batch: the largest that fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if estimate_peak(section, mid, fit, accumulate=True) <= usable:
            lo = mid
        else:
            hi = mid - 1
    largest = lo
    steps = math.ceil(target_batch / largest)
    micro = math.ceil(target_batch / steps)  # balanced micro-batches, none larger than `largest`
    return {
        "target_batch": target_batch,
        "micro_batch": micro,
        "accumulation_steps": steps,
        "largest_fitting_micro_batch": largest,
        "estimated_peak_bytes": int(estimate_peak(section, micro, fit, accumulate=True)),
        "fits_without": False,
    }


def amp_comparison(section: Mapping[str, Any]) -> dict[str, Any] | None:
    """Activation bytes with FP32 vs low-precision activations, as the probe measured them."""
    for probe in reversed(section.get("probes") or []):
        fp32 = probe.get("fp32_points")
        low = probe.get("points")
        if probe.get("autocast_dtype") and fp32 and low:
            f32 = fit_linear(fp32)
            lp = fit_linear(low)
            b = max(int(x) for x, _ in low)
            f_at = dict((int(x), int(v)) for x, v in fp32)
            l_at = dict((int(x), int(v)) for x, v in low)
            if b in f_at and b in l_at:
                return {
                    "batch": b,
                    "dtype": probe["autocast_dtype"],
                    "fp32_bytes": f_at[b],
                    "low_precision_bytes": l_at[b],
                    "ratio": l_at[b] / f_at[b] if f_at[b] else None,
                    "fp32_per_sample_bytes": f32["per_sample_bytes"] if f32 else None,
                    "low_per_sample_bytes": lp["per_sample_bytes"] if lp else None,
                }
    return None


def whatif(section: Mapping[str, Any]) -> MemoryWhatIf:
    """Every estimate the section supports, as rows a table shows, plus the raw numbers."""
    state = section.get("model_state") or {}
    by_cat = (section.get("peak") or {}).get("by_category") or {}
    act_peak = int(by_cat.get("activations", 0))
    rows = _measured_rows(section, act_peak)
    cap, cap_source = capacity(section)
    out: MemoryWhatIf = {
        "model_state_bytes": model_state_bytes(section) if state else None,
        "activation_bytes_at_peak": act_peak,
        "capacity_bytes": cap,
        "capacity_source": cap_source,
    }
    fit = activation_fit(section)
    if fit is not None:
        out["activation_fit"] = fit
        rows += _fit_rows(section, fit)
    amp = amp_comparison(section)
    if amp is not None:
        out["amp"] = amp
        rows.append(_row(f"Activations in FP32 (batch {amp['batch']})", amp["fp32_bytes"],
                         "memory_probe without autocast"))  # fmt: skip
        rows.append(_row(f"Activations in {amp['dtype']} (batch {amp['batch']})",
                         amp["low_precision_bytes"], "memory_probe under autocast"))  # fmt: skip
    target = section.get("target_batch") or None
    if target and fit is not None and cap:
        plan = plan_accumulation(section, int(target), fit, cap)
        out["plan"] = plan
        if plan is not None:
            rows.append(
                _row(
                    f"Target batch {target}: micro-batch {plan['micro_batch']} x "
                    f"{plan['accumulation_steps']} accumulation steps",
                    plan["estimated_peak_bytes"],
                    f"largest that fits {HEADROOM:.0%} of {units.nbytes(cap)} ({cap_source})",
                )
            )
    out["rows"] = rows
    return out


def _row(scenario: str, nbytes: int | None, basis: str) -> WhatIfRow:
    """One row of the what-if table."""
    return {"scenario": scenario, "bytes": nbytes, "basis": basis}


def _measured_rows(section: Mapping[str, Any], act_peak: int) -> list[WhatIfRow]:
    """The rows measured as they are: model state, the peak, activations at their most."""
    state = section.get("model_state") or {}
    peak = section.get("peak") or {}
    # without a model state: a CUDA snapshot (blocks and stacks, no tensor known as a parameter)
    basis = (
        f"params {units.nbytes(state.get('parameters', 0))}, "
        f"grads {units.nbytes(state.get('gradients', 0))}, "
        f"optimizer {units.nbytes(state.get('optimizer_state', 0))} (live tensors)"
        if state
        else "not measured: this source does not say which tensors are model state"
    )
    model_state = model_state_bytes(section) if state else None
    rows = [_row("Model state: parameters + gradients + optimizer state", model_state, basis)]
    if peak.get("bytes"):
        rows.append(
            _row(
                f"Measured peak (batch {section.get('observed_batch') or '?'})",
                int(peak["bytes"]),
                f"activations {units.nbytes(act_peak)} at the peak",
            )
        )
    most = section.get("activation_peak") or {}
    if most.get("activations"):
        rows.append(
            _row(
                f"Activations at their most (batch {most.get('batch') or '?'})",
                int(most["activations"]),
                f"storages saved for the backward, live then; {units.nbytes(most['bytes'])} in all",
            )
        )
    return rows


def _fit_rows(section: Mapping[str, Any], fit: Mapping[str, Any]) -> list[WhatIfRow]:
    """The per-sample activations, and the peak they predict at 2x and 4x the batch."""
    rows = [
        _row(
            "Activations per sample",
            int(fit["per_sample_bytes"]),
            f"fitted to {len(fit['points'])} measurements ({fit['source']})",
        )
    ]
    observed = int(section.get("observed_batch") or 0)
    for mult in (2, 4) if observed else ():
        b = observed * mult
        rows.append(
            _row(
                f"Peak at batch {b}",
                int(estimate_peak(section, b, fit)),
                "measured peak + per-sample activations",
            )
        )
    return rows


@part("memory")
def derived_whatif(session: Session) -> MemoryWhatIf | None:
    """The memory what-if estimates (derived part)."""
    memory = session.section("memory")
    return whatif(memory) if memory else None
