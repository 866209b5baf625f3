"""N ranks made of copies of a real run's ranks, for the merge at scale (tests, bench_ranks).

Rank ``r`` of the copy is the source's rank ``r % k`` (``k`` ranks in the source), with its
session's and its trace's rank and world size rewritten to ``r`` and ``n``: the merge then reads
``n`` distinct ranks whose every figure is known from the source's ``k``.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

from ampdiag.sources.ranks import rank_folders

_DIST = re.compile(rb'("distributedInfo": \{[^}]*?"rank": )\d+(, "world_size": )\d+')


def copy_ranks(src: Path, dst: Path, n: int) -> list[int]:
    """Writes ranks ``0..n-1`` under ``dst`` from the ranks of ``src``; returns their sources."""
    folders = rank_folders(src)
    k = len(folders)
    docs, traces = [], []
    for _, folder in folders:
        docs.append(json.loads((folder / "session.json").read_text(encoding="utf-8")))
        named = docs[-1]["profiler"]["trace_files"]
        traces.append([(name, gzip.decompress((folder / name).read_bytes())) for name in named])
    sources = []
    for r in range(n):
        s = r % k
        out = dst / f"rank-{r}"
        (out / "trace").mkdir(parents=True)
        doc = docs[s]
        doc["environment"]["rank"], doc["environment"]["world_size"] = r, n
        (out / "session.json").write_text(json.dumps(doc), encoding="utf-8")
        for name, raw in traces[s]:
            fixed, count = _DIST.subn(rb"\g<1>%d\g<2>%d" % (r, n), raw, count=1)
            assert count == 1, "the source trace names no rank"
            (out / name).write_bytes(gzip.compress(fixed, compresslevel=1))
        sources.append(s)
    return sources
