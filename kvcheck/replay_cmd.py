"""`kvcheck replay TRACE`: the command around kvcheck.replay's run (which backend, which
planted fault, the views and files its flags ask for, the verdict against the trace's
expectation)."""
from __future__ import annotations

from kvcheck.errors import UsageError
from kvcheck.replay import (ReplayResult, full_state_lines, replay_fault, replay_trace,
                            step_labels, upstream_planted)


def views_only(args) -> bool:
    """--state and --grid replace the step-by-step listing."""
    return getattr(args, "state", None) is not None or getattr(args, "grid", False)


def write_views(args, trace, res: ReplayResult, out=print) -> None:
    """The views the replay flags ask for, of a finished run: --state N, --grid (text);
    --html, --emit-pytest, --itf (files, each path printed)."""
    from kvcheck.render import grid_lines
    last = len(res.records) - 1
    if getattr(args, "state", None) is not None:
        if not -1 <= args.state <= last:
            raise UsageError(f"--state {args.state}: the run has steps 0..{last} "
                             f"(-1: the initial state)")
        op = "initial state" if args.state < 0 else str(res.records[args.state].op)
        out(f"state after step {args.state} ({op}):")
        for line in full_state_lines(res, args.state):
            out(line)
    if getattr(args, "grid", False):
        for side in res.sides:
            for line in grid_lines(res.states(side), step_labels(res), side):
                out(line)
    if getattr(args, "html", None):
        from kvcheck.html_report import write_html_report
        path = _writing("--html", args.html, lambda: write_html_report(
            args.trace, res.backend_name, out=args.html, result=res))
        out(f"html report: {path}")
    if getattr(args, "emit_pytest", None):
        from kvcheck.emit_pytest import write_pytest
        path = _writing("--emit-pytest", args.emit_pytest, lambda: write_pytest(
            trace, args.emit_pytest, res.backend_name, source=args.trace,
            style=getattr(args, "emit_style", "fixed")))
        out(f"pytest test: {path}")
    if getattr(args, "itf", None):
        from kvcheck.itf import write_itf
        path = _writing("--itf", args.itf, lambda: write_itf(trace, res, args.itf, source=args.trace))
        out(f"ITF trace: {path}")


def _writing(flag: str, target, write):
    """Run a writer; a file that cannot be written is a usage error naming the flag."""
    try:
        return write()
    except OSError as e:
        raise UsageError(f"{flag} {target}: cannot write: {e.strerror or e}") from None


def replay_backend(flag, trace) -> tuple[str, str]:
    """(backend to replay on, a line saying why when it is not the flag's): an upstream
    trace (expect.backend, else #meta.backend, sglang-X) runs on its recorded release
    unless --backend says otherwise."""
    recorded = trace.expect.backend or str(trace.meta.get("backend") or "")
    if (flag or "impl") == "impl" and trace.config.accept and not recorded.startswith("sglang"):
        raise UsageError(f"the trace's config accepts {','.join(trace.config.accept)}: the spec "
                         f"follows upstream's recorded behaviour there, which impl/ does not "
                         f"implement (it has the fixes only); replay it on a release "
                         f"(--backend sglang:VERSION) or on the spec alone (--backend spec)")
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


def cmd_replay(args) -> int:
    import contextlib

    from kvcheck.impl import faults
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
        with faults.planted(fault) if fault else contextlib.nullcontext(), \
                upstream_planted(trace, backend_name):
            res, matches = replay_trace(trace, backend_name, progress=True,
                                        verbose=not args.quiet and not views_only(args))
    except BackendError as e:
        raise UsageError(str(e))
    write_views(args, trace, res)
    exp = trace.expect
    if res.failure is None and res.beyond is not None:
        print(f"PASS up to step {res.beyond.step} ({res.beyond.step} steps compared, "
              f"{len(trace.ops) - res.beyond.step} not: beyond the accepted findings' model, "
              f"{res.beyond.reason})")
    elif res.failure is None:
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
