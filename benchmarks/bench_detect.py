"""Detection per planted fault, walk engine vs Hypothesis engine, in `make check`'s
differential configuration (python -m benchmarks.bench_detect).

For every planted fault of impl/faults.py and each engine: the campaign `kvcheck check`
runs (backend impl, seed kvcheck.check.CHECK_SEED, a count budget of --examples
sequences, stop at the first failure, kvcheck's shrinker with its default replay
budget), timed from the campaign's start:
  gen    seconds until the failing sequence was generated and reached the driver,
  report seconds until the first report (unshrunk trace written and printed),
  shrunk seconds until the shrunk trace was written,
then the median and worst of each over the faults. `--seeds N` repeats each campaign
with seeds CHECK_SEED..CHECK_SEED+N-1 and takes the per-fault median. Wall-clock
figures: on a shared machine, compare the two engines' columns of one run.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from kvcheck.check import CHECK_SEED
from kvcheck.engines import ENGINES
from kvcheck.fuzz import Console, fuzz

INF = float("inf")


def detect(fault: str, engine: str, seed: int, examples: int, out: Path) -> tuple:
    """(gen, report, shrunk) seconds for one campaign; INF where nothing was found."""
    rep = fuzz(None, seed, "impl", out / f"{engine}-{fault}-{seed}", rounds=examples,
               engine=engine, stop_on_first=True, planted=(fault,),
               console=Console(quiet=True, prefix=f"[{engine} {fault}] "))
    if not rep.found:
        return INF, INF, INF
    f = rep.found[0]
    return f.seconds_generated, f.seconds_to_find, f.seconds_to_shrunk or INF


def _fmt(x: float) -> str:
    return "  missed" if x == INF else f"{x:8.2f}"


def fault_table(names: list, engines: list, seeds: int, run, cells, header: list,
                out=print) -> dict:
    """{engine: [the per-column median over seeds 0..seeds-1 of run(fault, engine, k, tmp),
    per fault in names]}; each fault's row (`cells(median)`, one string per column of
    `header`) is printed as it completes."""
    out(f"{'planted fault':<32}" + "".join(f"{c:>18}" for c in header), flush=True)
    table: dict = {e: [] for e in engines}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            row = []
            for e in engines:
                runs = [run(name, e, k, Path(tmp)) for k in range(seeds)]
                med = tuple(statistics.median(col) for col in zip(*runs))
                table[e].append(med)
                row.extend(cells(med))
            out(f"{name:<32}" + "".join(f"{x:>18}" for x in row), flush=True)
    return table


def measure(names: list, engines: list, examples: int, seeds: int = 1, out=print) -> dict:
    """{engine: [(gen, report, shrunk) median over the seeds, per fault in names]}; each
    fault's row is printed as it completes."""
    return fault_table(
        names, engines, seeds,
        lambda name, e, k, tmp: detect(name, e, CHECK_SEED + k, examples, tmp),
        lambda med: [_fmt(x) for x in med],
        [f"{e} {k}" for e in engines for k in ("gen", "report", "shrunk")], out)


def summary_lines(table: dict) -> list:
    """Per engine: faults caught, median and worst seconds to generation, report, shrunk."""
    lines = []
    for e, rows in table.items():
        caught = [r for r in rows if r[1] != INF]
        line = f"{e:<11} caught {len(caught)}/{len(rows)}"
        for i, what in ((0, "generated"), (1, "first report"), (2, "shrunk")):
            xs = [r[i] for r in rows]
            line += f"; {what}: median {_fmt(statistics.median(xs)).strip()} s, worst {_fmt(max(xs)).strip()} s"
        lat = [r[1] - r[0] for r in caught]
        if lat:
            line += f"; report latency after generation: worst {max(lat):.3f} s"
        lines.append(line)
    return lines


def main(argv=None) -> int:
    from kvcheck.impl import faults
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=100, help="sequences per campaign (check's default)")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--engines", type=lambda v: v.split(","), default=list(ENGINES),
                    help=f"comma-separated, of {', '.join(ENGINES)} (default: both)")
    ap.add_argument("faults", nargs="*", help="planted faults (default: all)")
    args = ap.parse_args(argv)
    names = args.faults or sorted(faults.FAULTS)
    bad = [e for e in args.engines if e not in ENGINES]
    if bad:
        ap.error(f"--engines: unknown {bad}; known: {', '.join(ENGINES)}")
    table = measure(names, args.engines, args.examples, args.seeds)
    print()
    print("\n".join(summary_lines(table)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
