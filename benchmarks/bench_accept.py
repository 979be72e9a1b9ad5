"""What following the fixed spec under `--accept` costs (python -m benchmarks.bench_accept).

`kvcheck.checker.Lockstep` steps the fixed spec beside the accepted one until they first
differ (`_took_upstream`), so that a break before any accepted branch is a spec failure.
This runs the same walk sequences on the spec alone (impl/ takes no --accept; no
backend's cost hides the extra step: the worst case) with it on and with it off (every
step counted as taken: the old behaviour), alternating `--rounds` times, and prints
steps per CPU-second of each and how many steps the fixed spec was stepped on. Compare
rows of one run: the machine may be shared.
"""
from __future__ import annotations

import argparse
import statistics
import time

from kvcheck import checker
from kvcheck.backends import config_kw
from kvcheck.engines.stats import Stats
from kvcheck.engines.walk import walk


def campaign(accept: tuple, sequences: int, seed: int) -> tuple[float, Stats]:
    stats = Stats()
    kw = config_kw("spec", accept, None)
    t0 = time.process_time()
    for i in range(sequences):
        walk(seed, i, None, "spec", stats, config_kw=kw)
    return time.process_time() - t0, stats


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--accept", default="U1,U2,U3,M2")
    ap.add_argument("--sequences", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    accept = tuple(a.accept.split(","))
    real = checker.Lockstep._took_upstream
    shadowed = [0]

    def counting(self, op, *args, **kw):
        shadowed[0] += self.fixed is not None
        return real(self, op, *args, **kw)

    def off(self, op, *args, **kw):
        self.fixed = None
        return True

    rates: dict = {"fixed spec followed": [], "off (always taken)": []}
    for _ in range(a.rounds):
        for name, fn in (("fixed spec followed", counting), ("off (always taken)", off)):
            checker.Lockstep._took_upstream = fn
            try:
                seconds, stats = campaign(accept, a.sequences, a.seed)
            finally:
                checker.Lockstep._took_upstream = real
            rates[name].append(stats.steps / seconds)
    print(f"--accept {a.accept}, {a.sequences} walk sequences, seed {a.seed}, spec alone; "
          f"{stats.steps} steps compared, {sum(stats.beyond.values())} sequences beyond")
    for name, r in rates.items():
        print(f"  {name:<22} {statistics.median(r):8.0f} steps/CPU-s (median of {a.rounds})")
    print(f"  fixed spec stepped on {shadowed[0] // a.rounds} of the {stats.steps} steps "
          "(until the first accepted branch of each sequence)")


if __name__ == "__main__":
    main()
