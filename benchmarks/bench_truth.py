"""The scorecard: runs the scenario corpus (tests/scenarios) and prints, per finding id, true
positives, false negatives, false positives and true negatives (forbidden and silent), and the
totals.

    python -m benchmarks.bench_truth [-k NAME_PART[,NAME_PART...]] [-v]

-v prints each miss with its reason. Exit status 0 whatever the score (it is a report).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "-k", default="", help="only scenarios whose name contains one of these (comma-separated)"
    )
    parser.add_argument("-v", action="store_true", help="print every miss with its reason")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    import logging

    logging.getLogger("ampdiag").setLevel(logging.ERROR)
    from tests.scenarios.harness import all_scenarios, combined, score

    per_scenario = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for scenario in all_scenarios():
            if not any(k in scenario.name for k in args.k.split(",")):
                continue
            t0 = time.perf_counter()
            try:
                session, truth = scenario.run(Path(tmp) / scenario.name)
                result = score(session, scenario, truth)
            except Exception as exc:  # a broken scenario is reported, not fatal
                print(f"{scenario.name}: ERROR {exc!r}")
                continue
            per_scenario.append(result)
            misses = [r for s in result.values() for r in s.reasons]
            mark = "ok  " if not misses else "MISS"
            print(f"{mark} {scenario.name:<40} {time.perf_counter() - t0:5.1f} s")
            if args.v:
                for r in misses:
                    print(f"       {r}")
    total = combined(per_scenario)
    print()
    print(f"| {'finding id':<32} | TP | FN | FP | TN |")
    print(f"|{'-' * 34}|----|----|----|----|")
    for fid in sorted(total):
        s = total[fid]
        row = f"{s.tp:>2} | {s.fn:>2} | {s.fp:>2} | {s.tn:>2}"
        print(f"| `{fid}`{' ' * (30 - len(fid))} | {row} |")
    tp, fn, fp, tn = (sum(getattr(s, k) for s in total.values()) for k in ("tp", "fn", "fp", "tn"))
    label = f"**total** ({len(per_scenario)} scenarios)"
    print(f"| {label:<32} | {tp:>2} | {fn:>2} | {fp:>2} | {tn:>2} |")
    print(f"\n{time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
