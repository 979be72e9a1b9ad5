"""`kvcheck check`: the corpus, the planted-fault corpus, the differential run,
exhaustive exploration and the proofs, each reported as a part."""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from kvcheck.errors import REGRESSIONS, UPSTREAM
from kvcheck.replay import replay_trace


def _corpus(paths):
    files = []
    for p in paths:
        p = Path(p)
        files.extend(sorted(p.glob("*.json")) if p.is_dir() else [p])
    return files


def check_corpus(paths, backend: str, out=print, record=None) -> list:
    """Replay every trace; returns the files whose outcome is not the expected one.
    `record(file, ok, text, seconds)` is told each replayed trace's verdict (CI reports)."""
    from kvcheck.trace import load
    bad = []
    for f in _corpus(paths):
        t0 = time.monotonic()
        trace = load(f)
        if trace.expect.backend not in (None, "spec", "impl") and backend in ("spec", "impl"):
            continue        # a trace about another backend (e.g. an upstream release)
        if backend.startswith("sglang") and \
                (UPSTREAM / f"{f.stem}-{backend.replace(':', '-')}.json").exists():
            continue        # a recorded upstream finding replaces this expectation there
        res, ok = replay_trace(trace, backend, verbose=False)
        text = res.failure.render() if res.failure else "passed"
        if not ok:
            bad.append(f)
            out(f"  UNEXPECTED {f}: " + text)
        if record is not None:
            record(f, ok, text if not ok else "", time.monotonic() - t0)
    return bad


def cmd_check(args) -> int:
    from hypothesis import settings
    from hypothesis.stateful import run_state_machine_as_test

    from kvcheck.backends import parse_accept, resolve
    from kvcheck.fuzz import _shrink_and_write
    from stateful_tests import machine as M
    from stateful_tests import profiles  # noqa: F401

    from kvcheck.ciformat import Case, write_reports
    accept = parse_accept(getattr(args, "accept", None), args.backend)   # a usage error: exit 2
    results, cases, current = [], [], ["parts"]

    def record(f, ok, text, seconds):
        cases.append(Case(current[0], Path(f).stem, ok, seconds, text, str(f)))

    def part(name, fn):
        current[0] = name
        t0 = time.monotonic()
        print(f"== {name}", flush=True)
        try:
            ok, detail = fn()
        except Exception as e:  # report, keep going with the other parts
            ok, detail = False, f"{type(e).__name__}: {e}"
        dt = time.monotonic() - t0
        results.append((name, ok, dt, detail))
        cases.append(Case.part(name, ok, dt, detail))
        print(f"   {'ok' if ok else 'FAILED'} ({dt:.1f} s) {detail}", flush=True)

    def corpus():
        paths = [REGRESSIONS]
        if args.backend.startswith("sglang:"):
            version = args.backend.split(":", 1)[1]
            paths += sorted(UPSTREAM.glob(f"*-sglang-{version}.json"))
        files = _corpus(paths)
        bad = check_corpus(paths, args.backend, record=record)
        return not bad, f"{len(files) - len(bad)}/{len(files)} regression traces as expected"

    def differential():
        from kvcheck.backends import known_findings, release_era
        factory, bname = resolve(args.backend)
        skip = known_findings(args.backend, accept)
        era = release_era(args.backend)
        M.COVERAGE.clear(), M.STEPS.clear(), M.LAST_FAILURE.clear()
        try:
            for spec_on in (False, True):   # half the budget each way, so both decode kinds run
                machine = M.make_machine(factory, bname, M.configs(spec_enabled=spec_on, era=era, accept=accept), skip)
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
            t0 = time.monotonic()
            t = load(f)
            with faults.planted(t.meta["planted_fault"]):
                res, ok = replay_trace(t, "impl", verbose=False)
            if not ok:
                missed.append(f.stem)
            record(f, ok, "" if ok else "missed: " + (res.failure.render() if res.failure
                                                     else "passed"), time.monotonic() - t0)
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
    write_reports(cases, total, args.junit_xml, args.json, backend=args.backend,
                  examples=args.examples, seeds={"differential": "derandomized (profile kvcheck-check)"})
    return 1 if failed else 0
