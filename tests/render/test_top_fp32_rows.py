"""The "Top FP32 ops" table lists each (op, module, reason, phase) once.

An op heavy in both FLOPs and time is in both of the summary's top lists; the table used to
print the two lists one after the other, so such an op had two identical rows.
"""

from __future__ import annotations

import re
from typing import Any

from ampdiag.analysis.derive import derive
from ampdiag.analysis.precision import summarize
from ampdiag.render.sections import precision
from ampdiag.session import Session


def _fp32(
    op: str, module: str, flops: int, time_us: float, phase: str = "forward"
) -> dict[str, Any]:
    return {
        "phase": phase,
        "module": module,
        "op": op,
        "autocast": True,
        "precision": "fp32",
        "reason": "promotion",
        "cast_origin": None,
        "count": 1,
        "flops": flops,
        "time_us": time_us,
        "cast_bytes": 0,
        "in_dtypes": ["float32"],
        "out_dtypes": ["float32"],
    }


def test_each_fp32_op_is_one_row() -> None:
    rows = [
        _fp32("addmm", "head", 1000, 40.0),  # top by FLOPs and by time
        _fp32("mm", "head", 800, 30.0, phase="backward"),  # the same module, another phase
        _fp32("native_layer_norm", "ln", 0, 10.0),  # time only
    ]
    sec = {"audited": True, "step": 1, "device_type": "cpu", "ops": rows}
    s = summarize(sec)
    assert len(s["top_fp32_by_flops"]) == 2 and len(s["top_fp32_by_time"]) == 3
    keys = [(o["op"], o["module"], o["reason"], o["phase"]) for o in s["top_fp32"]]
    assert sorted(keys) == sorted(set(keys)) and len(keys) == 3
    session = Session(sections={"precision": sec})
    derive(session)  # the summary the section formats
    built = precision.build(session)
    assert built is not None
    table = built.html.split("<h3>Top FP32 ops</h3>", 1)[1].split("</table>", 1)[0]
    body_rows = re.findall(
        r"<tr><td><code>([^<]+)</code></td><td><code>([^<]+)</code></td><td>(\w+)</td>", table
    )
    assert sorted(body_rows) == sorted(
        [
            ("addmm", "head", "forward"),
            ("mm", "head", "backward"),
            ("native_layer_norm", "ln", "forward"),
        ]
    )
