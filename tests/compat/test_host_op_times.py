"""`compat.profiler.host_op_times` against torch's own ``key_averages()`` on the same profile."""

from __future__ import annotations

import torch
from torch.profiler import profile

from ampdiag.compat.profiler import host_op_times


def test_calls_self_and_total_times_match_key_averages() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    with profile(profile_memory=True, record_shapes=True) as prof:
        for _ in range(3):
            with torch.profiler.record_function("user::step"):
                model(torch.randn(16, 32)).sum().backward()
    ours = host_op_times(prof)
    assert ours is not None
    truth = {a.key: a for a in prof.key_averages() if a.key != "[memory]"}
    assert set(ours) == set(truth)
    for name, avg in truth.items():
        calls, self_us, total_us = ours[name]
        assert calls == avg.count, name
        assert abs(self_us - avg.self_cpu_time_total) < 0.01, name
        assert abs(total_us - avg.cpu_time_total) < 0.01, name
