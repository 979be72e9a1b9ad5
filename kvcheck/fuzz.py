"""Randomised differential runs with a time budget (`kvcheck fuzz`, `kvcheck selftest`).

Rounds of the Hypothesis state machine (profile `kvcheck-fuzz`: not derandomised,
each round seeded from the recorded seed, so a run is reproducible with --seed). A
failure's operations are shrunk on the trace (kvcheck.shrink), written as a trace
file at once (so an interrupt loses nothing), deduplicated by (invariant, side), and
printed with the command that replays it.
"""
from __future__ import annotations

import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from hypothesis import Phase, Verbosity, seed as hseed, settings
from hypothesis.stateful import run_state_machine_as_test

from kvcheck.backends import resolve
from kvcheck.checker import run_ops
from kvcheck.shrink import shrink
from kvcheck.trace import Expect, Trace
from spec.ops import OP_NAMES
from stateful_tests import machine as M
from stateful_tests import profiles  # noqa: F401  (registers the profiles)

ROUND_EXAMPLES = 20


@dataclass
class Found:
    id: str
    side: str
    step: int
    path: Path
    length: int
    original_length: int
    seconds_to_find: float
    summary: str


@dataclass
class FuzzReport:
    seed: int
    backend: str
    seconds: float = 0.0
    sequences: int = 0
    steps: int = 0
    coverage: Counter = field(default_factory=Counter)
    outcomes: Counter = field(default_factory=Counter)
    found: list = field(default_factory=list)
    duplicates: int = 0
    interrupted: bool = False

    def render(self) -> str:
        rate = self.steps / self.seconds if self.seconds else 0.0
        lines = [f"fuzz: backend {self.backend}, seed {self.seed}, {self.seconds:.1f} s"
                 f"{' (interrupted)' if self.interrupted else ''}",
                 f"  sequences {self.sequences}, steps {self.steps}, {rate:.0f} steps/s",
                 "  operation coverage (applied steps):"]
        width = max(len(n) for n in OP_NAMES)
        for n in OP_NAMES:
            outs = ", ".join(f"{k.split(':', 1)[1]} {v}" for k, v in sorted(self.outcomes.items())
                             if k.split(":", 1)[0] == n)
            lines.append(f"    {n:<{width}} {self.coverage[n]:>7}  {outs}")
        missing = [n for n in OP_NAMES if not self.coverage[n]]
        if missing:
            lines.append(f"  NOT REACHED: {', '.join(missing)}")
        if not self.found:
            lines.append("  no failure found")
        for f in self.found:
            lines.append(f"  FAILURE {f.id} on {f.side} at step {f.step} "
                         f"({f.length} ops, shrunk from {f.original_length}; found after "
                         f"{f.seconds_to_find:.1f} s): {f.summary}")
            lines.append(f"    trace:  {f.path}")
            lines.append(f"    replay: kvcheck replay {f.path} --backend {self.backend}")
            lines.append(f"    keep it: mv {f.path} stateful_tests/regressions/ "
                         "(replayed by make check and make test from then on)")
        if self.duplicates:
            lines.append(f"  ({self.duplicates} more failure(s) with an already-reported invariant)")
        return "\n".join(lines)


def _log(msg: str, quiet: bool) -> None:
    if not quiet:
        print(msg, file=sys.stderr, flush=True)


def fuzz(seconds: float, seed: Optional[int] = None, backend: str = "impl",
         out_dir: str | Path = "failures", *, stop_on_first: bool = False,
         quiet: bool = False, shrink_budget_s: float = 60.0, label: str = "",
         accept: tuple = ()) -> FuzzReport:
    factory, bname = resolve(backend)
    if seed is None:
        seed = random.SystemRandom().randrange(2**32)
    report = FuzzReport(seed=seed, backend=bname)
    _log(f"kvcheck fuzz: backend {bname}, seed {seed} (rerun with --seed {seed}), "
         f"{seconds:g} s", quiet)
    from kvcheck.backends import known_findings, release_era
    skip = known_findings(backend, accept)
    era = release_era(backend)
    if skip is not None:
        _log(f"  leaving out operations that trigger the findings recorded for {bname} "
             "(docs/upstream-findings.md; their traces stay in stateful_tests/upstream/)", quiet)
    machine = M.make_machine(factory, bname,
                             M.configs(era=era, accept=accept) if era or accept else None, skip=skip)
    base = settings(settings.get_profile("kvcheck-fuzz"), max_examples=ROUND_EXAMPLES,
                    phases=[Phase.generate], verbosity=Verbosity.quiet, print_blob=False)
    M.COVERAGE.clear(), M.OUTCOMES.clear(), M.STEPS.clear()
    seen: set = set()
    start = time.monotonic()
    last_progress = start
    rnd = 0
    out_dir = Path(out_dir)
    try:
        while time.monotonic() - start < seconds:
            M.LAST_FAILURE.clear()
            hseed(seed * 1_000_003 + rnd)(machine)
            rnd += 1
            try:
                run_state_machine_as_test(machine, settings=base)
            except Exception:
                if not M.LAST_FAILURE:
                    raise
                found_at = time.monotonic() - start
                f = M.LAST_FAILURE["failure"]
                key = (f.id, f.side)
                if key in seen:
                    report.duplicates += 1
                else:
                    seen.add(key)
                    _log(f"  [{found_at:6.1f}s] {f.id} on {f.side} at step {f.step}: shrinking "
                         f"{len(M.LAST_FAILURE['ops'])} ops...", quiet)
                    found = _shrink_and_write(M.LAST_FAILURE["config"], M.LAST_FAILURE["ops"], f,
                                              factory, bname, out_dir, seed, rnd, found_at,
                                              shrink_budget_s, label)
                    report.found.append(found)
                    _log(f"           -> {found.length} ops, {found.path}", quiet)
                    if stop_on_first:
                        break
            now = time.monotonic()
            if now - last_progress >= 5:
                last_progress = now
                el = now - start
                _log(f"  [{el:6.1f}s] sequences {M.STEPS['sequences']}, steps {M.STEPS['steps']} "
                     f"({M.STEPS['steps'] / el:.0f}/s), failures {len(report.found)}", quiet)
    except KeyboardInterrupt:
        report.interrupted = True
    report.seconds = time.monotonic() - start
    report.sequences = M.STEPS["sequences"]
    report.steps = M.STEPS["steps"]
    report.coverage = Counter(M.COVERAGE)
    report.outcomes = Counter(M.OUTCOMES)
    return report


def _shrink_and_write(cfg, ops, failure, factory, bname, out_dir, seed, rnd, found_at,
                      budget, label) -> Found:
    def outcome(candidate):
        backend = factory(cfg) if factory else None
        try:
            return run_ops(cfg, candidate, backend, backend_name=bname).failure
        finally:
            if backend is not None and hasattr(backend, "close"):
                backend.close()

    def fails_same(candidate) -> bool:
        f = outcome(candidate)
        return f is not None and f.id == failure.id and f.side == failure.side

    name = f"{failure.id}-{failure.side}-seed{seed}-r{rnd - 1}.json"
    meta = {"source": "fuzz", "seed": seed, "round": rnd - 1, "backend": bname,
            **({"planted_fault": label} if label else {})}
    # written before shrinking, so an interrupt during the shrink still leaves a trace
    Trace(cfg, list(ops), Expect("violation", failure.id, failure.step, failure.side),
          {**meta, "shrunk": False}).save(Path(out_dir) / name)
    small = shrink(ops, fails_same, budget_s=budget) if fails_same(ops) else ops
    final = outcome(small) or failure
    summary = str(final.violations[0]) if final.violations else \
        f"{final.id} {final.name}" + (f": {final.details[0]}" if final.details else "")
    trace = Trace(cfg, small, Expect("violation", final.id, final.step, final.side),
                  {**meta, "summary": summary})
    path = trace.save(Path(out_dir) / name)
    return Found(final.id, final.side, final.step, path, len(small), len(ops), found_at, summary)
