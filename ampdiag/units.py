"""Numbers as people read them, the same in findings, the HTML report, console and TensorBoard.

Bytes in binary units (134179704 -> "128 MiB"), FLOPs in decimal ones ("318.9 MFLOP"), times
in the unit that fits ("3.83 s", "12.5 ms", "840 µs"), fractions as percentages, counts with
thousands separators. A missing value is "not measured", never ``None``. An evidence value is
formatted by its key's suffix (``*_bytes``, ``*_us``, ``*_ms``, ``*_s``, ``*_fraction``,
``*_share``, ``*flops``), since a finding's evidence is a flat mapping of measured numbers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

NOT_MEASURED = "not measured"


def number(value: Any, finite: bool = False) -> float | None:
    """A value as a float, or None where it is no number (None, text, a bool).

    The one "is this a number" check of the package: a loaded session holds NaN and inf as the
    floats they were, like a live one. ``finite``: None for NaN and inf too.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    v = float(value)
    return None if finite and not math.isfinite(v) else v


def ints(values: Any) -> list[int]:
    """The int items of a stored list of steps (none when it is not a list)."""
    return [int(v) for v in values if isinstance(v, int)] if isinstance(values, list) else []


def _not_finite(value: Any) -> str | None:
    """What a value that is not a finite number reads as; None for a finite number.

    Every formatter starts here, so ``None``, NaN, infinities and text read the same in all.
    """
    v = number(value)
    if v is None:
        return NOT_MEASURED if value is None else str(value)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return None


def _scaled(v: float, units: tuple[str, ...], base: float) -> str:
    """``v`` in the first unit that keeps it below ``base`` (the last takes any size).

    Whole in the first unit (bytes, FLOPs are counted), one decimal in the others.
    """
    i = 0
    while abs(v) >= base and i < len(units) - 1:
        v /= base
        i += 1
    return f"{v:.0f} {units[0]}" if i == 0 else f"{v:.1f} {units[i]}"


def count(value: Any) -> str:
    """An integer with thousands separators; other numbers to 4 significant digits.

    Never in scientific notation, which people misread: an exact power of two below 1/1000 (a
    loss scale) as ``2^-22``, other small values positionally (``0.000000238``).
    """
    text = _not_finite(value)
    if text is not None:
        return text
    v = float(value)
    if v.is_integer() and abs(v) < 1e18:
        return f"{int(v):,}"
    a = abs(v)
    if a >= 1e4:  # .4g would write 1.285e+04
        return f"{v:,.0f}"
    if a < 1e-3:
        mantissa, exponent = math.frexp(a)
        if mantissa == 0.5:
            return ("-" if v < 0 else "") + f"2^{exponent - 1}"
        digits = 3 - math.floor(math.log10(a)) - 1
        return f"{v:.{digits}f}".rstrip("0")
    return f"{v:.4g}"


def nbytes(value: Any) -> str:
    """Bytes in B, KiB, MiB, GiB or TiB."""
    text = _not_finite(value)
    if text is not None:
        return text
    v = float(value)
    return _scaled(v, ("B", "KiB", "MiB", "GiB", "TiB"), 1024)


def flops(value: Any) -> str:
    """FLOPs in FLOP, kFLOP, MFLOP, GFLOP, TFLOP or PFLOP."""
    text = _not_finite(value)
    if text is not None:
        return text
    v = float(value)
    return _scaled(v, ("FLOP", "kFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP"), 1000)


def micros(value: Any) -> str:
    """A time given in microseconds, in µs, ms, s, min or h."""
    text = _not_finite(value)
    if text is not None:
        return text
    v = float(value)
    a = abs(v)
    if a >= 3600e6:
        return f"{v / 3600e6:.2f} h"
    if a >= 60e6:
        return f"{v / 60e6:.1f} min"
    if a >= 1e6:
        return f"{v / 1e6:.2f} s"
    if a >= 1e3:
        return f"{v / 1e3:.2f} ms"
    return f"{v:.1f} µs"


def percent(value: Any) -> str:
    """A fraction (0..1) as a percentage with one decimal."""
    text = _not_finite(value)
    return text if text is not None else f"{float(value) * 100:.1f}%"


def scalar(value: Any) -> str:
    """A number without a known unit: integers separated, others to 4 significant digits."""
    if value is None:
        return NOT_MEASURED
    if isinstance(value, bool):
        return "yes" if value else "no"
    return count(value) if number(value) is not None else str(value)


#: Words a key is made of that read better otherwise (acronyms, abbreviations).
_WORDS = {
    "fp8": "FP8", "fp16": "FP16", "bf16": "BF16", "fp32": "FP32", "tf32": "TF32",
    "gpu": "GPU", "cpu": "CPU", "cuda": "CUDA", "sqnr": "SQNR", "db": "dB", "nan": "NaN",
    "inf": "inf", "amp": "AMP", "nccl": "NCCL", "rel": "relative", "diff": "difference",
    "num": "number of", "grad": "gradient", "grads": "gradients", "init": "initial",
    "max": "max", "min": "min", "log2": "log2", "vs": "vs", "id": "id", "hta": "HTA",
}  # fmt: skip
#: Key suffixes the formatted value already states (the unit is in the value: "3.83 s").
_UNIT_SUFFIXES = ("_bytes", "_us", "_ms", "_s", "_seconds", "_fraction")
_TIME_WORDS = ("time", "times", "wait", "duration", "spread", "budget", "spent")


#: Keys whose words alone would mislead beside a value of this kind: a precision advice's
#: ``measured: false`` says the precision A/B did not decide it, not that nothing was measured
#: (its title may well cite the speed probe's measured figure).
_KEY_LABELS: dict[tuple[str, type], str] = {
    ("measured", bool): "Decided by the precision A/B",
    ("not_measured", str): "Why the A/B did not decide",
}


def label(key: str, value: Any = None) -> str:
    """An evidence key in words, for a person: ``data_share_spread`` -> "Data share spread".

    A unit suffix is dropped where the formatted value states the unit: ``peak_bytes`` ->
    "Peak memory" ("3.0 MiB"), ``step_ms`` -> "Step time" ("3.83 s"). ``value``, where given,
    picks the label of a key whose meaning depends on it (`_KEY_LABELS`).
    """
    special = _KEY_LABELS.get((str(key), type(value)))
    if special is not None:
        return special
    k = str(key)
    noun = ""
    for suffix in _UNIT_SUFFIXES:
        if k.endswith(suffix) and len(k) > len(suffix):
            k = k[: -len(suffix)]
            if suffix == "_bytes" and not k.endswith(("memory", "size")):
                noun = " memory"
            elif suffix not in ("_bytes", "_fraction") and not k.endswith(_TIME_WORDS):
                noun = " time"
            break
    words = [_WORDS.get(w.lower(), w) for w in k.replace("-", "_").split("_") if w]
    text = (" ".join(words) + noun) if words else str(key)
    return text[:1].upper() + text[1:]


def by_key(key: str, value: Any) -> str:
    """A measured value formatted by what its key says it is."""
    if value is None:
        return NOT_MEASURED
    if isinstance(value, Mapping):
        return (
            "; ".join(f"{label(str(k))}: {by_key(str(k), v)}" for k, v in value.items()) or "none"
        )
    if isinstance(value, (list, tuple)):
        if not value:
            return "none"
        return ", ".join(by_key(key, v) for v in value)
    if number(value) is None:
        return scalar(value)
    k = key.lower()
    if k.endswith("bytes") or k.endswith("_b"):
        return nbytes(value)
    if k.endswith(("fraction", "share")):  # "fp32_flops_share" is a share, not FLOPs
        return percent(value)
    if "flop" in k:
        return flops(value)
    if k.endswith("_us"):
        return micros(value)
    if k.endswith("_ms"):
        return micros(float(value) * 1e3)
    if k.endswith("_s") or k.endswith("_seconds"):
        return micros(float(value) * 1e6)
    if k.endswith(("fraction", "share")):
        return percent(value)
    return scalar(value)


def gpu(environment: Mapping[str, Any]) -> str:
    """A session's GPU as findings and headers name it: ``"Quadro GP100 (sm_60)"``.

    The architecture from ``device_capability`` ("6.0" -> sm_60), where recorded.
    """
    name = str(environment.get("device_name") or "the GPU")
    major, dot, minor = str(environment.get("device_capability") or "").partition(".")
    if dot and major.isdigit() and minor.isdigit():
        return f"{name} (sm_{int(major)}{int(minor)})"
    return name
