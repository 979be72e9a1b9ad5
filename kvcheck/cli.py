"""kvcheck: the command line. `kvcheck --help` lists the subcommands."""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REGRESSIONS = ROOT / "stateful_tests" / "regressions"
UPSTREAM = ROOT / "stateful_tests" / "upstream"


class UsageError(Exception):
    pass


# ---------------------------------------------------------------------------
# replay
# ---------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------
# fuzz and selftest
# ---------------------------------------------------------------------------

def cmd_fuzz(args) -> int:
    from kvcheck.fuzz import fuzz
    if args.seconds <= 0:
        raise UsageError("--seconds must be positive")
    rep = fuzz(args.seconds, args.seed, args.backend, args.out)
    print(rep.render())
    return 1 if rep.found else 0


def cmd_selftest(args) -> int:
    from impl import faults
    from kvcheck.fuzz import fuzz
    names = args.faults or sorted(faults.FAULTS)
    unknown = [n for n in names if n not in faults.FAULTS]
    if unknown:
        raise UsageError(f"unknown fault(s) {unknown}; known: {', '.join(sorted(faults.FAULTS))}")
    rows = []
    for name in names:
        with faults.planted(name):
            rep = fuzz(args.seconds, args.seed, "impl", Path(args.out) / name, stop_on_first=True,
                       quiet=True, shrink_budget_s=args.shrink_seconds, label=name)
        f = rep.found[0] if rep.found else None
        rows.append((name, f, rep))
        status = (f"caught  {f.seconds_to_find:6.1f} s  {f.id:<3} on {f.side:<5} shrunk "
                  f"{f.original_length:>3} -> {f.length:>3} ops" if f else
                  f"MISSED  after {rep.seconds:.0f} s, {rep.steps} steps")
        print(f"{name:<32} {status}", flush=True)
    caught = [f for _, f, _ in rows if f]
    print(f"\ncaught {len(caught)}/{len(rows)} planted faults (seed {args.seed})")
    if caught:
        t = [f.seconds_to_find for f in caught]
        n = [f.length for f in caught]
        print(f"seconds to detection: median {statistics.median(t):.1f}, worst {max(t):.1f}; "
              f"shrunk trace length: median {statistics.median(n):g}, worst {max(n)}")
    return 0 if len(caught) == len(rows) else 1


# ---------------------------------------------------------------------------
# check
# ---------------------------------------------------------------------------

def _corpus(paths):
    files = []
    for p in paths:
        p = Path(p)
        files.extend(sorted(p.glob("*.json")) if p.is_dir() else [p])
    return files


def check_corpus(paths, backend: str, out=print) -> list:
    """Replay every trace; returns the files whose outcome is not the expected one."""
    from kvcheck.trace import load
    bad = []
    for f in _corpus(paths):
        trace = load(f)
        if trace.expect.backend not in (None, "spec", "impl") and backend in ("spec", "impl"):
            continue        # a trace about another backend (e.g. an upstream release)
        if backend.startswith("sglang") and \
                (UPSTREAM / f"{f.stem}-{backend.replace(':', '-')}.json").exists():
            continue        # a recorded upstream finding replaces this expectation there
        res, ok = replay_trace(trace, backend, verbose=False)
        if not ok:
            bad.append(f)
            out(f"  UNEXPECTED {f}: " + (res.failure.render() if res.failure else "passed"))
    return bad


def cmd_check(args) -> int:
    from hypothesis import settings
    from hypothesis.stateful import run_state_machine_as_test

    from kvcheck.backends import resolve
    from kvcheck.fuzz import _shrink_and_write
    from stateful_tests import machine as M
    from stateful_tests import profiles  # noqa: F401

    results = []

    def part(name, fn):
        t0 = time.monotonic()
        print(f"== {name}", flush=True)
        try:
            ok, detail = fn()
        except Exception as e:  # report, keep going with the other parts
            ok, detail = False, f"{type(e).__name__}: {e}"
        dt = time.monotonic() - t0
        results.append((name, ok, dt, detail))
        print(f"   {'ok' if ok else 'FAILED'} ({dt:.1f} s) {detail}", flush=True)

    def corpus():
        paths = [REGRESSIONS]
        if args.backend.startswith("sglang:"):
            version = args.backend.split(":", 1)[1]
            paths += sorted(UPSTREAM.glob(f"*-sglang-{version}.json"))
        files = _corpus(paths)
        bad = check_corpus(paths, args.backend)
        return not bad, f"{len(files) - len(bad)}/{len(files)} regression traces as expected"

    def differential():
        from kvcheck.backends import known_findings, release_era
        factory, bname = resolve(args.backend)
        skip = known_findings(args.backend)
        era = release_era(args.backend)
        M.COVERAGE.clear(), M.STEPS.clear(), M.LAST_FAILURE.clear()
        try:
            for spec_on in (False, True):   # half the budget each way, so both decode kinds run
                machine = M.make_machine(factory, bname, M.configs(spec_enabled=spec_on, era=era), skip)
                run_state_machine_as_test(machine, settings=settings(
                    settings.get_profile("kvcheck-check"), max_examples=max(1, args.examples // 2)))
        except Exception:
            if not M.LAST_FAILURE:
                raise
            f = M.LAST_FAILURE["failure"]
            found = _shrink_and_write(M.LAST_FAILURE["config"], M.LAST_FAILURE["ops"], f, factory,
                                      bname, Path(args.out), 0, 1, 0.0, 30.0, "")
            return False, (f"{f.id} on {f.side}: {found.summary}\n   trace: {found.path}\n"
                           f"   replay: kvcheck replay {found.path} --backend {bname}")
        from spec.ops import OP_NAMES
        missing = [n for n in OP_NAMES if not M.COVERAGE[n]]
        cov = f"; NOT REACHED: {missing}" if missing else "; every operation reached"
        what = f"spec vs {bname}" if factory else "spec alone"
        return not missing, (f"{M.STEPS['sequences']} sequences, {M.STEPS['steps']} steps, "
                             f"{what}{cov}")

    def explore():
        from kvcheck import explore as X
        ns = argparse.Namespace()
        p = argparse.ArgumentParser()
        X.add_arguments(p)
        ns = p.parse_args(["--preset", "check"])
        rc = X.main(ns)
        return rc == 0, "bounded exhaustive exploration, preset 'check'"

    def prove():
        import proofs
        res = proofs.run_all(verbose=False)
        print(proofs.report(res))
        return proofs.ok(res), f"{sum(r.ok for r in res)}/{len(res)} lemmas and controls as expected"

    def planted():
        from impl import faults
        from kvcheck.trace import load
        files = sorted((REGRESSIONS / "planted").glob("*.json"))
        missed = []
        for f in files:
            t = load(f)
            with faults.planted(t.meta["planted_fault"]):
                res, ok = replay_trace(t, "impl", verbose=False)
            if not ok:
                missed.append(f.stem)
        return not missed, (f"{len(files) - len(missed)}/{len(files)} planted-fault traces still caught"
                            + (f"; MISSED: {missed}" if missed else ""))

    part("regression corpus (DOMAIN.md scenarios and found failures)", corpus)
    if args.backend == "impl":
        part("checker self-test corpus (planted faults in impl/)", planted)
    part(f"differential state machine ({args.examples} sequences)", differential)
    if not args.skip_explore:
        part("exhaustive exploration", explore)
    if not args.skip_proofs:
        part("proofs", prove)
    failed = [r for r in results if not r[1]]
    total = sum(r[2] for r in results)
    print(f"\nkvcheck check: {len(results) - len(failed)}/{len(results)} parts passed in {total:.1f} s")
    return 1 if failed else 0


def cmd_explore(args) -> int:
    from kvcheck import explore as X
    return X.main(args)


def cmd_prove(args) -> int:
    import proofs
    res = proofs.run_all(verbose=args.verbose, crosshair=not args.no_crosshair)
    print(proofs.report(res))
    return 0 if proofs.ok(res) else 1


# ---------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvcheck",
        description="Model checker for the KV-cache bookkeeping of SGLang streaming sessions.")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")

    c = sub.add_parser("check", help="invariant verification within a fixed budget (what `make check` runs)")
    c.add_argument("--backend", default="impl", help="system under test: impl (default), spec, sglang[:VERSION]")
    c.add_argument("--examples", type=int, default=100, help="differential sequences (default 100)")
    c.add_argument("--out", default="failures", help="where failure traces go (default failures/)")
    c.add_argument("--skip-explore", action="store_true")
    c.add_argument("--skip-proofs", action="store_true")
    c.set_defaults(fn=cmd_check)

    f = sub.add_parser("fuzz", help="randomised differential runs for a time budget")
    f.add_argument("--seconds", type=float, default=60)
    f.add_argument("--seed", type=int, default=None, help="recorded and printed; rerun with it")
    f.add_argument("--backend", default="impl")
    f.add_argument("--out", default="failures", help="where shrunk failure traces go (default failures/)")
    f.set_defaults(fn=cmd_fuzz)

    r = sub.add_parser("replay", help="run one trace on the spec and a backend, step by step")
    r.add_argument("trace")
    r.add_argument("--backend", default="impl", help="spec, impl (default), sglang[:VERSION]")
    r.add_argument("-q", "--quiet", action="store_true", help="only the verdict")
    r.set_defaults(fn=cmd_replay)

    s = sub.add_parser("selftest", help="fuzz against each planted fault in impl/; all must be caught")
    s.add_argument("--seconds", type=float, default=60, help="budget per fault (default 60)")
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--shrink-seconds", type=float, default=30)
    s.add_argument("--out", default="failures/selftest")
    s.add_argument("faults", nargs="*", help="fault names (default: all)")
    s.set_defaults(fn=cmd_selftest)

    e = sub.add_parser("explore", help="exhaustive bounded exploration of the spec (BFS)")
    try:
        from kvcheck import explore as X
        X.add_arguments(e)
    except ImportError:
        pass
    e.set_defaults(fn=cmd_explore)

    pr = sub.add_parser("prove", help="z3 lemmas, inductive accounting, CrossHair contracts")
    pr.add_argument("-v", "--verbose", action="store_true", help="print each result as it finishes")
    pr.add_argument("--no-crosshair", action="store_true", help="z3 only, skip the CrossHair run")
    pr.set_defaults(fn=cmd_prove)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "fn", None):
        parser.print_help()
        return 2
    from kvcheck.backends import BackendError
    try:
        return args.fn(args)
    except (UsageError, BackendError) as e:
        print(f"kvcheck {args.cmd}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"kvcheck {args.cmd}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
