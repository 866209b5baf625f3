"""Which precision each finding tells the user to train in, read from its fix's code and words.

Independent of how the rules decide: it reads only what the user reads. A finding advises
``fp32`` when its fix turns autocast off (``enabled=False`` / ``enabled=use_amp``) or says
"train in FP32"; ``bf16`` / ``fp16`` when it enters ``torch.autocast(..., dtype=torch.bfloat16 /
float16)`` or says "train in BF16 / FP16". Two findings contradict each other when the sets of
precisions they advise do not meet.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

_WORDS = re.compile(r"\btrain (?:it )?in (fp32|float32|bf16|bfloat16|fp16|float16)\b", re.I)
_CANON = {"fp32": "fp32", "float32": "fp32", "bf16": "bf16", "bfloat16": "bf16",
          "fp16": "fp16", "float16": "fp16"}  # fmt: skip


def advised(fix: str) -> set[str]:
    """The precisions a fix tells the user to train in (empty: it advises none).

    A fix that is a measurement ("Measure whether FP16 caused it: run the same steps in FP32
    and see ...", a diverged run whose cause is unknown) tells the user to run a test in FP32,
    not to train in it.
    """
    out: set[str] = set()
    if fix.startswith("Measure whether"):
        return out
    lines = fix.splitlines()
    for i, line in enumerate(lines):
        # an autocast region around the model's forward is the training's precision; one
        # around a single module (``y = module(x.float())``) is a local fix inside it
        around_model = "model(" in (lines[i + 1] if i + 1 < len(lines) else "")
        if "torch.autocast(" in line and (around_model or "enabled=use_amp" in line):
            if "enabled=False" in line or "enabled=use_amp" in line:
                out.add("fp32")
            elif "dtype=torch.bfloat16" in line:
                out.add("bf16")
            elif "dtype=torch.float16" in line:
                out.add("fp16")
        if "GradScaler(" in line:
            out.add("fp16")
        out.update(_CANON[m.lower()] for m in _WORDS.findall(line))
    return out


def _fields(finding: Any) -> tuple[str, str]:
    if isinstance(finding, Mapping):
        return str(finding.get("id")), str(finding.get("fix") or "")
    return str(finding.id), str(finding.fix or "")


def contradictions(findings: Iterable[Any]) -> list[str]:
    """Pairs of findings (objects or their JSON) whose advised precisions do not meet."""
    seen = [(fid, advised(fix)) for fid, fix in map(_fields, findings)]
    seen = [(fid, s) for fid, s in seen if s]
    return [
        f"{a} advises {sorted(sa)} but {b} advises {sorted(sb)}"
        for i, (a, sa) in enumerate(seen)
        for b, sb in seen[i + 1 :]
        if not sa & sb
    ]


def native_bf16_cpu() -> bool:
    """This CPU's own flags: BF16 runs natively with AVX512_BF16 or AMX, emulated without.

    Which precision advice fits a CPU run depends on it: where BF16 is emulated (slower than
    FP32), FP32 is the precision to keep.
    """
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return False
    return bool(flags & {"avx512_bf16", "amx_bf16"})
