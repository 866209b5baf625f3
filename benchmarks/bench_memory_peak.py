"""Is the measured CPU memory peak the same in every run? Tutorial 2's diagnosed loop (MLP
256-1024-1024-10, batch 512, ``ampdiag.memory_probe`` first, bf16 autocast, 24 MiB budget)
in ``--repeat`` fresh processes; prints each run's peak, its categories and whether the
accumulation plan was given, then the distinct peaks.

    python -m benchmarks.bench_memory_peak [--repeat 10]

Before the fix (compat/memory.py: tensors with no reported free), the same loop measured
18.2 MB in some runs and 22.4-23.5 MB in others (the extra in "inputs" or "unknown").
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = """
import json, logging, tempfile, warnings
from pathlib import Path
warnings.simplefilter("ignore")
logging.disable(logging.CRITICAL)
import torch
from torch import nn
import ampdiag

torch.manual_seed(0)
model = nn.Sequential(
    nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)
)
X, Y = torch.randn(4096, 256), torch.randint(0, 10, (4096,))
def batch(n):
    return X[:n], Y[:n]
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with ampdiag.diagnose(out=Path(tempfile.mkdtemp()), memory_target_batch=4096,
                      memory_limit_bytes=24 * 2**20, console=False, report=False,
                      tensorboard=False, speed_probe=False, profile_active=1) as d:
    ampdiag.memory_probe(model, batch, loss_fn=nn.functional.cross_entropy,
                         autocast_dtype=torch.bfloat16)
    for _ in range(4):
        x, y = batch(512)
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
peak = d.session.section("memory")["peak"]
ids = [f.id for f in d.session.all_findings()]
print(json.dumps({"bytes": peak["bytes"], "by_category": peak["by_category"],
                  "plan": "use-grad-accumulation" in ids}))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args(argv)
    peaks = []
    for i in range(args.repeat):
        done = subprocess.run(
            [sys.executable, "-c", CHILD], cwd=REPO, capture_output=True, text=True, check=True
        )
        row = json.loads(done.stdout.strip().splitlines()[-1])
        cats = {k: v for k, v in row["by_category"].items() if v}
        print(f"run {i + 1:>2}: {row['bytes']:>10} B  plan={row['plan']}  {cats}", flush=True)
        peaks.append(row["bytes"])
    print(f"distinct peaks: {sorted(set(peaks))} ({max(peaks) / 2**20:.2f} MiB at most)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
