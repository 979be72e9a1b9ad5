"""The parallel search against one process (python -m benchmarks.bench_parallel
[--preset bench] [--workers 1,2] [--ray]): distinct states per second with every
invariant, side by side on the same scope, and what the exchange costs.

For each run: wall seconds and states per wall second; CPU seconds of the coordinator
(this process) and of the workers (each worker's own count of the ranges it expanded, so
Ray actors are counted too); states per CPU-second; the exchange's overhead per state
(the run's CPU per state less one process's: notes, merging, rebuilding the states a
worker did not find itself); the balance (mean worker CPU of a level over its busiest
worker's, summed over levels); and the speedup that the CPU figures allow on free cores
(one process's CPU over the busiest workers' and the coordinator's). The wall speedup is
bounded by the cores that are free: on a shared machine compare the CPU figures. Every
run must report the same result (states, transitions, violations)."""
from __future__ import annotations

import argparse
import os
import resource
import time
from dataclasses import dataclass
from typing import Optional


@dataclass
class ParRun:
    label: str
    workers: int
    states: int
    transitions: int
    wall: float
    coordinator_cpu: float
    worker_cpu: float
    critical: float
    load: float
    same: tuple

    @property
    def cpu(self) -> float:
        return self.coordinator_cpu + self.worker_cpu

    @property
    def per_state_us(self) -> float:
        return self.cpu / self.states * 1e6


def _self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measure(sc, workers: int, ray_address: Optional[str] = None, label: str = "") -> ParRun:
    """One search of `sc` (in this process for one worker and no Ray)."""
    from kvcheck.explore.pools import explore_on
    load = os.getloadavg()[0]
    c0, t0 = _self_cpu(), time.perf_counter()
    res = explore_on(sc, workers=workers, ray_address=ray_address)
    wall, coord = time.perf_counter() - t0, _self_cpu() - c0
    wt = res.workers
    worker_cpu = wt.cpu
    if wt.levels:       # the coordinator's own CPU is what is left of this process's
        critical = wt.critical
    else:
        worker_cpu, coord, critical = coord, 0.0, coord
    same = (res.states, res.transitions, res.level_sizes,
            [(v.id, v.depth, v.ops) for v in res.violations], sorted(res.reached.items()))
    return ParRun(label or f"{workers} worker{'s' * (workers > 1)}", max(1, wt.count if wt.levels
                  else 1), res.states, res.transitions, wall, coord, worker_cpu, critical,
                  load, same)


def rows(runs: list) -> list:
    """(label, figures) per run, against the first (one process)."""
    base = runs[0]
    out = []
    for r in runs:
        free = base.cpu / max(r.critical + r.coordinator_cpu, 1e-9)
        line = (f"{r.states / r.wall:,.0f} states/s wall ({r.wall:.1f} s, load {r.load:.1f}), "
                f"{r.states / r.cpu:,.0f} states/CPU-s")
        if r is not base:
            line += (f"; x{base.wall / r.wall:.2f} wall, x{free:.2f} on free cores; exchange "
                     f"{r.per_state_us - base.per_state_us:+.0f} us CPU/state "
                     f"(coordinator {r.coordinator_cpu / r.states * 1e6:.0f}), balance "
                     f"{r.worker_cpu / r.workers / max(r.critical, 1e-9):.2f}, "
                     f"per worker {r.states / max(r.worker_cpu, 1e-9):,.0f} states/CPU-s"
                     + ("" if r.same == base.same else "; NOT THE SAME RESULT"))
        out.append((r.label, line))
    par = [r for r in runs if r.workers > 1]
    if par:
        out.append(("projection to 100,000 states/s", projection(base, par[0])))
    return out


def projection(base: ParRun, r: ParRun) -> str:
    """Workers for 100,000 distinct states per second at the run's per-worker CPU rate and
    balance, and the rate at which the coordinator alone (its CPU per state, all of it
    serial) would be the limit."""
    per_worker = r.states / max(r.workers * r.critical, 1e-9)    # rate x balance
    cap = r.states / max(r.coordinator_cpu, 1e-9)
    return (f"about {100_000 / per_worker:.0f} workers at {per_worker:,.0f} states/s each "
            f"(this run's per-worker rate and balance, the same cores); the coordinator "
            f"merges at most {cap:,.0f} states/s")


def main(argv=None) -> int:
    from kvcheck import explore as E
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_parallel",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="bench", help="the preset's first scope")
    ap.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    ap.add_argument("--ray", action="store_true", help="also 2 Ray actors on a local Ray")
    args = ap.parse_args(argv)
    sc = E.PRESETS[args.preset][0]
    runs = [measure(sc, int(w)) for w in args.workers.split(",")]
    if args.ray:
        runs.append(measure(sc, 2, "", "2 Ray actors (local Ray, with its start)"))
    print(sc.describe())
    for label, line in rows(runs):
        print(f"{label:<42} {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
