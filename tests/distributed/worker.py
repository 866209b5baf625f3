"""One torchrun job that runs every 2-rank scenario in turn, each under its own diagnose().

Launched by the tests (``torchrun --standalone --nproc_per_node=2 worker.py OUT``) over gloo on
the CPU, once per test session: starting the process group dominates a tiny job, so the
scenarios share it. Each scenario writes ``OUT/<scenario>/rank-N/`` (the session) and
``OUT/<scenario>/truth-rank-N.json``: what the scenario measured itself, independently of
ampdiag (the sleep it really slept, the all-reduces a DDP comm hook really sent, the bytes of
the local shards), for the tests to hold the findings against.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ampdiag

STEPS = 6
SETTINGS: dict[str, Any] = {"profile_skip": 1, "profile_warmup": 1, "profile_active": 3}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)


def _write_truth(out: Path, rank: int, truth: dict[str, Any]) -> None:
    (out / f"truth-rank-{rank}.json").write_text(json.dumps(truth), encoding="utf-8")


def _counting_hook(counter: list[int]) -> Any:
    """A DDP comm hook that counts the buckets all-reduced, then does the default all-reduce."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    def hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        counter[0] += 1
        return allreduce_hook(state, bucket)  # type: ignore[arg-type]

    # DDP checks the annotations themselves, which `from __future__ import annotations` makes text
    hook.__annotations__.update(bucket=dist.GradBucket, return_=None)
    del hook.__annotations__["return_"]
    hook.__annotations__["return"] = torch.futures.Future[torch.Tensor]
    return hook


def _digest(model: nn.Module) -> str:
    import hashlib

    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().float().numpy().tobytes())
    return h.hexdigest()


def ddp(
    out: Path,
    rank: int,
    dtype: torch.dtype,
    sleep_rank: int | None = None,
    diagnosed: bool = True,
) -> None:
    """DDP under CPU autocast; fp16 with a GradScaler; optionally one rank sleeping per step.

    ``diagnosed=False`` trains the same without ampdiag (the parameters must be bit-identical).
    """
    import contextlib

    model = DDP(_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu") if dtype == torch.float16 else None
    slept: list[float] = []
    watch = (
        ampdiag.diagnose(model, opt, scaler, out=out, **SETTINGS)
        if diagnosed
        else contextlib.nullcontext()
    )
    with watch:
        for step in range(STEPS):
            x, y = _batch(step, rank)
            if rank == sleep_rank:
                t0 = time.perf_counter()
                # long beside the ranks' own steps, which a loaded machine stretches: 50 ms let
                # the lateness leave its 0.6-1.3x band once under load
                time.sleep(0.15)
                slept.append(time.perf_counter() - t0)
            with torch.autocast("cpu", dtype=dtype):
                loss = nn.functional.cross_entropy(model(x), y)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
            opt.zero_grad()
    _write_truth(out, rank, {"slept_s": slept, "params_sha256": _digest(model)})


def accumulate(out: Path, rank: int, no_sync: bool, micro: int = 4) -> None:
    """Gradient accumulation over ``micro`` micro-batches, with or without ``model.no_sync()``."""
    import contextlib

    model = DDP(_model())
    calls = [0]
    model.register_comm_hook(None, _counting_hook(calls))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    per_step: list[int] = []
    with ampdiag.diagnose(model, opt, out=out, **SETTINGS):
        for step in range(STEPS):
            before = calls[0]
            for m in range(micro):
                x, y = _batch(step * micro + m, rank)
                sync = not no_sync or m == micro - 1
                with model.no_sync() if not sync else contextlib.nullcontext():
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        loss = nn.functional.cross_entropy(model(x), y) / micro
                    loss.backward()
            opt.step()
            opt.zero_grad()
            per_step.append(calls[0] - before)
    _write_truth(out, rank, {"allreduces_per_step": per_step, "micro_batches": micro})


def fsdp2(out: Path, rank: int) -> None:
    """FSDP2 (fully_shard) with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model = _model()
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    local = sum(p.to_local().numel() * p.element_size() for p in model.parameters())  # type: ignore[operator]
    full = sum(p.numel() * p.element_size() for p in model.parameters())
    with ampdiag.diagnose(model, opt, out=out, **SETTINGS):
        for step in range(STEPS):
            x, y = _batch(step, rank)
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
    _write_truth(out, rank, {"local_param_bytes": local, "full_param_bytes": full})


class _Norm(nn.Module):
    """Each row divided by its norm: a row of zeros is 0/0 (NaN) in any precision."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / x.norm(dim=-1, keepdim=True)


NAN_RANK, NAN_STEP = 1, 4


def fsdp2_nan(out: Path, rank: int) -> None:
    """FSDP2 with a BF16 policy; rank 1's batch at step 4 holds a row of zeros that the
    model's first module (``0``, a row norm) turns into 0/0 in its forward. Rank 0 only
    receives the NaN (the gradients' reduce-scatter). Truth: each rank's own first step whose
    module ``0`` output is non-finite while its input is finite (a forward hook)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(_Norm(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    made: list[int] = []

    def watch(m: nn.Module, inputs: Any, output: torch.Tensor) -> None:
        if bool(torch.isfinite(inputs[0]).all()) and not bool(torch.isfinite(output).all()):
            made.append(step)

    model[0].register_forward_hook(watch)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ampdiag.diagnose(model, opt, out=out, **SETTINGS):
        for step in range(STEPS):
            x, y = _batch(step, rank)
            if rank == NAN_RANK and step == NAN_STEP:
                x[3].zero_()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
    _write_truth(out, rank, {"made_nan_at_steps": made[:1], "module": "0"})


def zero(out: Path, rank: int) -> None:
    """ZeroRedundancyOptimizer over AdamW (its step runs the inner optimizer's): 8 steps."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    model = DDP(_model())
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3)
    steps = 8
    with ampdiag.diagnose(model, opt, out=out, **SETTINGS):
        for step in range(steps):
            x, y = _batch(step, rank)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = nn.functional.cross_entropy(model(x).float(), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
    _write_truth(out, rank, {"steps": steps})


SCENARIOS = {
    "ddp-bf16": lambda out, rank: ddp(out, rank, torch.bfloat16),
    "ddp-bf16-plain": lambda out, rank: ddp(out, rank, torch.bfloat16, diagnosed=False),
    "ddp-fp16": lambda out, rank: ddp(out, rank, torch.float16),
    "ddp-fp16-plain": lambda out, rank: ddp(out, rank, torch.float16, diagnosed=False),
    "straggler": lambda out, rank: ddp(out, rank, torch.bfloat16, sleep_rank=1),
    "accum": lambda out, rank: accumulate(out, rank, no_sync=False),
    "accum-nosync": lambda out, rank: accumulate(out, rank, no_sync=True),
    "fsdp2": fsdp2,
    "fsdp2-nan": fsdp2_nan,
    "zero": zero,
}


def main() -> None:
    root = Path(sys.argv[1])
    names = sys.argv[2:] or list(SCENARIOS)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    try:
        for name in names:
            out = root / name
            out.mkdir(parents=True, exist_ok=True)
            SCENARIOS[name](out, rank)
            dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
