"""The source-run escape suite (tests/escape_suite.py) in both tiers, as a table: each case, the escapes
counted (0 expected), what the host measured, and how long it took.

    python bench/bench_escapes.py [--tiers root unprivileged]

Tiers: `root` (a root backend: a uid of its own per run, cgroups where the host allows) and
`unprivileged` (a backend run as an ordinary user with its own venv and home, as on a laptop). A tier this
machine cannot run is listed with the reason.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.escape_suite import CASES, OBSERVED, TIERS, remove, scratch_dir, start_tier, tier_unavailable  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tiers", nargs="+", default=list(TIERS), choices=TIERS)
    args = parser.parse_args()
    total = 0
    for name in args.tiers:
        reason = tier_unavailable(name)
        if reason is not None:
            print(f"{name} tier: not run ({reason})")
            continue
        root = scratch_dir()
        tier = start_tier(name, root)
        try:
            isolation_line = next(
                (line for line in tier.backend.log().splitlines() if "source runs:" in line), ""
            )
            print(f"\n{name} tier: {isolation_line.split('source runs: ', 1)[-1]}")
            print(f"{'case':<34} {'escapes':>7} {'seconds':>8}  host measured / first escape")
            tier_total = 0
            for case, function in CASES.items():
                work = root / f"work-{case}"
                started = time.perf_counter()
                escapes = function(tier, work)
                elapsed = time.perf_counter() - started
                tier_total += len(escapes)
                note = str(escapes[0]) if escapes else OBSERVED.get((name, case), "")
                print(f"{case:<34} {len(escapes):>7} {elapsed:>8.1f}  {note[:140]}")
            print(f"{name} tier: {tier_total} escape(s) in {len(CASES)} cases")
            total += tier_total
        finally:
            tier.stop()
            remove(root)
    print(f"\nescapes counted: {total}")


if __name__ == "__main__":
    main()
