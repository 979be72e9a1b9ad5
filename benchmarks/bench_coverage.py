"""Guided vs random generation, side by side (python -m benchmarks.bench_coverage).

1. Branch coverage over steps: for each engine, in a fresh process (its own coverage.py
   collector over impl/, started before impl/ is imported), sequences 0, 1, 2, ... of
   one campaign (backend impl); after each sequence the steps so far and the impl/
   branch arcs reached. Printed: the arcs each engine reached within the same step
   budgets.
2. Time to detection per planted fault: seconds from the campaign's start to the first
   report, and sequences run until then, `--examples` sequences per campaign (no
   shrinking), the median over `--seeds` seeds per fault, then the median and worst
   over the faults.

With `--backend sglang:V` (1 only): the release's branches (the modules `kvcheck coverage
--backend sglang:V` reports, the recorded findings accepted) each engine reaches within
the same step budgets (`--steps`). The release runs in its own server process, which
writes its coverage data only as it exits: at each budget the server is stopped (the
next sequence starts a new one), the data so far combined and counted.

Wall-clock figures from a shared machine: compare the columns of one run.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("walk", "guided")
BUDGETS = (500, 1000, 2000, 4000, 8000, 16000)

CURVE = """
import json, sys, coverage
cov = coverage.Coverage(branch=True, data_file=None, source=[{impl!r}])
cov.start()
from kvcheck.engines.campaign import Campaign, run_chunk
c = Campaign({engine!r}, {seed!r}, "impl")
steps, out = 0, []
for i in range({sequences!r}):
    res = run_chunk(c, i, 1)
    steps += res.stats.steps
    data = cov.get_data()
    out.append((steps, sum(len(data.arcs(f) or ()) for f in data.measured_files())))
cov.stop()
print(json.dumps(out))
"""


def curve(engine: str, seed: int, sequences: int) -> list:
    """[(steps so far, impl/ branch arcs reached)] after each sequence."""
    code = CURVE.format(impl=str(ROOT / "impl"), engine=engine, seed=seed, sequences=sequences)
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


SGLANG_CURVE = """
import json, os, sys
os.environ[{env!r}] = {rc!r}
from adapters.sglang import proxy
from kvcheck.coverage import sglang_branches
from kvcheck.engines.campaign import Campaign, run_chunk
c = Campaign({engine!r}, {seed!r}, {backend!r}, None, {accept!r})
steps, i, out = 0, 0, []
for budget in {budgets!r}:
    while steps < budget:
        steps += run_chunk(c, i, 1).stats.steps
        i += 1
    proxy._stop_all()
    out.append((steps, i, sglang_branches({rc!r})))
print(json.dumps(out))
"""


def sglang_curve(backend: str, engine: str, seed: int, budgets: tuple, work: Path) -> list:
    """[(steps, sequences, the release's branches reached)] at each step budget."""
    from adapters.sglang.findings import RELEASES
    from kvcheck.coverage import SGLANG_ENV, sglang_rcfile
    run_dir = work / f"{engine}-{seed}"
    run_dir.mkdir(parents=True)
    rc = sglang_rcfile(run_dir)
    accept = tuple(RELEASES.get(backend.split(":", 1)[1], ()))
    code = SGLANG_CURVE.format(env=SGLANG_ENV, rc=str(rc), engine=engine, seed=seed,
                               backend=backend, accept=accept, budgets=tuple(budgets))
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"{engine} seed {seed}: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def sglang_main(args) -> int:
    import tempfile
    budgets = tuple(int(b) for b in args.steps.split(","))
    print(f"{args.backend}: branches of the modules kvcheck coverage reports, reached within "
          f"a step budget (seeds 0..{args.seeds - 1}, side by side):", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-coverage-") as tmp:
        rows = {}
        for s in range(args.seeds):
            for e in ENGINES:
                rows[e, s] = sglang_curve(args.backend, e, s, budgets, Path(tmp))
                print(f"  {e} seed {s}: " + ", ".join(
                    f"{st} steps/{n} seq: {br}" for st, n, br in rows[e, s]), flush=True)
    print(f"{'steps':>8}" + "".join(f"{e:>10}" for e in ENGINES) + "   (median)")
    for k, b in enumerate(budgets):
        print(f"{b:>8}" + "".join(
            f"{statistics.median(rows[e, s][k][2] for s in range(args.seeds)):>10g}"
            for e in ENGINES))
    return 0


def arcs_within(points: list, budget: int) -> int:
    best = 0
    for steps, arcs in points:
        if steps > budget:
            break
        best = arcs
    return best


def first_report(fault: str, engine: str, seed: int, examples: int, out: Path) -> tuple:
    """(seconds to the first report, sequences run until then) of one campaign with
    `fault` planted (no shrinking); (INF, INF) when nothing was found."""
    from benchmarks.bench_detect import INF
    from kvcheck.fuzz import Console, fuzz
    rep = fuzz(None, seed, "impl", out / f"{engine}-{fault}-{seed}", rounds=examples,
               engine=engine, stop_on_first=True, planted=(fault,), shrink_replays=0,
               console=Console(quiet=True, prefix=f"[{engine} {fault}] "))
    if not rep.found:
        return INF, INF
    return rep.found[0].seconds_to_find, rep.found[0].index + 1


def main(argv=None) -> int:
    from benchmarks.bench_detect import INF, _fmt, fault_table
    from impl import faults
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sequences", type=int, default=200, help="sequences per coverage curve")
    ap.add_argument("--examples", type=int, default=100, help="sequences per detection campaign")
    ap.add_argument("--seeds", type=int, default=1, help="seeds per curve and per fault")
    ap.add_argument("--skip-detect", action="store_true", help="coverage curves only")
    ap.add_argument("--backend", default="impl",
                    help="impl, or sglang:V: the release's branches within --steps (no detection)")
    ap.add_argument("--steps", default="500,1000,2000", help="sglang: step budgets, ascending")
    ap.add_argument("faults", nargs="*", help="planted faults (default: all)")
    args = ap.parse_args(argv)
    if args.backend != "impl":
        return sglang_main(args)

    print(f"impl/ branch arcs reached within a step budget ({args.sequences} sequences, "
          f"median of {args.seeds} seed(s)):", flush=True)
    curves = {e: [curve(e, s, args.sequences) for s in range(args.seeds)] for e in ENGINES}
    print(f"{'steps':>8}" + "".join(f"{e:>10}" for e in ENGINES))
    for b in BUDGETS:
        if all(c[-1][0] < b for cs in curves.values() for c in cs):
            break
        print(f"{b:>8}" + "".join(f"{statistics.median(arcs_within(c, b) for c in curves[e]):>10g}"
                                  for e in ENGINES))
    print(f"{'all':>8}" + "".join(f"{statistics.median(c[-1][1] for c in curves[e]):>10g}"
                                  for e in ENGINES) + "   (steps: " + ", ".join(
        f"{e} {statistics.median(c[-1][0] for c in curves[e]):g}" for e in ENGINES) + ")")
    if args.skip_detect:
        return 0

    names = args.faults or sorted(faults.FAULTS)
    print(f"\nper planted fault: seconds to the first report / sequences run until then "
          f"({args.examples} sequences, median of {args.seeds} seed(s)):", flush=True)
    table = fault_table(
        names, ENGINES, args.seeds,
        lambda name, e, k, tmp: first_report(name, e, k, args.examples, tmp),
        lambda med: [f"{_fmt(med[0]).strip()} / {med[1]:g}"], ENGINES)
    for e, rows in table.items():
        caught = sum(r[0] != INF for r in rows)
        secs, seqs = [r[0] for r in rows], [r[1] for r in rows]
        print(f"{e:<8} caught {caught}/{len(rows)}; seconds median {_fmt(statistics.median(secs)).strip()}, "
              f"worst {_fmt(max(secs)).strip()}; sequences median {statistics.median(seqs):g}, "
              f"worst {max(seqs):g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
