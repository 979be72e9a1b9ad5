"""`kvcheck check`: the corpus, the planted-fault corpus, the differential run,
exhaustive exploration and the proofs, each reported as a part."""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Optional

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
        why = _undrivable(trace, backend)
        if why:
            out(f"  skipped {f}: {why}")
            continue
        res, ok = replay_trace(trace, backend, verbose=False)
        text = res.failure.render() if res.failure else "passed"
        if not ok:
            bad.append(f)
            out(f"  UNEXPECTED {f}: " + text)
        if record is not None:
            record(f, ok, text if not ok else "", time.monotonic() - t0)
    return bad


def _undrivable(trace, backend: str):
    """Why a release cannot run this trace's configuration (its refusal at start,
    `adapters.sglang.backend.config_refusal`; the era is known from a versioned name), or
    None: such a trace is skipped there, and says so, instead of failing the corpus."""
    if not backend.startswith("sglang"):
        return None
    from adapters.sglang.backend import config_refusal
    from kvcheck.backends import release_era
    era = release_era(backend)
    api = {"wrapper": "flat", "borrow": "borrow"}.get(era)
    return config_refusal(trace.config, api, backend.split(":", 1)[-1].removeprefix("sglang-"))


def planted_verdict(trace) -> tuple[str, str]:
    """Judge one self-test trace honestly: ("caught", ""), or why not. A trace that
    also fails with its fault switched OFF shows a defect in the tree, not a weak
    checker: that is a finding and is reported as one, not as a missed fault."""
    from impl import faults
    name = trace.meta["planted_fault"]
    with faults.planted(name):
        res, ok = replay_trace(trace, "impl", verbose=False)
    if ok:
        return "caught", ""
    clean, _ = replay_trace(trace, "impl", verbose=False)
    if clean.failure is not None:
        return "finding", (f"fails without the planted fault {name} too, so the tree has a "
                           f"defect: {clean.failure.render()}")
    if res.failure is None:
        return "missed", f"{name} switched on, every step passed"
    exp = trace.expect
    return "caught differently", (f"recorded {exp.invariant} at step {exp.step}, now "
                                  f"{res.failure.id} at step {res.failure.step}: "
                                  f"{res.failure.render()}")


def load_corpus(paths) -> list:
    """Every corpus trace, loaded before any work: a malformed one is a usage error
    (exit 2) naming the file and the field, not a failed part."""
    from kvcheck.errors import UsageError
    from kvcheck.trace import TraceError, load
    try:
        return [load(f) for f in _corpus(paths)]
    except TraceError as e:
        raise UsageError(f"corpus trace {e}") from None


CHECK_SEED = 0
"""The differential part's campaign seed (fixed: `make check` is reproducible)."""


def differential_part(backend: str, out, examples: int, engine: str, accept=(),
                      beyond: Optional[dict] = None) -> tuple:
    """`check`'s differential run: a fixed seed and a count budget (the same sequences on
    every machine); the first failure is reported at once, then shrunk by kvcheck (never
    by Hypothesis). (ok, detail): not ok on a failure, or when an operation or one of
    gen.PATHS (the retry of a retracted request, ...) was never reached. `beyond`, if
    given, receives the run's sequences beyond the accepted findings' model (--json)."""
    from kvcheck.backends import known_findings
    from kvcheck.engines.gen import PATHS, beyond_line
    from kvcheck.fuzz import Console, fuzz
    from spec.ops import OP_NAMES
    rep = fuzz(None, CHECK_SEED, backend, out, rounds=max(1, examples), engine=engine,
               stop_on_first=True, console=Console(quiet=True, prefix="   "), accept=accept)
    if rep.interrupted:
        raise KeyboardInterrupt
    if beyond is not None:
        beyond.update(sequences=sum(rep.beyond.values()), steps_not_compared=rep.not_compared,
                      reasons=dict(sorted(rep.beyond.items())))
    stopped = ("; " + beyond_line(rep.beyond, rep.not_compared)) if rep.beyond else ""
    if rep.found:
        f = rep.found[0]
        return False, (f"{f.id} on {f.side}: {f.summary}\n   trace: {f.path}\n"
                       f"   replay: kvcheck replay {f.path} --backend {rep.backend}")
    missing = [n for n in OP_NAMES if not rep.coverage.get(n)]
    unreached = [p for p in PATHS if not rep.paths.get(p)]
    # a release run that skips its recorded findings' triggers (no --accept) cannot
    # retry a retracted streaming turn (U2's trigger): said, not failed
    excused = unreached if known_findings(backend, accept) is not None else []
    missing += [p for p in unreached if p not in excused]
    cov = (f"; NOT REACHED: {missing}" if missing else "; every operation reached, "
           + ", ".join(f"{p} {rep.paths.get(p, 0)}x" for p in PATHS))
    if excused:
        cov += f"; not reached with recorded findings skipped (--accept drives them): {excused}"
    what = f"spec vs {rep.backend}" if rep.backend != "spec" else "spec alone"
    return not missing, (f"{rep.sequences} sequences, {rep.steps} steps, {rep.engine} "
                         f"engine, {what}{cov}{stopped}")


def cmd_check(args) -> int:
    from kvcheck.engines import DEFAULT_ENGINE

    from kvcheck.backends import parse_accept
    from kvcheck.ciformat import Case, write_reports
    accept = parse_accept(args.accept, args.backend)       # a usage error: exit 2, no work
    results, cases, current = [], [], ["parts"]
    beyond: dict = {}           # the differential run's stops beyond --accept's model
    corpus_paths = [REGRESSIONS]
    if args.backend.startswith("sglang:"):
        corpus_paths += sorted(UPSTREAM.glob(f"*-sglang-{args.backend.split(':', 1)[1]}.json"))
    load_corpus(corpus_paths + [REGRESSIONS / "planted"])

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
        files = _corpus(corpus_paths)
        bad = check_corpus(corpus_paths, args.backend, record=record)
        return not bad, f"{len(files) - len(bad)}/{len(files)} regression traces as expected"

    def differential():
        return differential_part(args.backend, args.out, args.examples,
                                 getattr(args, "engine", DEFAULT_ENGINE), accept, beyond)

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
        from proofs.cache import cache_at
        no_cache = getattr(args, "no_cache", False)
        res = proofs.run_all(verbose=False, cache=cache_at(None if no_cache else args.out))
        print(proofs.report(res))
        reused = sum(r.cached for r in res)
        return proofs.ok(res), (f"{sum(r.ok for r in res)}/{len(res)} lemmas and controls as expected"
                                + (f" ({reused} reused: covered sources unchanged; --no-cache "
                                   "reruns them)" if reused else ""))

    def planted():
        from kvcheck.trace import load
        files = sorted((REGRESSIONS / "planted").glob("*.json"))
        bad = []
        for f in files:
            t0 = time.monotonic()
            verdict, text = planted_verdict(load(f))
            if verdict != "caught":
                bad.append(f"{f.stem} ({verdict})")
                print(f"   {verdict.upper()} {f.stem}: {text}", flush=True)
            record(f, verdict == "caught", "" if verdict == "caught" else f"{verdict}: {text}",
                   time.monotonic() - t0)
        return not bad, (f"{len(files) - len(bad)}/{len(files)} planted-fault traces still caught"
                         + (f"; NOT AS RECORDED: {bad}" if bad else ""))

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
                  examples=args.examples, beyond=beyond,
                  seeds={"differential": f"seed {CHECK_SEED}, {getattr(args, 'engine', DEFAULT_ENGINE)} engine"})
    return 1 if failed else 0
