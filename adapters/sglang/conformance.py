"""Conformance run: replay traces on the spec and on a real sglang release, step by step.

    .venv/bin/python -m adapters.sglang.conformance --version 0.5.15 stateful_tests/upstream/*.json
    .venv/bin/python -m adapters.sglang.conformance --version 0.5.15 --trace T.json -v

Each trace is checked with kvcheck.checker.run_ops (spec vs backend, all invariants on
both sides, canonical state comparison). A trace whose "expect" names a violation for
this backend ("backend": "sglang-VERSION") passes when the run fails with that id at
that step; a trace expecting "pass" must pass. Traces whose config era does not match
the release are skipped (reported). Exit status: 0 all as expected, 1 otherwise.
"""
from __future__ import annotations

import argparse
import sys
import time

from kvcheck.checker import run_ops
from kvcheck.trace import load
from adapters.sglang.proxy import make_backend


def check_trace(path: str, version: str | None, verbose: bool = False) -> tuple[bool, str]:
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
    dt = time.monotonic() - t0
    exp = tr.expect
    f = res.failure
    got = "pass" if f is None else f"{f.id} at step {f.step} on {f.side}"
    if exp.result == "pass" or (exp.backend and exp.backend != name):
        want = "pass"
        ok = f is None
    else:
        want = f"{exp.invariant} at step {exp.step} on {exp.backend or name}"
        ok = (f is not None and f.id == exp.invariant
              and (exp.step is None or f.step == exp.step)
              and f.side == (exp.backend or name))
    line = f"{'ok  ' if ok else 'FAIL'} {path} [{name}, {dt:.2f}s]: expected {want}, got {got}"
    if f is not None and (verbose or not ok):
        line += "\n" + f.render()
    return ok, line


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m adapters.sglang.conformance")
    ap.add_argument("traces", nargs="*")
    ap.add_argument("--trace", action="append", default=[])
    ap.add_argument("--version", help="sglang release (uses .venv-sglang-VERSION)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    paths = args.traces + args.trace
    if not paths:
        ap.error("no traces given")
    bad = 0
    for p in paths:
        ok, line = check_trace(p, args.version, args.verbose)
        print(line, flush=True)
        bad += not ok
    print(f"{len(paths) - bad}/{len(paths)} as expected")
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
