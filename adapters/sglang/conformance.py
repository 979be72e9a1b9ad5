"""Conformance run: replay traces on the spec and on a real sglang release, step by step.

    .venv/bin/python -m kvcheck.adapters.sglang.conformance --version 0.5.15 stateful_tests/upstream/*.json
    .venv/bin/python -m kvcheck.adapters.sglang.conformance --version 0.5.15 --trace T.json -v

Each trace is checked three ways before it is trusted as a finding:
1. shape: every operation is one upstream's scheduler can produce in that state (the
   spec's guard), and each operation's shape is upstream's: a pre-aborted fresh request
   carries `set_finish_with_abort`'s one-token prompt on both sides, a rejected stub
   likewise. A trace that fails here is refused (it is not a finding of upstream).
2. lockstep: kvcheck.checker.run_ops (spec vs backend, all invariants on both sides,
   canonical state comparison). A trace whose "expect" names a violation for this
   backend ("backend": "sglang-VERSION"), or for the spec (which stops at an assertion of
   the release's own code, M1), passes when the run fails with that id at that step on
   that side; a trace expecting "pass" must pass.
3. past the first failure (`--past-failure`): the raw upstream side runs every operation
   (no spec), with every invariant evaluated after each step, so a finding's
   consequence is on record (wrong tokens, aliased rows, leaks), not only its first
   symptom.
Traces whose config era does not match the release are skipped (reported). Exit status:
0 all as expected, 1 otherwise.
"""
from __future__ import annotations

import argparse
import sys
import time

from kvcheck.checker import run_ops
from kvcheck.trace import load
from kvcheck.adapters.sglang.proxy import make_backend
from kvcheck.spec import ops as O
from kvcheck.spec.invariants import check_state, check_step
from kvcheck.spec.model import ABORT_STUB_ORIGIN, enabled, initial_state, step


def shape_errors(tr, backend_states=None, upto=None) -> list[str]:
    """Why upstream could not produce this trace's trigger, ops[:upto] (empty: it can).
    Runs the spec (the guard of each op is when upstream's scheduler could issue it) and,
    given the backend's abstract states after each step, checks the shapes upstream
    gives. Past the trigger the spec and upstream part ways; those ops are not checked."""
    errs = []
    s = initial_state(tr.config)
    for i, op in enumerate(tr.ops[:upto]):
        if not enabled(s, op):
            errs.append(f"step {i}: {op} is not an operation upstream's scheduler issues here")
            break
        before = s.reqs.get(getattr(op, "rid", None))
        fresh = before is not None and not before.is_retracted
        try:
            s, _ = step(s, op)
        except AssertionError:
            break                   # an upstream assertion: the lockstep reports it
        if isinstance(op, O.PreAbort) and fresh:
            errs += _one_token(i, op, "spec", s.reqs[op.rid].fill_ids)
            if backend_states is not None and i < len(backend_states):
                r = next((x for x in backend_states[i].reqs if x.rid == op.rid), None)
                errs += _one_token(i, op, "upstream", r.fill_ids if r else None)
    return errs


def _one_token(i, op, side, fill) -> list[str]:
    if fill == ABORT_STUB_ORIGIN:
        return []
    return [f"step {i}: {op} of a fresh request: upstream's set_finish_with_abort leaves the "
            f"one-token prompt {list(ABORT_STUB_ORIGIN)}, {side} has {fill!r}"]


def past_failure(tr, version: str | None) -> tuple[list, list[str]]:
    """The raw upstream side over the whole trace: (abstract states, one line per step
    with the invariants that fail there); stops only if upstream raises."""
    backend = make_backend(tr.config, version)
    states, lines = [], []
    prev = backend.abstract()
    try:
        for i, op in enumerate(tr.ops):
            try:
                out = backend.apply(op)
                cur = backend.abstract()
                vs = list(backend.concrete_violations()) + check_state(cur, tr.config) \
                    + check_step(prev, op, out, cur, tr.config)
            except Exception as e:  # upstream raised: the rest cannot run
                lines.append(f"  step {i:>3} {op}: raised {type(e).__name__}: {e}")
                break
            states.append(cur)
            prev = cur
            if vs:
                ids = sorted({v.id for v in vs})
                lines.append(f"  step {i:>3} {op} -> {out}: {', '.join(ids)}: {vs[0]}")
    finally:
        backend.close()
    return states, lines


def check_trace(path: str, version: str | None, verbose: bool = False,
                past: bool = False) -> tuple[bool, str]:
    tr = load(path)
    t0 = time.monotonic()
    try:
        backend = make_backend(tr.config, version)
    except Exception as e:
        if "config.era" in str(e):
            return True, f"SKIP {path}: {e}"
        return False, f"ERROR {path}: {type(e).__name__}: {e}"
    name = backend.name
    res = run_ops(tr.config, tr.ops, backend, backend_name=name)
    backend.close()
    states, after = past_failure(tr, version) if past else (None, [])
    shape = shape_errors(tr, states, None if res.failure is None else res.failure.step + 1)
    dt = time.monotonic() - t0
    exp = tr.expect
    f = res.failure
    got = "pass" if f is None else f"{f.id} at step {f.step} on {f.side}"
    if exp.result == "pass" or (exp.backend and exp.backend not in (name, "spec")):
        want = "pass"
        ok = f is None
    else:
        want = f"{exp.invariant} at step {exp.step} on {exp.backend or name}"
        ok = (f is not None and f.id == exp.invariant
              and (exp.step is None or f.step == exp.step)
              and f.side == (exp.backend or name))
    if shape:
        ok = False
        got += "; REFUSED, upstream cannot produce it: " + "; ".join(shape)
    line = f"{'ok  ' if ok else 'FAIL'} {path} [{name}, {dt:.2f}s]: expected {want}, got {got}"
    if f is not None and (verbose or not ok):
        line += "\n" + f.render()
    if after and (verbose or f is not None):
        line += f"\n  {name} alone, past the first failure:\n" + "\n".join(after)
    return ok, line


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvcheck.adapters.sglang.conformance")
    ap.add_argument("traces", nargs="*")
    ap.add_argument("--trace", action="append", default=[])
    ap.add_argument("--version", help="sglang release (uses .venv-sglang-VERSION)")
    ap.add_argument("--past-failure", action="store_true",
                    help="also run the raw upstream side over the whole trace and print "
                         "the invariants that fail at each step")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    paths = args.traces + args.trace
    if not paths:
        ap.error("no traces given")
    bad = 0
    for p in paths:
        ok, line = check_trace(p, args.version, args.verbose, args.past_failure)
        print(line, flush=True)
        bad += not ok
    print(f"{len(paths) - bad}/{len(paths)} as expected")
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
