"""`kvcheck check`: the corpus, the planted-fault corpus, the differential run,
exhaustive exploration and the proofs, each reported as a part."""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional

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
    from dataclasses import replace

    from kvcheck.backends import release_config
    from kvcheck.trace import load
    bad, ruled = [], 0
    for f in _corpus(paths):
        t0 = time.monotonic()
        trace = load(f)
        if trace.expect.backend not in (None, "spec", "impl") and backend in ("spec", "impl"):
            continue        # a trace about another backend (e.g. an upstream release)
        if backend.startswith("sglang") and \
                (UPSTREAM / f"{f.stem}-{backend.replace(':', '-')}.json").exists():
            continue        # a recorded upstream finding replaces this expectation there
        cfg = release_config(trace.config, backend)
        if cfg is not trace.config:     # e.g. 0.5.17+'s eviction rule (release_config)
            trace, ruled = replace(trace, config=cfg), ruled + 1
        why = _undrivable(trace, backend)
        if why:
            out(f"  skipped {f}: {why}")
            continue
        res, ok = replay_trace(trace, backend, verbose=False)
        text = res.failure.render() if res.failure else "passed"
        known = None if ok or res.failure is None else \
            _recorded_trigger(trace, backend, res.failure.step)
        if known:
            out(f"  known {f}: {res.failure.id} at step {res.failure.step}, past {known}")
        elif not ok:
            bad.append(f)
            out(f"  UNEXPECTED {f}: " + text)
        if record is not None:
            record(f, ok, text if not ok else "", time.monotonic() - t0)
    if ruled:
        out(f"  {ruled} traces run with {backend}'s own eviction rule "
            "(config.evict_shortfall, kvcheck.backends.release_config), spec and release alike")
    return bad


def _undrivable(trace, backend: str):
    """Why a release cannot run this trace's configuration (its refusal at start,
    `kvcheck.adapters.sglang.backend.config_refusal`; the era is known from a versioned name), or
    None: such a trace is skipped there, and says so, instead of failing the corpus."""
    from kvcheck.backends import release_refusal
    return release_refusal(trace.config, backend)


def _recorded_trigger(trace, backend: str, upto: int):
    """Why a trace of the spec's expectations may fail on a release at step `upto`: a step
    up to it is the trigger of a finding recorded for the release (and not accepted by the
    trace), which that release's own traces in stateful_tests/upstream/ check; or None. The
    spec decides, as the differential run's skip does (kvcheck.backends.known_findings)."""
    from kvcheck.backends import known_findings
    from kvcheck.spec.model import refusal, step
    from kvcheck.spec.state import initial_state
    trigger = known_findings(backend, trace.config.accept)
    if trigger is None or trace.expect.backend not in (None, "spec", "impl"):
        return None     # a trace about this release (a recorded finding's) runs as written
    s = initial_state(trace.config)
    for i, op in enumerate(trace.ops[:upto + 1]):
        found = trigger(s, op)
        if found:
            return (f"step {i} ({op.name}) is the trigger of {found}, recorded for this "
                    "release (stateful_tests/upstream/ holds its traces)")
        if refusal(s, op) is not None:
            return None
        s, _ = step(s, op)
    return None


def planted_verdict(trace) -> tuple[str, str]:
    """Judge one self-test trace honestly: ("caught", ""), or why not. A trace that
    also fails with its fault switched OFF shows a defect in the tree, not a weak
    checker: that is a finding and is reported as one, not as a missed fault."""
    from kvcheck.impl import faults
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
MIN_EXAMPLES = {"walk": 20, "guided": 60, "hypothesis": 32}
"""The fewest sequences with which each engine's run from CHECK_SEED reaches every
operation and path the differential part requires (tests/test_check_budget.py checks
it): `check --examples` below it is a usage error, not a finding."""


def min_examples(engine: str) -> int:
    return MIN_EXAMPLES.get(engine, 1)


def differential_part(backend: str, out, examples: int, engine: str, accept=(),
                      beyond: Optional[dict] = None) -> tuple:
    """`check`'s differential run: a fixed seed and a count budget (the same sequences on
    every machine); the first failure is reported at once, then shrunk by kvcheck (never
    by Hypothesis). (ok, detail): not ok on a failure, or when an operation or one of
    stats.PATHS (the retry of a retracted request, ...) was never reached. `beyond`, if
    given, receives the run's sequences beyond the accepted findings' model (--json)."""
    from kvcheck.backends import known_findings
    from kvcheck.engines.stats import PATHS, beyond_line, differed_lines
    from kvcheck.fuzz import Console, fuzz
    from kvcheck.spec.ops import OP_NAMES
    rep = fuzz(None, CHECK_SEED, backend, out, rounds=max(1, examples), engine=engine,
               stop_on_first=True, console=Console(quiet=True, prefix="   "), accept=accept)
    if rep.interrupted:
        raise KeyboardInterrupt
    if beyond is not None:
        beyond.update(sequences=sum(rep.beyond.values()), steps_not_compared=rep.not_compared,
                      reasons=dict(sorted(rep.beyond.items())))
        if rep.beyond_checked:
            beyond.update(release_checked=rep.beyond_checked,
                          release_differs=dict(sorted(rep.beyond_differs.items())),
                          release_past_model=rep.beyond_past)
    stopped = ("; " + beyond_line(rep.beyond, rep.not_compared, rep.beyond_checked,
                                  rep.beyond_differs, rep.beyond_past)) if rep.beyond else ""
    stopped += "".join("\n" + line for line in differed_lines(rep.beyond_traces, "   "))
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


# ---------------------------------------------------------------------------
# the parts: module-level functions of picklable arguments, so that each runs inline or in
# a worker process (`--jobs`); each returns (ok, detail, cases), its output on stdout
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Part:
    name: str
    fn: Callable
    args: tuple = ()
    quick: bool = False     # finds most defects in seconds: run first, one at a time


@dataclass
class PartResult:
    name: str
    ok: bool
    seconds: float
    detail: str
    cases: list = field(default_factory=list)     # ciformat.Case per replayed trace
    output: str = ""                              # captured stdout (worker processes)
    extra: dict = field(default_factory=dict)     # e.g. the differential run's beyond
    cpu: float = 0.0                              # CPU seconds of the process that ran it
    finished: float = 0.0                         # seconds from the command's start

    @property
    def stopped(self) -> bool:
        """Stopped by a wall-clock safety net before its verdict: not a finding."""
        return bool(self.extra.get("interrupted"))


def _trace_case(part: str, cases: list):
    from kvcheck.ciformat import Case

    def record(f, ok, text, seconds):
        cases.append(Case(part, Path(f).stem, ok, seconds, text, str(f)))
    return record


def corpus_part(name: str, corpus_paths: tuple, backend: str):
    cases: list = []
    files = _corpus(corpus_paths)
    bad = check_corpus(corpus_paths, backend, record=_trace_case(name, cases))
    return not bad, f"{len(files) - len(bad)}/{len(files)} regression traces as expected", cases


def planted_part(name: str):
    from kvcheck.trace import load
    cases: list = []
    record = _trace_case(name, cases)
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
                     + (f"; NOT AS RECORDED: {bad}" if bad else "")), cases


def differential_job(name: str, backend: str, out, examples: int, engine: str, accept: tuple):
    beyond: dict = {}
    ok, detail = differential_part(backend, out, examples, engine, accept, beyond)
    return ok, detail, [], {"beyond": beyond}


CHECK_PRESET = "check"
"""The exploration preset `kvcheck check` runs, one part per scope."""
CHECK_IMPL_PRESET = "check-impl"
"""The preset whose every transition `kvcheck check` runs on the spec and impl (`--backend
impl`, the default), one part per scope."""


def differential_preset(backend: str) -> Optional[str]:
    """The preset whose every transition `kvcheck check` (and `kvcheck coverage`) runs on
    the spec and `backend`: check-impl on impl, check-sglang-VERSION on a release that has
    one; None for any other backend."""
    from kvcheck import explore as X
    from kvcheck.backends import release_version
    if backend == "impl":
        return CHECK_IMPL_PRESET
    preset = f"check-sglang-{release_version(backend)}"
    return preset if preset in X.PRESETS else None


def explore_part(name: str, preset: str, scope: str, out: Path, backend: str = "spec",
                 accept: tuple = (), workers: int = 1):
    """One scope of a preset, explored as `kvcheck explore --preset P --scope S --backend B
    [--accept A] [--workers N]` does (B impl or sglang:VERSION: then every transition on
    the spec and B side by side). The reachability goals are the spec exploration's (B
    spec) only."""
    from kvcheck import explore_cmd as X
    from kvcheck.engines.stats import differed_lines
    p = argparse.ArgumentParser()
    X.add_arguments(p)
    ns = p.parse_args(["--preset", preset, "--scope", scope, "--out", str(out / "explore"),
                       "--backend", backend, "--workers", str(workers)]
                      + (["--accept", ",".join(accept)] if accept else []))
    rc, results, traces = X.run_scope(X.scopes_from_args(ns)[0], ns)
    res = results[0]
    detail = (f"{res.states:,} distinct states, {res.transitions:,} transitions, every state "
              f"within {res.max_depth} steps")
    if res.backend_check:
        detail += "; " + res.backend_check
    detail += "".join("\n" + line for line in differed_lines(res.beyond_traces, "   "))
    for v in res.violations:
        detail += f"; VIOLATION {v.id} at step {v.depth - 1}: {v.message}"
    detail += "".join(f"\n   trace: {t}\n   replay: kvcheck replay {t}" for t in traces)
    if backend != "spec":
        return rc == 0, detail, []
    goals = {"missed": X.missed(res), "reached": sorted({*res.op_first, *res.reached})}
    return rc == 0, detail, [], {"goals": goals}


def unreached_goals(goals: list) -> list:
    """The reachability goals (operations, situations) that some scope of the preset could
    reach but none did: a goal one scope misses and another reaches is covered."""
    reached = {g for x in goals for g in x["reached"]}
    return sorted({g for x in goals for g in x["missed"]} - reached)


def proofs_part(name: str, out: Optional[Path], time_limit: Optional[float] = None):
    from kvcheck import proofs
    from kvcheck.proofs.cache import cache_at
    from kvcheck.proofs.crosshair_check import TIME_LIMIT_FLAG
    res = proofs.run_all(verbose=False, cache=cache_at(out), time_limit=time_limit)
    print(proofs.report(res))
    reused = sum(r.cached for r in res)
    stopped = proofs.interrupted(res)
    failed = [r for r in res if not r.ok and r not in stopped]
    detail = (f"{sum(r.ok for r in res)}/{len(res)} lemmas and controls as expected"
              + (f" ({reused} reused: covered sources unchanged; --no-cache "
                 "reruns them)" if reused else ""))
    if failed:
        detail = f"{failed[0].name}: {failed[0].status} (expected {failed[0].expected}); " + detail
    if stopped:
        detail = (f"interrupted by the time limit before a verdict: "
                  f"{', '.join(r.name for r in stopped)} (raise {TIME_LIMIT_FLAG}); " + detail)
    return proofs.ok(res), detail, [], {"interrupted": len(stopped) if not failed else 0}


def run_part(part: Part, capture: bool, planted: tuple = (), started: tuple = ()) -> PartResult:
    """One part, timed; an exception is the part's failure, not the run's (the other parts
    go on). `capture`: its stdout is kept in the result (a worker process) instead of
    printed as it comes. `planted`: impl/ faults switched on in the driver, which a worker
    process does not inherit; `started`: the driver's kvcheck.clock.stamp()."""
    import contextlib
    import io

    from kvcheck.impl import faults
    from kvcheck import clock
    if started:
        clock.set_start(*started)
    buf = io.StringIO()
    t0, c0 = time.monotonic(), time.process_time()
    with contextlib.redirect_stdout(buf) if capture else contextlib.nullcontext(), \
            faults.planted(*planted):
        try:
            ok, detail, cases, *extra = part.fn(part.name, *part.args)
        except KeyboardInterrupt:
            raise
        except Exception as e:  # report, keep going with the other parts
            ok, detail, cases, extra = False, f"{type(e).__name__}: {e}", [], []
    return PartResult(part.name, ok, time.monotonic() - t0, detail, cases, buf.getvalue(),
                      extra[0] if extra else {}, time.process_time() - c0, clock.since_start())


def compiled_build() -> Optional[str]:
    """Why the workers run interpreted, or None when a fresh compiled build exists."""
    from kvcheck.compiled import NotBuilt, check_build
    try:
        check_build()
    except NotBuilt as e:
        return str(e)
    return None


class PartsInterrupted(KeyboardInterrupt):
    """Ctrl-C during `run_parts`: `results` holds the parts that had finished."""

    def __init__(self, results: list) -> None:
        super().__init__()
        self.results = results


def schedule(parts: list) -> list:
    """The indices of `parts` in the order they start: the quick ones (the differential,
    the corpus, the planted faults: they find most defects, in seconds) first, then the
    rest in list order (longest first)."""
    return ([i for i, p in enumerate(parts) if p.quick]
            + [i for i, p in enumerate(parts) if not p.quick])


def run_parts(parts: list, jobs: int, show, compiled: bool = False) -> list:
    """Every part, in `jobs` processes (1: inline, each part's output as it comes): the
    quick parts one after another in one process from the start, the long ones in the
    others, then in every process as it frees up; each result is shown by `show(result)`
    as it finishes. The results come back in list order whatever the finishing order.
    Ctrl-C stops the workers and raises PartsInterrupted with what had finished."""
    from kvcheck import clock
    order = schedule(parts)
    done: dict = {}
    if jobs <= 1 or len(parts) <= 1:
        try:
            for i in order:
                print(f"== {parts[i].name}", flush=True)
                done[i] = run_part(parts[i], capture=False)
                show(done[i])
        except KeyboardInterrupt:
            raise PartsInterrupted(_in_order(done)) from None
        return _in_order(done)
    from functools import partial

    from kvcheck.impl import faults
    from kvcheck.procs import WorkerPool, check_worker
    workers = min(jobs, len(parts))
    pool = WorkerPool(workers, setup=partial(check_worker, compiled))
    quick = [i for i in order if parts[i].quick]
    slow = [i for i in order if not parts[i].quick]
    try:
        planted = tuple(sorted(faults.ACTIVE))
        pending: dict = {}

        def refill() -> None:       # one quick part at a time while long ones wait
            while len(pending) < workers:
                quick_running = any(parts[i].quick for i in pending.values())
                todo = quick if quick and (not quick_running or not slow) else slow
                if not todo:
                    return
                i = todo.pop(0)
                pending[pool.submit(run_part, parts[i], True, planted, clock.stamp())] = i
        refill()
        while pending:
            fin, _ = pool.wait(list(pending), timeout=1.0)
            for f in fin:
                i = pending.pop(f)
                done[i] = f.result()
                print(f"== {parts[i].name}", flush=True)
                print(done[i].output, end="", flush=True)
                show(done[i])
            refill()
    except KeyboardInterrupt:
        raise PartsInterrupted(_in_order(done)) from None
    finally:
        pool.shutdown()
    return _in_order(done)


def _in_order(done: dict) -> list:
    return [done[i] for i in sorted(done)]


def spread_spare_cores(parts: list, cores: int) -> list:
    """The parts, where there are more cores than parts, with the spare cores given to
    the spec's exploration parts as search workers (`kvcheck explore --workers`), one each
    in turn from the largest scope (the first listed) on; the result is the same."""
    explore = [i for i, p in enumerate(parts)
               if p.fn is explore_part and p.args[0] == CHECK_PRESET]
    spare = cores - len(parts)
    if spare <= 0 or not explore:
        return parts
    extra = [0] * len(parts)
    for k in range(spare):
        extra[explore[k % len(explore)]] += 1
    return [replace(p, args=p.args + ("spec", (), 1 + extra[i])) if extra[i] else p
            for i, p in enumerate(parts)]


def check_parts(args, corpus_paths: tuple, accept: tuple) -> list:
    """`kvcheck check`'s parts: the long ones longest first, the quick ones (`schedule`
    starts them first) differential first: it finds most defects."""
    from kvcheck import explore as X
    from kvcheck.backends import display_name
    from kvcheck.engines import DEFAULT_ENGINE
    engine = getattr(args, "engine", DEFAULT_ENGINE)
    parts = []
    if not args.skip_proofs:    # first: about 20 s when its cache is cold, instant when warm
        no_cache = getattr(args, "no_cache", False)
        parts.append(Part("proofs", proofs_part, (None if no_cache else Path(args.out),
                                                  getattr(args, "crosshair_time_limit", None))))
    preset = differential_preset(args.backend)
    on_release = preset is not None and args.backend != "impl"
    if not args.skip_explore and not on_release:    # the spec's: the same for every backend
        parts += [Part(f"exhaustive exploration: {sc.name}", explore_part,
                       (CHECK_PRESET, sc.name, Path(args.out)))
                  for sc in X.PRESETS[CHECK_PRESET]]
    parts.append(Part(f"differential state machine ({args.examples} sequences)", differential_job,
                      (args.backend, args.out, args.examples, engine, accept), quick=True))
    if not args.skip_explore and preset is not None:
        what = display_name(args.backend)
        parts += [Part(f"exhaustive differential (every transition, spec vs {what}): {sc.name}",
                       explore_part, (preset, sc.name, Path(args.out), args.backend, accept))
                  for sc in X.PRESETS[preset]]
    parts.append(Part("regression corpus (DOMAIN.md scenarios and found failures)", corpus_part,
                      (tuple(corpus_paths), args.backend), quick=True))
    if args.backend == "impl":
        parts.append(Part("checker self-test corpus (planted faults in impl/)", planted_part,
                          quick=True))
    return parts


REPORT_ORDER = ("regression corpus", "checker self-test", "differential", "exhaustive exploration",
                "exhaustive differential", "proofs")
"""The order parts are reported in (the summary, --json, --junit-xml): as before `--jobs`."""


def _report_rank(name: str) -> int:
    return next(i for i, p in enumerate(REPORT_ORDER) if name.startswith(p))


def cmd_check(args) -> int:
    from kvcheck import clock
    from kvcheck.backends import parse_accept
    from kvcheck.ciformat import Case, write_reports
    from kvcheck.engines import DEFAULT_ENGINE
    from kvcheck.errors import files_written
    from kvcheck.procs import usable_cores
    accept = parse_accept(args.accept, args.backend)       # a usage error: exit 2, no work
    corpus_paths = [REGRESSIONS]
    if args.backend.startswith("sglang:"):
        corpus_paths += sorted(UPSTREAM.glob(f"*-sglang-{args.backend.split(':', 1)[1]}.json"))
    load_corpus(corpus_paths + [REGRESSIONS / "planted"])
    jobs = args.jobs or usable_cores()
    parts = spread_spare_cores(check_parts(args, corpus_paths, accept), jobs)
    why_not = "--interpreted" if args.interpreted else compiled_build()
    compiled = jobs > 1 and why_not is None
    if jobs > 1:
        print(f"kvcheck check: {len(parts)} parts in {min(jobs, len(parts))} processes "
              "(--jobs 1: one at a time), the quick ones (differential, corpus, planted "
              "faults) first; each part is shown when it finishes; the spec "
              + ("compiled (make cython's build, fresh)" if compiled else
                 f"interpreted ({why_not})"), flush=True)

    def show(r: PartResult) -> None:
        word = "ok" if r.ok else "INTERRUPTED" if r.stopped else "FAILED"
        print(f"   {word} ({r.seconds:.1f} s, done {r.finished:.1f} s after the start) "
              f"{r.detail}", flush=True)

    try:
        results, interrupted = run_parts(parts, jobs, show, compiled), False
    except PartsInterrupted as e:
        results, interrupted = e.results, True
    goals = [r.extra["goals"] for r in results if "goals" in r.extra]
    if goals and not interrupted:   # a goal is met when any scope of the preset reaches it
        gaps = unreached_goals(goals)
        results.append(PartResult(
            "exhaustive exploration: reachability goals", not gaps, 0.0,
            f"NOT REACHED by any scope: {', '.join(gaps)}" if gaps else
            f"every operation and situation that applies to a scope reached by one of the "
            f"{len(goals)} scopes", finished=clock.since_start()))
        print(f"== {results[-1].name}", flush=True)
        show(results[-1])
    results.sort(key=lambda r: _report_rank(r.name))
    wall = clock.since_start()
    cases = []
    for r in results:
        cases += r.cases + [Case.part(r.name, r.ok, r.seconds, r.detail, cpu=r.cpu)]
    failed = [r for r in results if not r.ok and not r.stopped]
    stopped = [r for r in results if r.stopped]
    busy, cpu = sum(r.seconds for r in results), sum(r.cpu for r in results)
    counted = (f"{len(results) - len(failed) - len(stopped)}/{len(results)} parts passed"
               if not interrupted else
               f"INTERRUPTED after {len(results)} of {len(parts)} parts "
               f"({len(results) - len(failed) - len(stopped)} passed)")
    print(f"\nkvcheck check: {counted} in {wall:.1f} s from the start"
          + (f" ({busy:.1f} s of parts, {cpu:.1f} CPU-s, in "
             f"{min(jobs, len(parts))} processes)" if jobs > 1 else ""))
    for r in stopped:
        print(f"  INTERRUPTED {r.name}: {r.detail.splitlines()[0]}")
    for r in failed:
        print(f"  FAILED {r.name}: {r.detail.splitlines()[0]}")
        for t in Case.part(r.name, r.ok, r.seconds, r.detail).traces:
            print(f"    trace: {t}")
    if interrupted:
        written = files_written(Path(args.out), "*.json")
        print(f"  traces written: {', '.join(map(str, written))}" if written else
              "  no trace written")
    beyond = next((r.extra["beyond"] for r in results if "beyond" in r.extra), {})
    write_reports(cases, wall, args.junit_xml, args.json, backend=args.backend,
                  examples=args.examples, beyond=beyond, jobs=jobs, compiled=compiled,
                  interrupted=interrupted, parts_planned=len(parts) + any(
                      p.name.startswith("exhaustive exploration: ") for p in parts),
                  seeds={"differential": f"seed {CHECK_SEED}, {getattr(args, 'engine', DEFAULT_ENGINE)} engine"})
    if interrupted:
        print("kvcheck check: interrupted", file=sys.stderr)
    if interrupted or (stopped and not failed):
        return 130
    return 1 if failed else 0
