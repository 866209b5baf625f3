import json
import subprocess
import sys

import pytest

from ampdiag.analysis import analyze
from ampdiag.cli import main
from ampdiag.sources.traces import session_from_traces
from tests.trace.conftest import REPO, kernel, launch, step, write_trace


def _user_annotation(name, ts, dur):
    return {
        "ph": "X",
        "cat": "user_annotation",
        "name": name,
        "pid": 10,
        "tid": 10,
        "ts": ts,
        "dur": dur,
    }


def launch_bound_trace(tmp_path):
    """100 kernels of 2 us, each launched 18 us after the previous ended: the GPU waits."""
    ev = [step(1, 0, 2100), step(2, 2100, 100)]
    t = 10.0
    for i in range(100):
        ev.append(launch(t, i))
        ev.append(
            kernel(t + 5, 2, "void at::native::vectorized_elementwise_kernel<4, add<float>>", i)
        )
        t += 20
    return write_trace(tmp_path / "rank0.json", ev, distributedInfo={"rank": 0, "world_size": 1})


def test_launch_bound_trace_findings(tmp_path):
    session = session_from_traces(launch_bound_trace(tmp_path))
    r = session.section("timeline")["ranks"][0]
    # direct count: span from 15 to 15 + 99*20 + 2; busy 100 * 2
    assert r["span_us"] == 99 * 20 + 2
    assert r["compute_us"] == 200 and r["idle_us"] == r["span_us"] - 200
    # each 18 us gap: launch came 13 us after the previous kernel ended, then 5 us of latency
    assert r["idle_breakdown"] == {"host_wait_us": 99 * 13, "kernel_wait_us": 99 * 5, "other_us": 0}
    assert r["launch_latency"]["median_us"] == 5
    session.findings = analyze(session)
    ids = {f.id: f for f in session.all_findings()}
    assert {"gpu-idle", "launch-bound"} <= set(ids)
    assert ids["gpu-idle"].evidence["idle_share"] == pytest.approx(r["idle_share"], abs=1e-4)
    assert ids["gpu-idle"].severity == "high"
    assert "fp32-kernels-dominant" not in ids  # elementwise kernels are not GEMMs


def test_fp32_and_comm_findings(tmp_path):
    ev = []
    for i in range(10):
        t = i * 100.0
        ev += [launch(t, 2 * i), kernel(t + 1, 50, "volta_sgemm_128x64_nn", 2 * i)]
        ev += [
            launch(t, 2 * i + 1),
            kernel(t + 51, 40, "ncclKernel_AllReduce_RING_LL_Sum_float", 2 * i + 1, stream=20),
        ]
    session = session_from_traces(write_trace(tmp_path / "t.json.gz", ev))
    r = session.section("timeline")["ranks"][0]
    assert r["precision"]["fp32_matmul_share"] == 1.0
    assert r["communication"]["overlap_share"] == 0.0
    assert r["communication"]["comm_us"] == 400
    session.findings = analyze(session)
    ids = {f.id: f for f in session.all_findings()}
    assert ids["fp32-kernels-dominant"].severity == "high"
    assert ids["comm-not-overlapped"].evidence["exposed_us"] == 400


def test_dataloader_bound_from_trace_ranks(tmp_path):
    ev = []
    for n in range(3):
        t = n * 1000.0
        ev += [step(n, t, 1000), _user_annotation("enumerate(DataLoader)#_Iter.__next__", t, 400)]
    session = session_from_traces(write_trace(tmp_path / "cpu.json", ev))
    # a session where only the timeline knows: drop the profiler section
    del session.sections["profiler"]
    session.findings = analyze(session)
    found = [f for f in session.all_findings() if f.id == "dataloader-bound"]
    assert found and found[0].evidence["data_share"] == pytest.approx(0.4)
    assert found[0].severity == "high"


def test_cli_json_has_per_rank_breakdown(traces, capsys):
    assert main(["report", str(traces / "trace_filter"), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    ranks = doc["timeline"]["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        assert r["idle_us"] + r["compute_us"] + r["non_compute_us"] == pytest.approx(r["span_us"])
    assert doc["timeline"]["summary"]["slowest_rank"] == 1  # 135.5 ms of compute vs 106.3 ms


def test_cpu_only_trace_reports_cpu_side(traces, capsys, tmp_path):
    path = traces / "rank_non_gpu"
    assert main(["report", str(path), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    r = doc["timeline"]["ranks"][0]
    assert not r["has_gpu"] and r["cpu_top_ops"]
    assert any("no GPU kernels" in w for w in doc["timeline"]["warnings"])
    assert main(["report", str(path), "--out", str(tmp_path / "r")]) == 0
    html = (tmp_path / "r" / "report.html").read_text()
    assert "CPU side only" in html


def test_html_escapes_kernel_names(tmp_path):
    evil = "<script>alert(1)</script>_sgemm"
    ev = [launch(0, 1), kernel(1, 5, evil, 1)]
    trace = write_trace(tmp_path / "x.json", ev)
    assert main(["report", str(trace), "--out", str(tmp_path / "out")]) == 0
    html = (tmp_path / "out" / "report.html").read_text()
    assert 'id="timeline"' in html or "GPU timeline" in html
    assert "<script>alert" not in html and "&lt;script&gt;" in html


@pytest.mark.parametrize(
    "make",
    [
        lambda d: d / "missing.json",
        lambda d: (d / "cut.json.gz").write_bytes(b"\x1f\x8b\x08\x00garbage") and d / "cut.json.gz",
        lambda d: (d / "bad.json").write_text("{]") and d / "bad.json",
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path, make):
    path = make(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "ampdiag", "report", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("ampdiag: ")


def test_hta_option_includes_htas_analyses(traces, capsys):
    pytest.importorskip("hta")
    assert main(["report", str(traces / "trace_filter"), "--format", "json", "--hta"]) == 0
    hta = json.loads(capsys.readouterr().out)["timeline"]["hta"]
    assert hta["temporal_breakdown"]["ok"]
    assert {"cuda_kernel_launch_stats", "queue_length_summary", "critical_path"} <= set(hta)
    rows = hta["temporal_breakdown"]["rows"]
    assert rows[0]["idle_time(us)"] == 321378.0
