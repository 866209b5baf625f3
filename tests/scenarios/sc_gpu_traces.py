"""The GPU-timeline findings on real GPU traces (tests/data/traces), some edited minimally.

Truth from HTA and direct counts over the raw events (`tests.scenarios.gpu_truth`), never
from ampdiag. What each trace holds, by its own measurement:

* ``trace-fp32-mlp-launch-bound``: a small FP32 MLP with SGD on a Quadro GP100
  (with_gpu_user_annotation): every kernel under 10 µs, the GPU waiting on the host 96% of
  its span, all GEMMs in FP32 (cuBLAS gemv/gemmk1).
* ``trace-ddp-allreduce-exposed``: DDP on 2 V100s (df_index_resolver, rank 1): NCCL
  all-reduces that overlap no computation, FP32 volta_sgemm kernels.
* ``trace-alexnet-fp32``: AlexNet's forward on an A100 (critical_path/alexnet): FP32 SIMT
  sgemm/scudnn beside TF32 xmma kernels.
* ``trace-cnn-tf32``: a DDP CNN on A100s (nccl_parser_config): convolutions in TF32 on
  tensor cores (not FP32-dominant), the all-reduce exposed but < 10% of the span.
* ``trace-fp16-128-ranks``: two ranks of a 128-rank job (trace_filter): FP16/FP8 kernels,
  a third of the span in exposed communication.
* ``trace-busy-gpu`` (edited, the healthy control): the CNN trace as one GPU with a host that
  always launches in time -- its NCCL kernels removed and every GPU idle gap over 2 µs cut
  out of the whole timeline (`gpu_truth.squeeze_idle`). None of the GPU findings may fire.
* ``trace-accumulation-syncs`` (edited): the CNN trace's first two steps as one optimizer
  step of two micro-batches (the ProfilerStep annotation of the second removed, the first's
  stretched over both): gradient accumulation whose every micro-batch all-reduces (no
  ``no_sync()``), 5 buckets each.
* ``trace-accumulation-no-sync`` (edited): the same, with the first micro-batch's all-reduce
  kernels removed, as ``no_sync()`` would: the control, no ``redundant-allreduce``.
* ``trace-straggler`` (edited): the CNN trace as both ranks of its 2-rank job: rank 1 the
  trace as recorded, rank 0 a copy whose all-reduces each last longer, together 30% of a step
  per step (the waiting a slower rank 1 causes at every bucket). The lateness is what was
  inserted.
"""

from __future__ import annotations

from typing import Any

from tests.scenarios.gpu_truth import gpu_events, squeeze_idle, trace_scenario, warp

CNN = "nccl_parser_config/nccl_data.json.gz"
#: The straggler's lateness per step, as a share of the median step (>= 25%: medium).
LATE_SHARE = 0.30


def _busy_single_gpu(docs: list[dict[str, Any]]) -> None:
    (doc,) = docs
    doc["traceEvents"] = [
        e
        for e in doc["traceEvents"]
        if not (e.get("cat") == "kernel" and "nccl" in str(e.get("name", "")).lower())
    ]
    doc.pop("distributedInfo", None)
    assert squeeze_idle(doc, keep_us=2.0) > 100


def _merge_two_steps(docs: list[dict[str, Any]], no_sync: bool = False) -> None:
    (doc,) = docs
    events = doc["traceEvents"]
    steps = sorted(
        (e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")),
        key=lambda e: float(e["ts"]),
    )
    first, second = steps[0], steps[1]
    first["dur"] = float(second["ts"]) + float(second["dur"]) - float(first["ts"])
    events.remove(second)
    if no_sync:  # the first micro-batch's all-reduces never launched
        end = float(second["ts"])
        launch = {
            e["args"]["correlation"]: float(e["ts"])
            for e in events
            if e.get("cat") in ("cuda_runtime", "cuda_driver")
            and "correlation" in e.get("args", {})
        }
        doc["traceEvents"] = [
            e
            for e in events
            if not (
                e.get("cat") == "kernel"
                and "allreduce" in str(e.get("name", "")).lower().replace("_", "")
                and launch.get(e.get("args", {}).get("correlation"), end) < end
            )
        ]


def _steps(doc: dict[str, Any]) -> list[tuple[float, float]]:
    return sorted(
        (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        for e in doc["traceEvents"]
        if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
    )


def _straggler(docs: list[dict[str, Any]]) -> dict[str, Any]:
    waiter, late = docs
    waiter["distributedInfo"]["rank"] = 0
    late["distributedInfo"]["rank"] = 1
    steps = _steps(late)
    durations = sorted(e - s for s, e in steps)
    median = (durations[(len(durations) - 1) // 2] + durations[len(durations) // 2]) / 2
    lateness = LATE_SHARE * median
    nccl = sorted(
        (float(e["ts"]) + float(e["dur"]), float(e["ts"]))
        for e in gpu_events(waiter)
        if "nccl" in e["name"].lower()
    )
    at: list[float] = []
    delta: list[float] = []
    for s, e in steps:
        ends = [end for end, start in nccl if s <= start < e]
        assert ends, "every step must hold an all-reduce"
        at += ends
        delta += [lateness / len(ends)] * len(ends)
    warp(waiter["traceEvents"], at, delta)
    return {"rank": 1, "lateness_us": lateness, "steps": len(steps)}


SCENARIOS = [
    trace_scenario(
        "trace-fp32-mlp-launch-bound",
        "FP32 MLP on a GP100: tiny kernels, the GPU waits on the host, FP32 GEMMs.",
        ["with_gpu_user_annotation/step_based_trace_2543932.json.gz"],
    ),
    trace_scenario(
        "trace-ddp-allreduce-exposed",
        "DDP on V100s: all-reduces overlap no computation; FP32 sgemm.",
        ["df_index_resolver/df_index_resolver.json.gz"],
    ),
    trace_scenario(
        "trace-alexnet-fp32",
        "AlexNet forward on an A100: FP32 SIMT GEMM/conv beside TF32 ones; idle GPU.",
        ["critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz"],
    ),
    trace_scenario(
        "trace-cnn-tf32",
        "DDP CNN on A100s: TF32 convolutions on tensor cores, small exposed all-reduce.",
        [CNN],
    ),
    trace_scenario(
        "trace-fp16-128-ranks",
        "Two ranks of a 128-rank FP16/FP8 job: exposed communication, idle GPU.",
        ["trace_filter/sampled_rank-0.json.gz", "trace_filter/sampled_rank-1.json.gz"],
    ),
    trace_scenario(
        "trace-busy-gpu",
        "Healthy: the TF32 CNN on one GPU with no idle gap over 2 µs (edited trace).",
        [CNN],
        edit=lambda docs: _busy_single_gpu(docs),
    ),
    trace_scenario(
        "trace-accumulation-syncs",
        "Two micro-batches per step, each all-reducing its gradients (edited trace).",
        [CNN],
        edit=lambda docs: _merge_two_steps(docs),
    ),
    trace_scenario(
        "trace-accumulation-no-sync",
        "Two micro-batches per step, the first under no_sync() (edited trace): the control.",
        [CNN],
        edit=lambda docs: _merge_two_steps(docs, no_sync=True),
    ),
    trace_scenario(
        "trace-straggler",
        "Rank 1 is late at every all-reduce, 30% of a step per step (edited 2-rank trace).",
        [CNN, CNN],
        edit=_straggler,
    ),
]
