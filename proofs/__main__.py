"""python -m proofs [-v] [--no-crosshair]: run every proof; exit 1 unless every lemma is
proved and every negative control refuted."""
from __future__ import annotations

import argparse
import sys
import time

from proofs import ok, report, run_all


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m proofs")
    ap.add_argument("-v", "--verbose", action="store_true", help="print each result as it finishes")
    ap.add_argument("--no-crosshair", action="store_true", help="skip the CrossHair contract check")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    results = run_all(verbose=args.verbose, crosshair=not args.no_crosshair)
    print(report(results))
    print(f"== wall time {time.perf_counter() - t0:.1f}s")
    return 0 if ok(results) else 1


if __name__ == "__main__":
    sys.exit(main())
