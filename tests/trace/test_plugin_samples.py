"""The TensorBoard profiler plugin's two ResNet-50 samples, against the plugin's own answers.

Fixtures: ``tests/data/traces/tb_plugin_samples/`` (see the README there), the first trace of
each of ``tb_plugin/samples/resnet50_num_workers_{0,4}`` at pytorch/kineto commit
041e7ce99f1562dd81232ee58b7c454ef16bfae2, trimmed to the events either tool reads for these
figures. Expected figures: the plugin's end-to-end expectations on the same traces
(``tb_plugin/test/result_check_file.txt`` at that commit, the overview's per-step rows: step,
Kernel, Memcpy, Memset, DataLoader, and the total in its tooltip), and direct counts of the JSON.
"""

from __future__ import annotations

import gzip
import json

import pytest

from ampdiag.analysis.timeline import analyze_rank
from ampdiag.trace.reader import read_trace
from tests.trace.conftest import FIXTURES

SAMPLES = FIXTURES / "tb_plugin_samples"

# (step, Kernel, Memcpy, Memset, DataLoader, Total) as the plugin reported them
PLUGIN = {
    "resnet50_num_workers_0": [
        (5, 98598, 1941, 90, 69317, 187948),
        (6, 98570, 1947, 89, 57669, 175153),
        (7, 98596, 1931, 91, 61257, 179733),
        (8, 98623, 1938, 89, 56453, 174564),
        (9, 98504, 1937, 87, 62690, 182172),
        (10, 98641, 1798, 88, 48185, 165983),
    ],
    "resnet50_num_workers_4": [
        (5, 99778, 3606, 98, 4341, 182306),
        (6, 99208, 2948, 98, 0, 126183),
        (7, 99114, 2949, 98, 6, 127181),
        (8, 99021, 2975, 97, 0, 123079),
        (9, 98791, 3596, 97, 1370, 163461),
        (10, 98956, 2885, 98, 1400, 124198),
    ],
}


@pytest.fixture(scope="module", params=sorted(PLUGIN))
def sample(request):
    path = SAMPLES / f"{request.param}.pt.trace.json.gz"
    return request.param, path, analyze_rank(read_trace(path))


def test_gpu_time_per_step_is_the_plugins(sample):
    name, _, r = sample
    rows = {s["step"]: s for s in r["steps"]}
    for step, kernel, memcpy, memset, _, _ in PLUGIN[name]:
        # the plugin's kernel time is its computation here (no communication in these runs)
        assert round(rows[step]["compute_us"]) == kernel, (name, step)
        assert round(rows[step]["busy_us"]) == kernel + memcpy + memset, (name, step)


def test_plugin_definitions_are_the_plugins_numbers(sample):
    name, _, r = sample
    got = [
        (p["step"], round(p["plugin_step_us"]), round(p["plugin_data_us"]))
        for p in r["plugin_steps"]
    ]
    assert got == [(s, total, data) for s, _, _, _, data, total in PLUGIN[name]]


def test_ampdiag_definitions_are_the_host_spans(sample):
    _, path, r = sample
    doc = json.loads(gzip.decompress(path.read_bytes()))
    spans = {
        int(e["name"].split("#")[1]): e["dur"]
        for e in doc["traceEvents"]
        if e.get("name", "").startswith("ProfilerStep#")
    }
    assert {s["step"]: s["total_us"] for s in r["host"]["steps"]} == spans
    # the headline keeps ampdiag's: the median step of the host spans
    assert len(r["host"]["steps"]) == len(spans) == 6


def test_kernel_table_counts_every_step(sample):
    _, path, r = sample
    doc = json.loads(gzip.decompress(path.read_bytes()))
    top = r["top_kernels"][0]
    mine = [e for e in doc["traceEvents"] if e.get("cat") == "Kernel" and e["name"] == top["name"]]
    assert top["calls"] == len(mine)
    assert top["total_us"] == pytest.approx(sum(e["dur"] for e in mine))
    assert r["top_kernels_cover"]["steps"] == [5, 6, 7, 8, 9, 10]
