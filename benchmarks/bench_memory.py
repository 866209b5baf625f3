"""Cost of the memory collector: diagnose() with memory=True vs memory=False, interleaved.

Run: python benchmarks/bench_memory.py  (prints the medians and the ratio)
"""

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch import nn
from torch.nn import functional as F

from ampdiag.sources.live.diagnosis import diagnose


def run(memory: bool, out: Path) -> float:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10))
    opt = torch.optim.Adam(model.parameters())
    data = [(torch.randn(64, 256), torch.randint(0, 10, (64,))) for _ in range(8)]
    start = time.perf_counter()
    with diagnose(out=out, memory=memory, report=False, tensorboard=False, console=False):
        for x, y in data:
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
    return time.perf_counter() - start


def main() -> None:
    times: dict[bool, list[float]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(5):
            for memory in (False, True):
                times[memory].append(run(memory, Path(tmp) / f"{memory}-{i}"))
    off, on = statistics.median(times[False]), statistics.median(times[True])
    print(f"memory=False median {off * 1000:.1f} ms")
    print(f"memory=True  median {on * 1000:.1f} ms")
    print(f"ratio {on / off:.3f}")


if __name__ == "__main__":
    main()
