"""`make bench`: every speed figure in one run, then one summary table
(python -m benchmarks.summary [--quick] [--force] [--parts explore,fuzz,detect,scale,check]).

  explore  distinct states per CPU-second on check-overlap, the old explorer vs the new
           one (same scope, same state count), the visited set's bytes per state, and
           the whole search's on the nightly preset, levels kept vs rebuilt
  fuzz     spec+impl steps per CPU-second, Hypothesis machine vs walk engine
  detect   seconds to the first report per planted fault, both engines
  scale    1 worker vs 2 worker processes: wall speedup and steps per CPU-second, with
           the load average (only when the machine has a free core, or with --force)
  check    `kvcheck check` wall seconds by part (a subprocess, its --json report)
  exhaustive  the exhaustive differential (preset check-impl, spec vs impl on every
           transition): transitions per CPU-second, planted faults caught

Each figure's own module (bench_explore, bench_diff, bench_detect, bench_scale) prints
its detail as it runs; this driver collects the figures. CPU-second rates are per
process and comparable within one run; on a shared machine compare rows, not runs.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PARTS = ("explore", "fuzz", "detect", "scale", "check", "exhaustive")
ROOT = Path(__file__).resolve().parent.parent


def explore_rows(quick: bool) -> list:
    from dataclasses import replace

    from benchmarks.bench_explore import compare
    from kvcheck import explore as E
    sc = E.PRESETS["bench"][0]
    if quick:
        sc = replace(sc, max_depth=6)
    r = compare(sc)
    (old, t_old), (new, t_new) = r["old"], r["new"]
    same = (old.states, old.transitions) == (new.states, new.transitions)
    return [
        (f"explore {sc.name}: states, transitions", f"{new.states:,}, {new.transitions:,}"
         + ("" if same else f" (OLD: {old.states:,}, {old.transitions:,}: NOT THE SAME)")),
        ("explore: old explorer, states/CPU-s", f"{old.states / t_old:,.0f}"),
        ("explore: new explorer, states/CPU-s", f"{new.states / t_new:,.0f}  (x{t_old / t_new:.2f})"),
        ("explore: visited set, bytes/state old -> new",
         f"{old.bytes_per_state():,.0f} -> {new.bytes_per_state():,.0f}"),
    ] + _before_rows(sc, new, t_new) + _compiled_row(sc, new, t_old) + _memory_rows(quick)


def _memory_rows(quick: bool) -> list:
    """The whole search's memory per distinct state on the nightly preset (one fresh
    process each, the Cython build when it is current): every BFS level kept against
    every level rebuilt from the parent links (`--frontier-states 0`)."""
    from benchmarks.bench_explore import memory_run
    from kvcheck import compiled as C
    from kvcheck import explore as E
    try:
        C.check_build()
        built = True
    except C.NotBuilt:
        built = False
    sc, n = E.PRESETS["nightly"][0], (5_000 if quick else 100_000)
    runs = {fs: memory_run(sc, n, 0, built, frontier_states=fs, frontier_size=False)
            for fs in (None, 0)}
    per = {fs: (d["peak_rss"] - d["rss0"]) / d["states"] for fs, d in runs.items()}
    cpu = {fs: d["cpu_s"] for fs, d in runs.items()}
    return [(f"explore: nightly, {n:,} states, peak RSS bytes/state (levels kept -> rebuilt)",
             f"{per[None]:,.0f} -> {per[0]:,.0f}; CPU x{cpu[0] / cpu[None]:.2f}"
             f"{'' if built else ' (interpreted: no current Cython build)'}")]


def _before_rows(sc, new, t_new) -> list:
    """The explorer as it was before the copy-on-write state (bench_explore.BEFORE) and
    before the fast invariant verdict (bench_explore.PREVIOUS), each from git archive."""
    from benchmarks.bench_explore import BEFORE, PREVIOUS
    return (_archived_row(sc, new, t_new, BEFORE, "before the state rework")
            + _archived_row(sc, new, t_new, PREVIOUS, "before the fast invariants"))


def _archived_row(sc, new, t_new, commit: str, what: str) -> list:
    from benchmarks.bench_explore import before_run
    got = before_run(sc, commit)
    if isinstance(got, str):
        return [(f"explore: {what} ({commit})", f"not measured: {got}")]
    states, transitions, cpu = got
    # The vocabulary has grown since BEFORE (e.g. a close of a closing session is answered,
    # not refused), which adds transitions between the same states: the rate compares
    # the same state set, and the transition counts are shown when they differ.
    return [(f"explore: {what} ({commit}), states/CPU-s",
             f"{states / cpu:,.0f}; new x{cpu / t_new:.2f}"
             + ("" if states == new.states else f" ({states:,} states: NOT THE SAME)")
             + ("" if transitions == new.transitions
                else f" (transitions {transitions:,} then, {new.transitions:,} now)"))]


def _compiled_row(sc, new, t_old) -> list:
    from benchmarks.bench_explore import compiled_run
    got = compiled_run(sc)
    if isinstance(got, str):
        return [("explore: new explorer, Cython build", f"not measured: {got}")]
    states, transitions, cpu = got
    same = (states, transitions) == (new.states, new.transitions)
    return [("explore: new explorer, Cython build, states/CPU-s",
             f"{states / cpu:,.0f}  (x{t_old / cpu:.2f})"
             + ("" if same else f" ({states:,} states: NOT THE SAME)"))]


def fuzz_rows(quick: bool) -> list:
    from benchmarks.bench_diff import run, run_walk
    from kvcheck.adapters.impl import ImplBackend
    from kvcheck.engines import hypothesis_machine as M
    n = 10 if quick else 60
    h = run(M.make_machine(ImplBackend, "impl"), n, 11)
    w = run_walk(ImplBackend, n, 11)
    rate = lambda x: x[1] / x[0] if x[0] else 0.0
    return [("fuzz: hypothesis, spec+impl steps/CPU-s", f"{rate(h):,.0f}  ({h[1]} steps)"),
            ("fuzz: walk, spec+impl steps/CPU-s",
             f"{rate(w):,.0f}  ({w[1]} steps, x{rate(w) / max(rate(h), 1e-9):.1f})")]


def detect_rows(quick: bool) -> list:
    from benchmarks.bench_detect import INF, measure
    from kvcheck.impl import faults
    from kvcheck.engines import ENGINES
    names = sorted(faults.FAULTS)[:2] if quick else sorted(faults.FAULTS)
    table = measure(names, list(ENGINES), 20 if quick else 100)
    rows = []
    for i, name in enumerate(names):
        rows.append((f"detect {name}: s to report",
                     ", ".join(f"{e} {'missed' if t[i][1] == INF else f'{t[i][1]:.2f}'}"
                               for e, t in table.items())))
    for e, t in table.items():
        caught = [r[1] for r in t if r[1] != INF]
        med = statistics.median([r[1] for r in t])
        rows.append((f"detect: {e}, caught / median s to report",
                     f"{len(caught)}/{len(t)}, {'missed' if med == INF else f'{med:.2f}'}"))
    return rows


def free_cores() -> float:
    return (os.cpu_count() or 1) - os.getloadavg()[0]


def scale_rows(quick: bool, force: bool = False) -> list:
    from benchmarks.bench_scale import measure
    free = free_cores()
    if free < 1.0 and not force:   # this process takes one core; a second worker needs another
        return [("scale: 1 vs 2 workers", f"not measured: {os.cpu_count()} cores, load "
                 f"{os.getloadavg()[0]:.1f}, no free core for a second worker (--force measures anyway)")]
    rounds = 40 if quick else 300
    one, two = measure(rounds, 3, 1), measure(rounds, 3, 2)
    note = f"{free:.1f} cores were free" + ("; forced, the wall figure is bounded by the load"
                                            if free < 1.0 else "")
    return [("scale: 1 worker, steps/s (wall), steps/CPU-s",
             f"{one.steps_per_wall_s:,.0f}, {one.steps_per_cpu_s:,.0f}  (load {one.load:.1f})"),
            ("scale: 2 workers, steps/s (wall), steps/CPU-s",
             f"{two.steps_per_wall_s:,.0f}, {two.steps_per_cpu_s:,.0f}  (load {two.load:.1f})"),
            ("scale: 2 workers over 1",
             f"x{one.wall / two.wall:.2f} wall, x{two.steps_per_cpu_s / max(one.steps_per_cpu_s, 1e-9):.2f}"
             f" steps/CPU-s  ({os.cpu_count()} cores, {note})")]


def check_rows(quick: bool) -> list:
    with tempfile.TemporaryDirectory() as tmp:
        js = Path(tmp) / "check.json"
        cmd = [sys.executable, "-m", "kvcheck.cli", "check", "--json", str(js)]
        if quick:
            cmd += ["--examples", "5", "--skip-explore", "--skip-proofs", "--out", tmp]
        t0 = time.monotonic()
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        wall = time.monotonic() - t0
        if not js.exists():
            return [("check", f"no report (exit {p.returncode}): {p.stderr.strip()[-200:]}")]
        data = json.loads(js.read_text())
    rows = [(f"check: {part['name']}", f"{part['seconds']:.1f} s"
             + (f" ({part['cpu_seconds']:.1f} CPU-s)" if "cpu_seconds" in part else "")
             + ("" if part["ok"] else " FAILED")) for part in data["parts"]]
    rows.append(("check: whole run (wall, with start-up)",
                 f"{wall:.1f} s in {data.get('jobs', 1)} processes, load average "
                 f"{os.getloadavg()[0]:.1f}, exit {p.returncode}"))
    return rows


def exhaustive_rows(quick: bool) -> list:
    from benchmarks.bench_exhaustive import measure
    names = ("free_tail_unaligned", "swa_mapping_kept", "trim_overshoot_missing") if quick else ()
    m = measure("check-impl", names, lambda line: print("   " + line, flush=True))
    return [("exhaustive differential (check-impl): transitions/CPU-s",
             f"{m['transitions'] / m['cpu']:,.0f} ({m['transitions']:,} transitions)"),
            ("exhaustive differential: planted faults caught",
             f"{m['faults'] - len(m['missed'])} of {m['faults']}"
             + (f" (missed: {', '.join(m['missed'])})" if m["missed"] else ""))]


MEASURE = {"explore": explore_rows, "fuzz": fuzz_rows, "detect": detect_rows,
           "scale": scale_rows, "check": check_rows, "exhaustive": exhaustive_rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.summary",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small budgets (a smoke test)")
    ap.add_argument("--force", action="store_true",
                    help="measure 1 vs 2 workers even when the load average leaves no free core")
    ap.add_argument("--parts", type=lambda v: v.split(","), default=list(PARTS),
                    help=f"comma-separated, of {', '.join(PARTS)}")
    args = ap.parse_args(argv)
    bad = [x for x in args.parts if x not in PARTS]
    if bad:
        ap.error(f"--parts: unknown {bad}; known: {', '.join(PARTS)}")
    rows = []
    for part in args.parts:
        print(f"== {part}", flush=True)
        t0 = time.monotonic()
        rows += (scale_rows(args.quick, args.force) if part == "scale" else MEASURE[part](args.quick))
        print(f"   ({time.monotonic() - t0:.0f} s)", flush=True)
    print(f"\n== summary ({os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}"
          f"{'; --quick budgets' if args.quick else ''})")
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
