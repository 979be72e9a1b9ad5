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


def replay_backend(flag, trace) -> tuple[str, str]:
    """(backend to replay on, a line saying why when it is not the flag's): an upstream
    trace (expect.backend sglang-X) runs on its recorded release unless --backend says
    otherwise."""
    recorded = trace.expect.backend or ""
    if flag is not None or not recorded.startswith("sglang"):
        return flag or "impl", ""
    import argparse
    from kvcheck.argtypes import backend
    name = recorded.replace("sglang-", "sglang:", 1)
    try:
        backend(name)
    except argparse.ArgumentTypeError as e:
        raise UsageError(f"the trace was recorded on {recorded}, which cannot run here ({e}); "
                         f"build it, or replay on another system with --backend impl") from None
    return name, f"backend: {name}, the release the trace was recorded on (--backend to change)"


def replay_fault(flag, trace, backend_name: str) -> tuple:
    """(planted fault to switch on or None, a line saying so)."""
    from impl import faults
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


def cmd_replay(args) -> int:
    import contextlib

    from impl import faults
    from kvcheck.backends import BackendError
    from kvcheck.trace import TraceError, load
    try:
        trace = load(args.trace)
    except TraceError as e:
        raise UsageError(str(e))
    backend_name, why_backend = replay_backend(args.backend, trace)
    fault, why_fault = replay_fault(args.plant, trace, backend_name)
    for line in (why_backend, why_fault):
        if line:
            print(line)
    try:
        with faults.planted(fault) if fault else contextlib.nullcontext():
            res, matches = replay_trace(trace, backend_name, verbose=not args.quiet)
    except BackendError as e:
        raise UsageError(str(e))
    exp = trace.expect
    if res.failure is None:
        print(f"PASS: {res.steps} steps, every invariant held and the states agreed")
    else:
        print(res.failure.render())
    want = "pass" if exp.result == "pass" else f"{exp.invariant} at step {exp.step} on {exp.backend or 'any side'}"
    if exp.backend not in (None, "spec", backend_name.replace(":", "-", 1)):
        # the expectation is about another system: judge this run alone
        print(f"expected: {want} -> not checked here (replayed on {backend_name}; "
              f"--backend {exp.backend.replace('sglang-', 'sglang:', 1)} checks it)")
        return 0 if res.failure is None else 1
    print(f"expected: {want} -> {'as expected' if matches else 'NOT as expected'}")
    return 0 if matches else 1
