"""`kvcheck replay`: one trace on the spec and a backend, step by step."""
from __future__ import annotations

from kvcheck.errors import UsageError


def replay_trace(trace, backend_name: str, *, verbose: bool = True, out=print):
    """Run one trace; returns (result, matches_expectation)."""
    from kvcheck.backends import resolve
    from kvcheck.checker import run_ops
    from spec.abstract import canonical, diff

    factory, bname = resolve(backend_name)
    backend = factory(trace.config) if factory else None
    prev = [None]

    def on_step(rec):
        if not verbose:
            return
        b = canonical(rec.spec_state)
        change = diff(prev[0], b, "before", "after") if prev[0] is not None else []
        prev[0] = b
        bo = f" | {bname}: {rec.backend_outcome}" if rec.backend_outcome is not None else ""
        out(f"step {rec.index:3d}  {rec.op}  -> {rec.outcome}{bo}")
        for line in change[:12]:
            out(f"          {line}")
        if len(change) > 12:
            out(f"          ... {len(change) - 12} more changes")

    if verbose:
        from spec.model import initial_state
        from spec.view import abstract
        prev[0] = canonical(abstract(initial_state(trace.config)))
        out(f"config: {trace.config.to_json()}")
        out(f"backend: {bname}; {len(trace.ops)} operations")
    try:
        res = run_ops(trace.config, trace.ops, backend, backend_name=bname, on_step=on_step)
    finally:
        if backend is not None and hasattr(backend, "close"):
            backend.close()
    exp = trace.expect
    if res.failure is None:
        matches = exp.result == "pass" or (exp.backend not in (None, "spec", bname))
    else:
        matches = (exp.result == "violation" and exp.invariant == res.failure.id
                   and (exp.step is None or exp.step == res.failure.step)
                   and exp.backend in (None, res.failure.side))
    return res, matches


def cmd_replay(args) -> int:
    from kvcheck.backends import BackendError
    from kvcheck.trace import TraceError, load
    try:
        trace = load(args.trace)
    except TraceError as e:
        raise UsageError(str(e))
    try:
        res, matches = replay_trace(trace, args.backend, verbose=not args.quiet)
    except BackendError as e:
        raise UsageError(str(e))
    exp = trace.expect
    if res.failure is None:
        print(f"PASS: {res.steps} steps, every invariant held and the states agreed")
    else:
        print(res.failure.render())
    want = "pass" if exp.result == "pass" else f"{exp.invariant} at step {exp.step} on {exp.backend or 'any side'}"
    print(f"expected: {want} -> {'as expected' if matches else 'NOT as expected'}")
    return 0 if matches else 1
