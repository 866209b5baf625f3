"""Synthetic GPU traces of a 2-rank DDP job with a known straggler (for the cross-rank tests).

Each step every rank launches the same computation kernels, then one NCCL all-reduce. The
all-reduce ends on both ranks at the same moment: a transfer time after the later rank's
kernel started. The straggler is made late one of two ways: ``host`` (it sleeps ``delay_us``
at the start of each step before launching anything) or ``compute`` (each of its computation
kernels runs ``delay_us / kernels`` longer). The truth is what was built: which rank, how late.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.trace.conftest import kernel, launch, step, write_trace

GEMM = "volta_sgemm_128x64_nn"
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def _op(name: str, ts: float, dur: float) -> dict[str, Any]:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 10, "tid": 10, "ts": ts, "dur": dur}


def rank_traces(
    folder: Path,
    straggler: int | None,
    kind: str = "host",
    delay_us: float = 4000.0,
    steps: int = 5,
    kernels: int = 4,
    kernel_us: float = 1500.0,
    transfer_us: float = 300.0,
) -> list[Path]:
    """Writes rank-0.json and rank-1.json into ``folder``; returns their paths."""
    events: list[list[dict[str, Any]]] = [[], []]
    corr = [0, 0]
    t = 1_000_000.0  # both ranks start each step together (the last all-reduce synchronised them)
    for n in range(steps):
        arrive: list[float] = []
        ends_host: list[float] = []
        for r in (0, 1):
            ev = events[r]
            host = t + (delay_us if r == straggler and kind == "host" else 0.0)
            gpu = host + 20.0
            dur = kernel_us + (delay_us / kernels if r == straggler and kind == "compute" else 0)
            for _ in range(kernels):
                corr[r] += 1
                ev.append(_op("aten::mm", host, 30.0))
                ev.append(launch(host + 5.0, corr[r]))
                ev.append(kernel(gpu, dur, GEMM, corr[r]))
                host += 40.0
                gpu += dur
            corr[r] += 1
            ev.append(_op("c10d::allreduce_", host, 30.0))
            ev.append(launch(host + 5.0, corr[r]))
            arrive.append(max(gpu, host + 10.0))
            ends_host.append(host + 40.0)
        end = max(arrive) + transfer_us
        for r in (0, 1):
            events[r].append(kernel(arrive[r], end - arrive[r], NCCL, corr[r], stream=9))
        step_end = end + 100.0
        for r in (0, 1):
            events[r].append(step(n, t, step_end - t))
        t = step_end
    paths = []
    for r in (0, 1):
        dist = {"backend": "nccl", "rank": r, "world_size": 2}
        props = [{"id": 0, "name": "NVIDIA H100"}]
        paths.append(
            write_trace(
                folder / f"rank-{r}.json", events[r], distributedInfo=dist, deviceProperties=props
            )
        )
    return paths
