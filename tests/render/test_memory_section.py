"""The memory section renders offline from a saved session (figures as data URIs)."""

from pathlib import Path

from ampdiag.analysis.derive import derive
from ampdiag.render.sections import memory as memory_section
from ampdiag.session import Session


def section() -> dict:
    return {
        "model_state": {
            "parameters": 1000,
            "gradients": 1000,
            "optimizer_state": 2000,
            "optimizer_state_by_key": {"exp_avg": 1000, "exp_avg_sq": 1000},
        },
        "peak": {
            "bytes": 9000,
            "by_category": {
                "parameters": 1000,
                "optimizer_state": 2000,
                "gradients": 1000,
                "activations": 5000,
            },
            "step": "ProfilerStep#2",
        },
        "timeline": {
            "t_ms": [0, 1, 2],
            "bytes": {"parameters": [1000] * 3, "activations": [0, 5000, 0]},
            "steps": [],
            "source": "torch-memory-profiler",
        },
        "probes": [
            {
                "points": [[2, 300], [4, 500]],
                "fp32_points": [[2, 500], [4, 900]],
                "autocast_dtype": "bfloat16",
            }
        ],
        "observed_batch": 4,
        "target_batch": 64,
        "capacity_bytes": 20_000,
        "capacity_source": "<b>host</b>",
    }


def test_memory_section_figures_and_whatif(tmp_path: Path) -> None:
    session = Session(sections={"memory": section()})
    derive(session)  # the what-if table is the derive step's; the section only formats it
    built = memory_section.build(session)
    assert built is not None
    assert set(built.figures) == {"memory-timeline", "memory-peak"}
    html = str(built.html)
    assert html.count('<figure class="figure"') == 2 and html.count("<svg ") == 2
    assert "What if" in html and "Activations per sample" in html
    assert "accumulation steps" in html and "Activations in bfloat16" in html
    assert "<b>host</b>" not in html and "&lt;b&gt;host&lt;/b&gt;" in html
    assert "http" not in html.replace("https://pytorch.org/memory_viz", "")


def test_no_memory_section_no_output() -> None:
    assert memory_section.build(Session()) is None
