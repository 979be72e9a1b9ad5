"""Differential steps per second, layer by layer and engine by engine
(python -m benchmarks.bench_diff).

Hypothesis machine (same rules, same seed, same number of sequences):
  1. an empty machine: the rules draw their arguments and do nothing (the state never
     advances, so fewer rules are enabled: a floor, not a like-for-like row);
  2. the spec's transitions only (guard + step);
  3. the spec alone as checked: step + abstract view + every invariant;
  4. spec + impl on the current device: also impl's step, its abstract view, concrete
     checks, invariants on impl's side and the canonical comparison.
Walk engine (kvcheck.engines.walk, same Lockstep): rows 3 and 4 again.
Rates are per CPU-second of this process (the machine may be shared: compare rows of
one run, not runs).

`--against REV` (e.g. main) prints only the walk row, spec + impl, for git revision REV
(exported with `git archive` into a temporary folder) and for this tree, in alternating
subprocesses, `--rounds` times each: the before/after figure of one run, side by side.
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

from hypothesis import Phase, Verbosity, seed, settings
from hypothesis.stateful import run_state_machine_as_test

from kvcheck.engines import hypothesis_machine as M
from kvcheck.engines.stats import Stats
from kvcheck.engines.walk import walk


def run(machine, examples: int, s: int) -> tuple[float, int, int]:
    M.STATS.clear()
    seed(s)(machine)
    t0 = time.process_time()
    run_state_machine_as_test(machine, settings=settings(
        settings.get_profile("kvcheck-fuzz"), max_examples=examples, phases=[Phase.generate],
        verbosity=Verbosity.quiet))
    return time.process_time() - t0, M.STATS.steps, M.STATS.sequences


def run_walk(factory, examples: int, s: int) -> tuple[float, int, int]:
    stats = Stats()
    t0 = time.process_time()
    for i in range(examples):
        walk(s, i, factory, "impl", stats)
    return time.process_time() - t0, stats.steps, stats.sequences


ROOT = Path(__file__).resolve().parent.parent
WALK_ROW = ("import json, sys; from benchmarks.bench_diff import run_walk; "
            "from kvcheck.adapters.impl import ImplBackend; "
            "print(json.dumps(run_walk(ImplBackend, int(sys.argv[1]), int(sys.argv[2]))))")
"""The walk row in a fresh interpreter of one source tree (main's run_walk has the same
signature: (factory, examples, seed) -> (cpu seconds, steps, sequences))."""


def walk_rate_in(tree: Path, examples: int, s: int) -> float:
    """Spec + impl walk steps per CPU-second, measured by a subprocess that imports
    `tree`'s sources."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    p = subprocess.run([sys.executable, "-c", WALK_ROW, str(examples), str(s)], cwd=tree,
                       env=env, capture_output=True, text=True, check=True)
    dt, steps, _ = json.loads(p.stdout.strip().splitlines()[-1])
    return steps / dt


def export_rev(rev: str, dest: Path) -> None:
    """`git archive rev` unpacked into dest (the revision's tracked sources)."""
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)


def side_by_side(rev: str, examples: int, s: int, rounds: int, out=print) -> dict:
    """{rev: [rates], "this tree": [rates]}: walk steps per CPU-second, the two trees
    alternating round by round (a shared machine's load hits both alike)."""
    res: dict = {rev: [], "this tree": []}
    with tempfile.TemporaryDirectory() as tmp:
        export_rev(rev, Path(tmp))
        for k in range(rounds):
            for name, tree in ((rev, Path(tmp)), ("this tree", ROOT)):
                res[name].append(walk_rate_in(tree, examples, s))
                out(f"round {k + 1}: {name:<10} {res[name][-1]:7.0f} steps/cpu-s", flush=True)
    return res


def print_side_by_side(res: dict, out=print) -> None:
    (a, ra), (b, rb) = res.items()
    ma, mb = statistics.median(ra), statistics.median(rb)
    out(f"walk, spec + impl steps per CPU-second, median of {len(ra)}: "
        f"{a} {ma:.0f}, {b} {mb:.0f} (x{mb / ma:.2f}; load average {os.getloadavg()[0]:.1f})")


def measure(examples: int, s: int) -> dict:
    """{row name: (cpu seconds, steps, sequences)} for every row of the table."""
    from kvcheck.adapters.impl import ImplBackend
    from kvcheck.impl.device import resolve_device

    class Empty(M.make_machine(None)):
        def apply(self, op):            # draws happen in the rules; nothing is applied
            M.STATS.steps += 1

    class StepOnly(M.make_machine(None)):
        def apply(self, op):            # the model's transition only: no view, no invariant
            if M.enabled(self.s, op):
                self.lock.state, _ = M.step(self.s, op)
                M.STATS.steps += 1

    dev = resolve_device(None)
    rows = {"hypothesis: empty machine (same rules)": lambda: run(Empty, examples, s),
            "hypothesis: spec transitions only": lambda: run(StepOnly, examples, s),
            "hypothesis: spec alone (step, view, invariants)": lambda: run(M.make_machine(None), examples, s),
            f"hypothesis: spec + impl on {dev}": lambda: run(M.make_machine(ImplBackend, "impl"), examples, s),
            "walk: spec alone (step, view, invariants)": lambda: run_walk(None, examples, s),
            f"walk: spec + impl on {dev}": lambda: run_walk(ImplBackend, examples, s)}
    return {name: fn() for name, fn in rows.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=150)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--against", metavar="REV",
                    help="only the walk row: git revision REV vs this tree, side by side")
    ap.add_argument("--rounds", type=int, default=3, help="with --against: runs of each tree")
    args = ap.parse_args(argv)
    if args.examples < 1 or args.rounds < 1:
        ap.error("--examples and --rounds must be at least 1")
    if args.against:
        try:
            res = side_by_side(args.against, args.examples, args.seed, args.rounds)
        except subprocess.CalledProcessError as e:
            print(f"bench_diff: --against {args.against}: {' '.join(map(str, e.cmd[:2]))} failed: "
                  f"{(e.stderr or b'').strip()[-300:]!r}", file=sys.stderr)
            return 2
        print_side_by_side(res)
        return 0
    print(f"{'layer':<50} {'cpu s':>7} {'steps':>7} {'steps/cpu-s':>12} {'ms/step':>8}")
    res = measure(args.examples, args.seed)
    for name, (dt, steps, seqs) in res.items():
        rate = steps / dt if dt else 0
        print(f"{name:<50} {dt:7.2f} {steps:7d} {rate:12.0f} {1000 * dt / max(steps, 1):8.3f}")
    hyp = [v for k, v in res.items() if k.startswith("hypothesis: spec + impl")][0]
    wlk = [v for k, v in res.items() if k.startswith("walk: spec + impl")][0]
    print(f"walk / hypothesis, spec + impl steps per CPU-second: "
          f"x{(wlk[1] / wlk[0]) / (hyp[1] / hyp[0]):.1f}")
    print("(hypothesis rows: rules draw the same arguments; 'steps' counts applied operations)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
