"""The reader's self times per op (`RankTrace.cpu_self`) against torch's ``key_averages()``.

The same profile, exported as a Chrome trace and read back, must give every CPU op the self
time, calls and inclusive time torch's own tool computes from its event tree; the live
profiler's top-ops table of a CPU run is built from them (`host_top_ops`).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.profiler import profile

from ampdiag.sources.live.collectors.profiler import host_top_ops
from ampdiag.trace.reader import read_trace


def test_self_calls_and_total_times_match_key_averages(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with profile(profile_memory=True, record_shapes=True) as prof:
        for _ in range(3):
            with torch.profiler.record_function("user::step"):
                model(torch.randn(16, 32)).sum().backward()
                opt.step()  # an annotation (Optimizer.step#SGD.step) around its ops
                opt.zero_grad()
    path = tmp_path / "t.pt.trace.json"
    prof.export_chrome_trace(str(path))
    rt = read_trace(path)
    truth = {a.key: a for a in prof.key_averages() if a.key.startswith("aten::")}
    assert len(truth) > 10
    assert set(truth) <= set(rt.cpu_ops)
    for name, avg in truth.items():
        calls, total_us = rt.cpu_ops[name]
        assert calls == avg.count, name
        # the trace keeps times in ns: the same sums to rounding
        assert abs(rt.cpu_self.get(name, 0.0) - avg.self_cpu_time_total) < 0.01, name
        assert abs(total_us - avg.cpu_time_total) < 0.01, name
    rows = [r["name"] for r in host_top_ops(rt, limit=100) if r["name"] in truth]
    best = sorted(truth.values(), key=lambda a: -a.self_cpu_time_total)
    assert rows[:3] == [a.key for a in best][:3]
