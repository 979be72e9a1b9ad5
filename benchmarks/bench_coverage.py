"""Guided vs random generation, side by side (python -m benchmarks.bench_coverage).

1. Branch coverage over steps: for each engine, in a fresh process (its own coverage.py
   collector over impl/, started before impl/ is imported), sequences 0, 1, 2, ... of
   one campaign (backend impl); after each sequence the steps so far and the impl/
   branch arcs reached. Printed: the arcs each engine reached within the same step
   budgets.
2. Time to detection per planted fault: seconds from the campaign's start to the first
   report, and sequences run until then, `--examples` sequences per campaign (no
   shrinking), the median over `--seeds` seeds per fault, then the median and worst
   over the faults. The campaigns' FOUND lines are not printed (`--verbose` prints them).
3. `--tune [SETTINGS]`: the coverage curves of the guided engine under other settings
   of its module constants too, a column each (default: each choice undone alone,
   TUNE), to see which choice the gain comes from.

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
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("walk", "guided")
BUDGETS = (500, 1000, 2000, 4000, 8000, 16000)

CURVE = """
import json, sys, coverage
cov = coverage.Coverage(branch=True, data_file=None, source=[{impl!r}])
cov.start()
from kvcheck.engines import guided
for k, v in {settings!r}.items():
    assert hasattr(guided, k), k
    setattr(guided, k, v)
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


def curve(engine: str, seed: int, sequences: int, settings: Optional[dict] = None) -> list:
    """[(steps so far, impl/ branch arcs reached)] after each sequence; `settings`: the
    guided engine's module constants to set first (`--tune`)."""
    code = CURVE.format(impl=str(ROOT / "impl"), engine=engine, seed=seed, sequences=sequences,
                        settings=settings or {})
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


SGLANG_CURVE = """
import json, os, sys
os.environ[{env!r}] = {rc!r}
from kvcheck.adapters.sglang import proxy
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
    from kvcheck.adapters.sglang.findings import RELEASES
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


TUNE = ("PREVIEW=1", "EFFECTS=False", "MUTATE_SHARE=0", "MUTATE_SHARE=0.3",
        "DERIVE_MUTATIONS=('extend','splice','argument','swap','config')")
"""`--tune`'s default: each of the guided engine's choices undone alone (fresh walks not
spread, no effect features, no derived sequences, twice the derived share, the
configuration mutated too)."""


def parse_settings(spec: str) -> dict:
    """"A=1,B=(2,3)" -> {"A": 1, "B": (2, 3)} (values are Python literals)."""
    import ast
    out, key = {}, None
    for part in spec.split(","):
        if "=" in part and part.split("=", 1)[0].isidentifier():
            key, val = part.split("=", 1)
            out[key] = val
        else:
            out[key] += "," + part
    return {k: ast.literal_eval(v) for k, v in out.items()}


def print_curves(curves: dict, seeds: int) -> None:
    """Each run's median arcs within each step budget, side by side (one row per budget,
    with the seeds in which guided reached more than walk), then after all sequences."""
    names = list(curves)
    print(f"{'steps':>8}" + "".join(f"{n:>10}" for n in names[:2]) +
          "".join(f"  {n}" for n in names[2:]))
    for b in BUDGETS:
        if all(c[-1][0] < b for cs in curves.values() for c in cs):
            break
        med = [statistics.median(arcs_within(c, b) for c in curves[n]) for n in names]
        wins = sum(arcs_within(g, b) > arcs_within(w, b)
                   for g, w in zip(curves["guided"], curves["walk"]))
        print(f"{b:>8}" + "".join(f"{m:>10g}" for m in med[:2]) +
              "".join(f"  {m:>{len(n)}g}" for n, m in zip(names[2:], med[2:])) +
              f"   guided ahead in {wins}/{seeds} seeds")
    print(f"{'all':>8}" + "".join(f"{statistics.median(c[-1][1] for c in curves[n]):>10g}"
                                  for n in names[:2]) + "   (steps: " + ", ".join(
        f"{n} {statistics.median(c[-1][0] for c in curves[n]):g}" for n in names) + ")")


def arcs_within(points: list, budget: int) -> int:
    best = 0
    for steps, arcs in points:
        if steps > budget:
            break
        best = arcs
    return best


def first_report(fault: str, engine: str, seed: int, examples: int, out: Path,
                 verbose: bool = False) -> tuple:
    """(seconds to the first report, sequences run until then) of one campaign with
    `fault` planted (no shrinking); (INF, INF) when nothing was found. Its FOUND lines
    are printed only when `verbose` (the table has the figures)."""
    from benchmarks.bench_detect import INF
    from kvcheck.fuzz import Console, fuzz
    rep = fuzz(None, seed, "impl", out / f"{engine}-{fault}-{seed}", rounds=examples,
               engine=engine, stop_on_first=True, planted=(fault,), shrink_replays=0,
               console=Console(quiet=True, silent=not verbose, prefix=f"[{engine} {fault}] "))
    if not rep.found:
        return INF, INF
    return rep.found[0].seconds_to_find, rep.found[0].index + 1


def main(argv=None) -> int:
    from benchmarks.bench_detect import INF, _fmt, fault_table
    from kvcheck.impl import faults
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sequences", type=int, default=200, help="sequences per coverage curve")
    ap.add_argument("--examples", type=int, default=100, help="sequences per detection campaign")
    ap.add_argument("--seeds", type=int, default=1, help="seeds per curve and per fault")
    ap.add_argument("--skip-detect", action="store_true", help="coverage curves only")
    ap.add_argument("--backend", default="impl",
                    help="impl, or sglang:V: the release's branches within --steps (no detection)")
    ap.add_argument("--steps", default="500,1000,2000", help="sglang: step budgets, ascending")
    ap.add_argument("--tune", nargs="?", const=";".join(TUNE), metavar="SETTINGS",
                    help="coverage curves of the guided engine under other settings too, "
                         "';'-separated, each ATTR=VALUE[,ATTR=VALUE] of "
                         "kvcheck.engines.guided (default: the ablations in TUNE)")
    ap.add_argument("--verbose", action="store_true", help="print each campaign's FOUND lines")
    ap.add_argument("faults", nargs="*", help="planted faults (default: all)")
    args = ap.parse_args(argv)
    if args.backend != "impl":
        return sglang_main(args)

    print(f"impl/ branch arcs reached within a step budget ({args.sequences} sequences, "
          f"median of {args.seeds} seed(s)):", flush=True)
    runs = {e: (e, {}) for e in ENGINES}
    for spec in (args.tune.split(";") if args.tune else ()):
        runs[f"g:{spec}"] = ("guided", parse_settings(spec))
    curves = {name: [curve(e, s, args.sequences, st) for s in range(args.seeds)]
              for name, (e, st) in runs.items()}
    print_curves(curves, args.seeds)
    if args.skip_detect:
        return 0

    names = args.faults or sorted(faults.FAULTS)
    print(f"\nper planted fault: seconds to the first report / sequences run until then "
          f"({args.examples} sequences, median of {args.seeds} seed(s)):", flush=True)
    table = fault_table(
        names, ENGINES, args.seeds,
        lambda name, e, k, tmp: first_report(name, e, k, args.examples, tmp, args.verbose),
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
