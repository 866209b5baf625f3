"""What the run computes in: one answer (``derived.compute``) every rule and report reads.

``precision`` is the lowest of what the run recorded: the autocast state its forwards ran
under (``run.autocast_seen``; a merged distributed session keeps only its environment's), its
parameters' dtypes (``model.half()`` computes in FP16 with no autocast), an FSDP2
``MixedPrecisionPolicy``'s ``param_dtype`` (FSDP2 casts the parameters itself, with no
autocast), and what the sentinel's replay saw live (``sentinel.replay.run_precision``). FP16
ranks before BF16: its range is the one that fails. ``autocast`` is apart: the low-precision
autocast the run entered ("cpu:bfloat16"), which a fix that keeps the user's loop writes back
and the precision A/B timed as the run's own; None where the run entered none (FP16
parameters alone, an FSDP2 policy, FP32).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ampdiag.analysis.derive import part
from ampdiag.schema import Compute
from ampdiag.session import Session

#: Each dtype's precision name, and back.
NAMES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
DTYPES = {name: dtype for dtype, name in NAMES.items()}


def precision_of(dtypes: Iterable[object]) -> str:
    """The lowest precision among dtype names ("cpu:float16", "torch.bfloat16", "float32").

    "fp16" before "bf16", else "fp32". Torch-free: the live replay (`divergence_replay`)
    names its tensors' dtypes, the analysis the recorded ones.
    """
    names = {re.split(r"[:.]", str(d))[-1] for d in dtypes}
    return "fp16" if "float16" in names else "bf16" if "bfloat16" in names else "fp32"


def autocast_precision(autocast: object) -> str | None:
    """The precision name of an autocast state such as "cuda:bfloat16" (None: none known)."""
    return NAMES.get(autocast.rpartition(":")[2]) if isinstance(autocast, str) else None


@part("compute")
def derived_compute(session: Session) -> Compute:
    """What the run computes in, and the autocast it entered (derived part; module doc)."""
    run, env = session.section("run"), session.environment
    seen: dict[str, int] = dict(run.get("autocast_seen") or env.get("autocast_seen") or {})
    low = {k: v for k, v in seen.items() if k != "none"}
    autocast = env.get("autocast") or (max(low, key=low.__getitem__) if low else None)
    models = [m for m in run.get("models") or [] if isinstance(m, dict)]
    dtypes = [d for m in models for d in m.get("param_dtypes") or []]
    dtypes += [
        str(p.get("param_dtype"))
        for m in models
        for p in m.get("fsdp_mixed_precision") or []
        if isinstance(p, dict)
    ]
    if session.section("scaler").get("fp16_params"):
        dtypes.append("float16")
    replayed = (session.section("sentinel").get("replay") or {}).get("run_precision")
    return {
        "precision": precision_of([*low, autocast, *dtypes, DTYPES.get(str(replayed))]),
        "autocast": str(autocast) if autocast else None,
        "autocast_precision": autocast_precision(autocast),
    }


def computes_in(session: Session) -> Compute:
    """``derived.compute`` as the derive step stored it (derived now on a session not analysed)."""
    stored = session.section("derived").get("compute")
    return stored if stored else derived_compute(session)
