"""Guided vs random generation, side by side (python -m benchmarks.bench_coverage).

1. Branch coverage over steps: for each engine, in a fresh process (its own coverage.py
   collector over impl/, started before impl/ is imported), sequences 0, 1, 2, ... of
   one campaign (backend impl); after each sequence the steps so far and the impl/
   branch arcs reached. Printed: the arcs each engine reached within the same step
   budgets.
2. Time to detection per planted fault (benchmarks.bench_detect.detect: seconds from
   the campaign's start to the first report), `--examples` sequences per campaign, the
   median over `--seeds` seeds per fault, then the median and worst over the faults.

Wall-clock figures from a shared machine: compare the columns of one run.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
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


def arcs_within(points: list, budget: int) -> int:
    best = 0
    for steps, arcs in points:
        if steps > budget:
            break
        best = arcs
    return best


def main(argv=None) -> int:
    from benchmarks.bench_detect import INF, _fmt, detect
    from impl import faults
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sequences", type=int, default=200, help="sequences per coverage curve")
    ap.add_argument("--examples", type=int, default=100, help="sequences per detection campaign")
    ap.add_argument("--seeds", type=int, default=1, help="seeds per curve and per fault")
    ap.add_argument("--skip-detect", action="store_true", help="coverage curves only")
    ap.add_argument("faults", nargs="*", help="planted faults (default: all)")
    args = ap.parse_args(argv)

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
    print(f"\nseconds to the first report per planted fault ({args.examples} sequences, "
          f"median of {args.seeds} seed(s)):", flush=True)
    print(f"{'planted fault':<32}" + "".join(f"{e:>10}" for e in ENGINES), flush=True)
    table: dict = {e: [] for e in ENGINES}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            row = []
            for e in ENGINES:
                t = statistics.median(detect(name, e, s, args.examples, Path(tmp))[1]
                                      for s in range(args.seeds))
                table[e].append(t)
                row.append(t)
            print(f"{name:<32}" + "".join(f"{_fmt(x):>10}" for x in row), flush=True)
    for e, xs in table.items():
        caught = sum(x != INF for x in xs)
        print(f"{e:<8} caught {caught}/{len(xs)}; median {_fmt(statistics.median(xs)).strip()} s, "
              f"worst {_fmt(max(xs)).strip()} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
