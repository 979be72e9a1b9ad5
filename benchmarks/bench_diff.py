"""Differential steps per second, layer by layer (python -m benchmarks.bench_diff).

Same rules, same seed, same number of sequences:
  1. an empty Hypothesis machine: the rules draw their arguments and do nothing (the
     state never advances, so fewer rules are enabled: a floor, not a like-for-like row);
  2. the spec's transitions only (guard + step);
  3. the spec alone as checked: step + abstract view + every invariant;
  4. spec + impl on the current device: also impl's step, its abstract view, concrete
     checks, invariants on impl's side and the canonical comparison.
The difference between rows is the cost of each layer.
"""
from __future__ import annotations

import argparse
import time

from hypothesis import Phase, Verbosity, seed, settings
from hypothesis.stateful import run_state_machine_as_test

from stateful_tests import machine as M
from stateful_tests import profiles  # noqa: F401


def run(machine, examples: int, s: int) -> tuple[float, int, int]:
    M.STEPS.clear()
    seed(s)(machine)
    t0 = time.perf_counter()
    run_state_machine_as_test(machine, settings=settings(
        settings.get_profile("kvcheck-fuzz"), max_examples=examples, phases=[Phase.generate],
        verbosity=Verbosity.quiet))
    return time.perf_counter() - t0, M.STEPS["steps"], M.STEPS["sequences"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=150)
    ap.add_argument("--seed", type=int, default=11)
    args = ap.parse_args(argv)
    from adapters.impl import ImplBackend
    from impl.device import resolve_device

    class Empty(M.make_machine(None)):
        def apply(self, op):            # draws happen in the rules; nothing is applied
            M.STEPS["steps"] += 1

    class StepOnly(M.make_machine(None)):
        def apply(self, op):            # the model's transition only: no view, no invariant
            if M.enabled(self.s, op):
                self.lock.state, _ = M.step(self.s, op)
                M.STEPS["steps"] += 1

    rows = [("empty Hypothesis machine (same rules)", Empty),
            ("spec transitions only", StepOnly),
            ("spec alone (step, view, invariants)", M.make_machine(None)),
            (f"spec + impl on {resolve_device(None)}", M.make_machine(ImplBackend, "impl"))]
    print(f"{'layer':<42} {'seconds':>8} {'steps':>7} {'steps/s':>9} {'ms/step':>8}")
    base = None
    for name, machine in rows:
        dt, steps, seqs = run(machine, args.examples, args.seed)
        rate = steps / dt if dt else 0
        print(f"{name:<42} {dt:8.2f} {steps:7d} {rate:9.0f} {1000 * dt / max(steps, 1):8.3f}")
        base = base or (dt, steps)
    print("(rules draw the same arguments in each row; 'steps' counts rule bodies that reached apply)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
