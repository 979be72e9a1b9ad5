"""Scale-out: the same count-budgeted campaign (spec vs impl, walk engine, no fault)
with 1 worker and with 2 local worker processes (python -m benchmarks.bench_scale).

Prints, for each: wall seconds, CPU seconds (this process and its reaped worker
processes, from getrusage), sequences, steps per wall second and steps per CPU-second,
then the speedup of 2 workers over 1 in wall time and the CPU-normalised throughput
ratio. Workers start by importing torch (process spawn), which is part of both figures;
with `--ray` the 2-worker campaign also runs on a local Ray (its raylet's CPU is not
counted). On a shared machine the wall speedup is bounded by the cores actually free,
so the load average is printed with it; steps per CPU-second shows whether the workers
themselves lose throughput (start-up, contention) independently of the load.
"""
from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from dataclasses import dataclass

from kvcheck.fuzz import fuzz


@dataclass
class ScaleRun:
    workers: int
    wall: float             # seconds
    cpu: float              # CPU seconds, this process + reaped children
    sequences: int
    steps: int
    load: float             # 1-minute load average at the start

    @property
    def steps_per_wall_s(self) -> float:
        return self.steps / self.wall if self.wall else 0.0

    @property
    def steps_per_cpu_s(self) -> float:
        return self.steps / self.cpu if self.cpu else 0.0


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and of every child it has reaped."""
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


def campaign(rounds: int, seed: int, workers: int, use_ray: bool = False) -> tuple:
    """(wall seconds, sequences, steps) of one campaign."""
    r = measure(rounds, seed, workers, use_ray)
    return r.wall, r.sequences, r.steps


def measure(rounds: int, seed: int, workers: int, use_ray: bool = False) -> ScaleRun:
    """One campaign with its wall and CPU time (the executor joins its workers at the
    end, so their CPU time is in RUSAGE_CHILDREN by then)."""
    load = os.getloadavg()[0]
    c0 = cpu_seconds()
    with tempfile.TemporaryDirectory() as tmp:
        rep = fuzz(None, seed, "impl", tmp, rounds=rounds, workers=workers, use_ray=use_ray,
                   quiet=True)
    return ScaleRun(workers, rep.seconds, cpu_seconds() - c0, rep.sequences, rep.steps, load)


def speedup_line(one: ScaleRun, two: ScaleRun) -> str:
    return (f"2 workers over 1: x{one.wall / two.wall:.2f} wall, "
            f"x{two.steps_per_cpu_s / max(one.steps_per_cpu_s, 1e-9):.2f} steps per CPU-second "
            f"({os.cpu_count()} cores, load average {one.load:.1f} -> {two.load:.1f})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=400)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--ray", action="store_true", help="also run the 2-worker campaign on Ray")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    rows = [("1 worker (inline)", 1, False), ("2 worker processes", 2, False)]
    if args.ray:
        rows.append(("2 Ray tasks (local Ray, 2 CPUs)", 2, True))
    print(f"{'campaign':<34} {'wall s':>7} {'cpu s':>7} {'sequences':>10} {'steps/s':>8} "
          f"{'steps/cpu-s':>12} {'load':>5}")
    runs = []
    for name, w, r in rows:
        run = measure(args.rounds, args.seed, w, r)
        runs.append(run)
        print(f"{name:<34} {run.wall:7.1f} {run.cpu:7.1f} {run.sequences:10d} "
              f"{run.steps_per_wall_s:8.0f} {run.steps_per_cpu_s:12.0f} {run.load:5.1f}", flush=True)
    print(speedup_line(runs[0], runs[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
