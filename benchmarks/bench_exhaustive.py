"""The exhaustive differential (`kvcheck explore --preset check-impl --backend impl`, make
check's part): transitions per second on a clean impl/, and, for every planted fault of
impl/faults.py, whether a scope of the preset catches it, where, at which step, after how
many transitions and seconds.

    python -m benchmarks.bench_exhaustive [--preset check-impl] [FAULT ...]
"""
from __future__ import annotations

import argparse
import time

from kvcheck.impl import faults
from kvcheck import explore as E
from kvcheck.engines.exhaustive import ForkError, check_transitions


def measure(preset: str = "check-impl", names=(), out=print) -> dict:
    """The clean run's transitions per CPU-second and, per planted fault (all by default),
    where the preset catches it; each line printed as it is measured."""
    results = [E.explore(sc) for sc in E.PRESETS[preset]]
    t0, c0 = time.perf_counter(), time.process_time()
    for r in results:
        rep = check_transitions(r)
        out(f"{r.scope.name:24s} {rep.line()}")
    n = sum(r.transitions for r in results)
    cpu = time.process_time() - c0
    out(f"clean impl/: {n:,} transitions in {time.perf_counter() - t0:.1f} s wall, "
        f"{cpu:.1f} CPU-s ({n / cpu:,.0f} transitions per CPU-second)\n")
    names = list(names) or sorted(faults.FAULTS)
    missed = []
    for name in names:
        t0, hit = time.perf_counter(), None
        with faults.planted(name):
            for r in results:
                try:
                    rep = check_transitions(r)
                except ForkError as e:
                    hit = f"{r.scope.name}: ForkError {e}"
                    break
                if rep.failure is not None:
                    f = rep.failure
                    hit = (f"{r.scope.name}: {f.id} on {f.side} at step {f.step}, after "
                           f"{rep.transitions:,} transitions")
                    break
        if hit is None:
            missed.append(name)
        out(f"{name:40s} {'caught' if hit else 'MISSED'} {time.perf_counter() - t0:5.1f} s  "
            f"{hit or ''}")
    out(f"\n{len(names) - len(missed)} of {len(names)} planted faults caught by preset {preset!r}")
    return {"transitions": n, "cpu": cpu, "faults": len(names), "missed": missed}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_exhaustive")
    ap.add_argument("--preset", default="check-impl")
    ap.add_argument("faults", nargs="*", help="planted faults (default: all)")
    args = ap.parse_args(argv)
    measure(args.preset, args.faults, lambda line: print(line, flush=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
