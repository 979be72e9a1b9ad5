"""python -m proofs [-v] [--no-crosshair] [--no-cache] [--out DIR] [--only TEXT]: run every
proof; exit 1 unless every lemma is proved and every negative control refuted. Units whose
covered sources are unchanged since they last passed come from DIR/.kvcheck-cache."""
from __future__ import annotations

import argparse
import sys
import time

from pathlib import Path

from kvcheck.proofs import ok, report, run_all
from kvcheck.proofs.cache import ROOT, cache_at


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m proofs")
    ap.add_argument("-v", "--verbose", action="store_true", help="print each result as it finishes")
    ap.add_argument("--no-crosshair", action="store_true", help="skip the CrossHair contract check")
    ap.add_argument("--no-cache", action="store_true",
                    help="run every proof, ignoring results cached for unchanged sources")
    ap.add_argument("--out", type=Path, default=ROOT / "failures",
                    help="output directory; the cache is OUT/.kvcheck-cache/proofs.json")
    ap.add_argument("--only", metavar="TEXT", help="only the units whose name contains TEXT")
    ap.add_argument("--crosshair-time-limit", type=float, default=None, metavar="SECONDS",
                    help="CrossHair's wall-clock safety net (a run it stops has no verdict)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    results = run_all(verbose=args.verbose, crosshair=not args.no_crosshair,
                      cache=cache_at(None if args.no_cache else args.out), only=args.only,
                      time_limit=args.crosshair_time_limit)
    print(report(results))
    print(f"== wall time {time.perf_counter() - t0:.1f}s")
    return 0 if ok(results) else 1


if __name__ == "__main__":
    sys.exit(main())
