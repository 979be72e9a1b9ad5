"""`kvcheck replay`: one trace on the spec and a backend, step by step, read like a
debugger: per step the operation, both outcomes and what changed (raw page and row ids,
stable through the trace); at the failing step the full state of both sides with the
differing fields marked. `--state N`, `--grid`, `--html`, `--emit-pytest` and `--itf`
give the other views of the same run (kvcheck.render, kvcheck.html_report,
kvcheck.emit_pytest, kvcheck.itf)."""
from __future__ import annotations

import json
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Optional

from kvcheck.checker import Lockstep, RunResult
from kvcheck.errors import UsageError


@dataclass
class ReplayResult(RunResult):
    """A run with every step's record, the failing one included, and the states
    before step 0: `states(side)` is [initial, after step 0, after step 1, ...]."""
    backend_name: str = "spec"
    initial: tuple = (None, None)      # (spec, backend) AbstractState before step 0

    @property
    def sides(self) -> tuple:
        return ("spec",) if self.backend_name == "spec" else ("spec", self.backend_name)

    def states(self, side: str) -> list:
        if side == "spec":
            return [self.initial[0]] + [r.spec_state for r in self.records]
        return [self.initial[1]] + [r.backend_state for r in self.records]

    def state_at(self, side: str, step: int):
        """The state after step `step` (-1: before step 0)."""
        return self.states(side)[step + 1]


def expected_failure(exp, backend_name: str) -> Optional[tuple]:
    """(invariant, step or None, side or None) that the trace expects on this backend,
    or None where it expects every step to pass (a trace about another backend passes
    here)."""
    if exp.result == "pass" or exp.backend not in (None, "spec", backend_name):
        return None
    return exp.invariant, exp.step, exp.backend


def matches_expectation(exp, failure, backend_name: str) -> bool:
    """Whether a run's first failure (or None) is what the trace expects."""
    want = expected_failure(exp, backend_name)
    if failure is None or want is None:
        return failure is None and want is None
    inv, step, side = want
    return inv == failure.id and step in (None, failure.step) and side in (None, failure.side)


def run_replay(trace, backend_name: str, on_step=None) -> ReplayResult:
    """Run the trace on the spec and the named backend (kvcheck.backends) in lockstep
    until the first failure, then, when its config says `drain`, the scheduler alone to
    idle; `on_step(record, failure, result)` after every step."""
    from kvcheck.backends import resolve
    factory, bname = resolve(backend_name)
    backend = factory(trace.config) if factory else None
    try:
        lock = Lockstep(trace.config, backend, bname)
        res = ReplayResult(0, None, [], backend_name=bname,
                           initial=(lock.prev, backend.abstract() if backend is not None else None))
        for op in trace.ops:
            rec, fail = lock.apply(op)
            res.records.append(rec)
            res.failure, res.steps = fail, rec.index + (fail is None)
            if on_step is not None:
                on_step(rec, fail, res)
            if fail is not None:
                break
        if res.failure is None and lock.beyond is None and trace.config.drain:
            drained, fail = lock.drain()        # the scheduler alone, to idle (P1)
            for rec in drained:
                res.records.append(rec)
                last = rec is drained[-1] and fail is not None
                res.failure, res.steps = (fail, rec.index) if last else (None, rec.index + 1)
                if on_step is not None:
                    on_step(rec, fail if last else None, res)
        res.beyond = lock.beyond
    finally:
        if backend is not None and hasattr(backend, "close"):
            backend.close()
    return res


PROGRESS_OPS = 1_000
"""A quiet replay of a trace longer than this prints a progress line every PROGRESS_S."""
PROGRESS_S = 5.0


def _progress(total: int):
    """on_step for a quiet replay: 'replay: step N of M' on stderr every PROGRESS_S."""
    import sys
    import time
    t0 = last = time.monotonic()

    def tick(rec, fail, res):
        nonlocal last
        now = time.monotonic()
        if now - last >= PROGRESS_S:
            last = now
            print(f"  replay: step {rec.index + 1:,} of {total:,}, {now - t0:.0f} s",
                  file=sys.stderr, flush=True)
    return tick


def replay_trace(trace, backend_name: str, *, verbose: bool = True, out=print,
                 progress: bool = False):
    """Run one trace; returns (ReplayResult, matches_expectation). Verbose: print each
    step as it runs (kvcheck.render); else, with `progress`, a progress line on stderr
    every PROGRESS_S for a trace of over PROGRESS_OPS operations."""
    def print_step(rec, fail, res):
        for line in step_report(res, rec, fail):
            out(line)
    if verbose:
        out(f"config: {json.dumps(trace.config.to_json())}")
        out(f"backend: {backend_name}; {len(trace.ops)} operations")
    quiet_step = _progress(len(trace.ops)) if progress and len(trace.ops) > PROGRESS_OPS else None
    res = run_replay(trace, backend_name, print_step if verbose else quiet_step)
    if verbose and res.beyond is not None:
        out(res.beyond.render() + "\n  (nothing was compared from that step on)")
    return res, matches_expectation(trace.expect, res.failure, res.backend_name)


def step_report(res: ReplayResult, rec, fail) -> list[str]:
    """One step as text: the operation, both outcomes, what changed on each side (once
    when both changed alike); at a failure, the full state of both sides."""
    from kvcheck.render import step_lines
    i, b = rec.index, res.backend_name
    outs = f"spec {rec.outcome or '-'}"
    if b != "spec":
        outs += f" | {b} {rec.backend_outcome if rec.backend_outcome is not None else '-'}"
    lines = [f"step {i:3d}  {rec.op}  -> {outs}"]
    per_side = {side: step_lines(res.state_at(side, i - 1), res.state_at(side, i))
                for side in res.sides
                if res.state_at(side, i - 1) is not None and res.state_at(side, i) is not None}
    blocks = list(per_side.values())
    if len(blocks) == 2 and blocks[0] == blocks[1]:
        per_side = {"": blocks[0]}
    indent = "          "
    for side, block in per_side.items():
        if not side or len(res.sides) == 1:
            lines += [indent + x for x in block]
            continue
        other = [x for s, blk in per_side.items() if s != side for x in blk]
        marked = len(per_side) > 1
        lines.append(f"{indent}{side}{' (* only this side)' if marked else ''}:"
                     + ("" if block else " no change"))
        lines += [f"{indent}{'* ' if marked and x not in other else '  '}{x}" for x in block]
    if fail is not None:
        lines += [f"          full state after step {i}, where it fails:"] + \
            ["        " + x for x in full_state_lines(res, i)]
    return lines


def full_state_lines(res: ReplayResult, step: int) -> list[str]:
    """The full state of every side after `step`, side by side when there are two."""
    from kvcheck.render import state_lines
    a = res.state_at("spec", step)
    if len(res.sides) == 1:
        return state_lines(a)
    b = res.state_at(res.backend_name, step)
    if b is None:
        return [f"  ({res.backend_name} has no state at this step; the spec's:)"] + state_lines(a)
    return state_lines(a, b, res.sides)


def step_labels(res: ReplayResult) -> list:
    return ["init"] + [r.index for r in res.records]


def replay_fault(flag, trace, backend_name: str) -> tuple:
    """(planted fault to switch on or None, a line saying so)."""
    from kvcheck.impl import faults
    name = flag or trace.meta.get("planted_fault")
    if name is None:
        return None, ""
    if name not in faults.FAULTS:
        where = "--plant" if flag else "#meta.planted_fault"
        raise UsageError(f"{where}: unknown planted fault {name!r}; known: "
                         f"{', '.join(sorted(faults.FAULTS))}")
    if backend_name != "impl":
        if flag:
            raise UsageError(f"--plant: planted faults live in impl/, not in --backend {backend_name}")
        return None, ""
    why = "--plant" if flag else "the trace's #meta.planted_fault"
    return name, f"planted fault {name} switched on in impl ({why})"


@contextmanager
def upstream_planted(trace, backend_name: str, out=print):
    """The trace's planted upstream faults (#meta.sglang_plant, written by a run against a
    release with $KVCHECK_SGLANG_PLANT set) switched on for a replay on a release, unless
    the variable is set already (then it decides)."""
    from kvcheck.adapters.sglang.faults import ENV
    plant = trace.meta.get("sglang_plant")
    if not plant or not backend_name.startswith("sglang") or ENV in os.environ:
        yield
        return
    out(f"planted upstream fault(s) {plant} switched on in the release (the trace's "
        f"#meta.sglang_plant; set {ENV} to decide otherwise)")
    os.environ[ENV] = plant
    try:
        yield
    finally:
        del os.environ[ENV]
