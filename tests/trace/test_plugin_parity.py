"""Traces read as the TensorBoard profiler plugin's own tests read them.

The plugin (torch-tb-profiler, removed from pytorch/kineto; last tree at commit
041e7ce99f1562dd81232ee58b7c454ef16bfae2, ``tb_plugin/test/test_profiler.py``, BSD licence) fed
small hand-written traces and asserted its numbers. The traces below are written here in its
style (legacy categories ``Operator``/``Kernel``/``Runtime``/``Memcpy``, kernels with no
``stream`` arg); every expected number is counted by hand from the events listed, in the comment
beside it. The two ResNet-50 samples (``tb_plugin/samples/``) are checked against the plugin's
end-to-end expectations (``tb_plugin/test/result_check_file.txt``) in
``test_plugin_samples.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ampdiag.analysis.timeline import analyze_rank
from ampdiag.trace.reader import read_trace
from tests.trace.conftest import write_trace


def op(name: str, ts: float, dur: float, tid: Any = "123", cat: str = "Operator") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 13721, "tid": tid, "ts": ts, "dur": dur}


def runtime(name: str, ts: float, dur: float, corr: int) -> dict[str, Any]:
    return {
        **op(name, ts, dur, cat="Runtime"),
        "args": {"correlation": corr},
    }


def device(cat: str, name: str, ts: float, dur: float, corr: int) -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": 0,
        "tid": "stream 7",
        "ts": ts,
        "dur": dur,
        "args": {"correlation": corr, "device": 0},
    }


KERNEL = "void cunn_ClassNLLCriterion_updateGradInput_kernel<float>"


def overlap_trace() -> list[dict[str, Any]]:
    """The plugin's ``test_multiple_profilersteps_with_overlap``, in its own numbers.

    A kernel at 150-240 us whose launch is not in the trace (launched before the profiler
    started); a memcpy at 280-380 launched at 250 (step 1, 100-300); a kernel at 410-610
    launched at 400 (step 2, 350-500).
    """
    return [
        op("ProfilerStep#1", 100, 200),
        op("aten::to", 200, 60),
        op("ProfilerStep#2", 350, 150),
        op("aten::mm", 360, 50),
        device("Kernel", KERNEL, 150, 90, 123),
        device("Memcpy", "Memcpy HtoD (Pageable -> Device)", 280, 100, 334),
        runtime("cudaMemcpyAsync", 250, 5, 334),
        device("Kernel", KERNEL, 410, 200, 40348),
        runtime("cudaLaunchKernel", 400, 5, 40348),
    ]


def analyze(tmp_path: Path, events: list[dict[str, Any]]) -> dict[str, Any]:
    return analyze_rank(read_trace(write_trace(tmp_path / "t.json", events)))


def test_unlaunched_work_belongs_to_no_step_in_rows_and_totals(tmp_path):
    r = analyze(tmp_path, overlap_trace())
    rows = {s["step"]: s for s in r["steps"]}
    # step 1 launched only the memcpy (100 us): the 90 us kernel launched earlier is in no step
    assert rows[1]["kernels"] == 1
    assert rows[1]["busy_us"] == 100 and rows[1]["compute_us"] == 0
    # step 2 launched the 200 us kernel
    assert rows[2]["kernels"] == 1 and rows[2]["compute_us"] == 200
    # the totals over steps (HTA's window: launched before the last step) hold the memcpy alone
    assert r["activities_in_window"] == 1 and r["busy_us"] == 100
    # the same rule in both: no step's row and no windowed total holds the unlaunched kernel
    assert sum(s["busy_us"] for s in r["steps"]) == 100 + 200
    assert r["top_kernels_cover"]["unlaunched"] == 1
    assert "belongs to no step" in r["attribution"]


def test_kernel_table_covers_every_step(tmp_path):
    r = analyze(tmp_path, overlap_trace())
    table = {k["name"]: k for k in r["top_kernels"]}
    # the kernel of the last step (200 us) and the one launched before the trace (90 us)
    assert table[KERNEL]["calls"] == 2 and table[KERNEL]["total_us"] == 290
    assert r["top_kernels_cover"]["steps"] == [1, 2]
    assert r["top_kernels_cover"]["activities"] == 3


def test_plugin_step_time_is_stretched_to_the_gpu_work(tmp_path):
    r = analyze(tmp_path, overlap_trace())
    plugin = {s["step"]: s["plugin_step_us"] for s in r["plugin_steps"]}
    host = {s["step"]: s["total_us"] for s in r["host"]["steps"]}
    # the plugin's: step 1 starts after the unlaunched kernel (240) and ends with its memcpy
    # (380); step 2 starts there and ends with its kernel (610)
    assert plugin == {1: 380 - 240, 2: 610 - 380}
    # ampdiag's: the ProfilerStep spans
    assert host == {1: 200, 2: 150}
    assert set(r["definitions"]) == {"step_us", "plugin_step_us", "data_us", "plugin_data_us"}


def test_last_steps_without_kernels_leave_the_plugin_view(tmp_path):
    # the plugin's test_last_steps_no_kernel: steps 2 and 3 launch nothing
    events = [
        op("ProfilerStep#1", 100, 200),
        op("aten::to", 120, 10),
        op("ProfilerStep#2", 300, 100),
        op("ProfilerStep#3", 400, 50),
        device("Kernel", KERNEL, 90, 20, 123),
        runtime("cudaMemcpyAsync", 125, 5, 334),
        device("Kernel", KERNEL, 150, 180, 334),
    ]
    r = analyze(tmp_path, events)
    # one step left: from the end of the unlaunched kernel (110) to the end of step 1's (330)
    assert [(s["step"], s["plugin_step_us"]) for s in r["plugin_steps"]] == [(1, 330 - 110)]
    assert len(r["host"]["steps"]) == 3  # ampdiag keeps every step


def test_nested_same_name_ops_are_one_call(tmp_path):
    # the plugin's test_remove_dup_nodes: aten::mm in aten::mm in aten::mm, each the only child
    events = [
        op("aten::mm", 100, 100, tid="456"),
        op("aten::mm", 110, 80, tid="456"),
        op("aten::mm", 120, 60, tid="456"),
        runtime("cudaLaunchKernel", 130, 20, 335),
        device("Kernel", "void gemmSN_TN_kernel_64addr", 220, 8, 335),
    ]
    rt = read_trace(write_trace(tmp_path / "t.json", events))
    assert rt.cpu_ops == {"aten::mm": [1, 100.0]}  # one call, timed by the outer event


def test_same_name_ops_that_are_not_only_children_stay_calls(tmp_path):
    events = [
        # two aten::add inside one aten::add: not torch's duplicate, three calls
        op("aten::add", 100, 100),
        op("aten::add", 110, 20),
        op("aten::add", 140, 20),
        # the same name on another thread at the same time: two calls
        op("aten::mm", 300, 50, tid="1"),
        op("aten::mm", 310, 20, tid="2"),
    ]
    rt = read_trace(write_trace(tmp_path / "t.json", events))
    assert rt.cpu_ops == {"aten::add": [3, 140.0], "aten::mm": [2, 70.0]}


def test_datapipe_is_data_loading(tmp_path):
    # the plugin's test_datapipe, inside a step
    events = [
        op("ProfilerStep#1", 0, 200, cat="cpu_op"),
        op("enumerate(DataPipe)#ShufflerIterDataPipe", 100, 23, cat="cpu_op"),
        op("aten::add", 150, 10, cat="cpu_op"),
    ]
    r = analyze(tmp_path, events)
    (row,) = r["host"]["steps"]
    assert row["data_us"] == 23 and row["forward_us"] == 10
    assert [o["name"] for o in r["cpu_top_ops"]] == ["aten::add"]  # not an op (the plugin's)
    # no GPU work: the plugin's data loading is all of it
    assert r["plugin_steps"] == [{"step": 1, "plugin_step_us": 200, "plugin_data_us": 23}]


@pytest.mark.parametrize("hidden", [True, False])
def test_plugin_data_loading_is_what_gpu_work_does_not_hide(tmp_path, hidden):
    events = [
        op("ProfilerStep#1", 0, 1000),
        op("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", 100, 300),
        runtime("cudaLaunchKernel", 10, 5, 1),
        # a kernel running 50-350 hides 100-350 of the 100-400 wait; none hides none of it
        device("Kernel", KERNEL, 50, 300 if hidden else 1, 1),
    ]
    r = analyze(tmp_path, events)
    ((host,), (plugin,)) = r["host"]["steps"], r["plugin_steps"]
    assert host["data_us"] == 300
    assert plugin["plugin_data_us"] == (400 - 350 if hidden else 300)
