"""Scale-out: the same count-budgeted campaign (spec vs impl, walk engine, no fault)
with 1 worker and with 2 local worker processes (python -m benchmarks.bench_scale).

Prints wall seconds, sequences/s and steps/s of each, and the speedup of 2 over 1.
Workers start by importing torch (process spawn), which is part of the figure; with
`--ray` the 2-worker campaign also runs on a local Ray. On a shared machine the
speedup is bounded by the cores actually free: say so when quoting it.
"""
from __future__ import annotations

import argparse
import tempfile

from kvcheck.fuzz import fuzz


def campaign(rounds: int, seed: int, workers: int, use_ray: bool = False) -> tuple:
    with tempfile.TemporaryDirectory() as tmp:
        rep = fuzz(None, seed, "impl", tmp, rounds=rounds, workers=workers, use_ray=use_ray,
                   quiet=True)
    return rep.seconds, rep.sequences, rep.steps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=400)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--ray", action="store_true", help="also run the 2-worker campaign on Ray")
    args = ap.parse_args(argv)
    rows = [("1 worker (inline)", 1, False), ("2 worker processes", 2, False)]
    if args.ray:
        rows.append(("2 Ray tasks (local Ray, 2 CPUs)", 2, True))
    print(f"{'campaign':<34} {'wall s':>7} {'sequences':>10} {'seq/s':>7} {'steps/s':>8}")
    base = None
    for name, w, r in rows:
        dt, seqs, steps = campaign(args.rounds, args.seed, w, r)
        base = base or dt
        print(f"{name:<34} {dt:7.1f} {seqs:10d} {seqs / dt:7.1f} {steps / dt:8.0f}"
              f"   speedup x{base / dt:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
