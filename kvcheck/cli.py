"""kvcheck: the command line. `kvcheck --help` lists the subcommands; each command's
body lives in its own module (replay, check, selftest, explore, proofs).

The contract CI relies on: exit 0 nothing found, 1 a finding, 2 a usage or input error
(one line, `kvcheck CMD: error: ...`, before any work starts), 130 interrupted. Flag
values are checked by the type= callables of kvcheck/argtypes.py while parsing.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from kvcheck import argtypes as T
from kvcheck.backends import BackendError
from kvcheck.engines import DEFAULT_ENGINE, ENGINES, ENGINES_HELP
from kvcheck.errors import ROOT, UsageError
from kvcheck.shrink import DEFAULT_REPLAYS

EXIT_OK, EXIT_FINDING, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_PIPE = 0, 1, 2, 130, 141
EXIT_CODES = """exit codes (every command):
  0    nothing found
  1    a finding: a violation, a divergence, a missed planted fault
  2    a usage or input error (one line on stderr, before any work)
  130  interrupted: Ctrl-C, or a wall-clock safety net (--crosshair-time-limit) that
       stopped a check before its verdict
  141  the reader of the output went away (e.g. `| head`): stopped there"""
FAILURES = Path("failures")
HYPOTHESIS_HOME = Path(".hypothesis")


def cmd_explore(args) -> int:
    from kvcheck import explore_cmd as X
    return X.main(args)


def cmd_coverage(args) -> int:
    from kvcheck import coverage as CV
    return CV.cmd_coverage(args)


def interrupt_in_destructor(unraisable) -> bool:
    """Whether an exception Python could not raise (`sys.unraisablehook`) is a Ctrl-C that
    landed in a destructor: z3's `AstRef.__del__`, run by the garbage collector in the
    middle of a proof, where ctypes wraps it ("argument 1: KeyboardInterrupt")."""
    e = unraisable.exc_value
    return isinstance(e, KeyboardInterrupt) or "KeyboardInterrupt" in str(e)


def _ctrl_c_reaches_main(unraisable, default=sys.unraisablehook) -> None:
    """main()'s unraisable hook: a Ctrl-C lost in a destructor goes to the main thread as a
    KeyboardInterrupt (the command stops as on any other Ctrl-C), with no "Exception
    ignored" traceback; any other unraisable exception is reported as Python reports it."""
    if interrupt_in_destructor(unraisable):
        import _thread
        _thread.interrupt_main()
    else:
        default(unraisable)


def cmd_prove(args) -> int:
    from kvcheck import proofs
    from kvcheck.proofs.cache import cache_at
    try:
        res = proofs.run_all(verbose=args.verbose, crosshair=not args.no_crosshair,
                             cache=cache_at(None if args.no_cache else args.out),
                             time_limit=args.crosshair_time_limit)
    except proofs.ProofsInterrupted as e:
        # a z3 term the interrupt left half-built fails in its destructor at exit
        # ("'BoolRef' object has no attribute 'ctx'"): noise after the interrupt
        sys.unraisablehook = lambda unraisable: None
        print(f"kvcheck prove: interrupted: {e.written()}", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(proofs.report(res))
    return proofs_exit(res)


def proofs_exit(res) -> int:
    """0 every verdict as expected; 1 a proof or control not as expected; 130 when the only
    gap is a unit the wall-clock safety net stopped (no verdict: not a finding)."""
    from kvcheck import proofs
    if proofs.ok(res):
        return EXIT_OK
    stopped = proofs.interrupted(res)
    return EXIT_INTERRUPTED if stopped and len(stopped) == sum(not r.ok for r in res) \
        else EXIT_FINDING


def crosshair_time_limit_flag(p) -> None:
    from kvcheck.proofs.crosshair_check import TIME_LIMIT, TIME_LIMIT_FLAG
    p.add_argument(TIME_LIMIT_FLAG, type=T.positive_float, default=TIME_LIMIT, metavar="SECONDS",
                   help="wall-clock safety net for the CrossHair processes, whose verdicts are "
                        "bounded by path and solver-step counts, not by time; a run it stops "
                        "is reported as interrupted by the time limit (no verdict, exit 130)")


def cmd_explain(args) -> int:
    from kvcheck.failures import explain, failure_ids, listing
    if not args.ids:
        print("failure ids:\n" + listing())
        return EXIT_OK
    unknown = [i for i in args.ids if i not in failure_ids()]
    if unknown:
        raise UsageError(f"unknown failure id(s) {unknown}; `kvcheck explain` lists them all")
    print("\n".join(explain(i) for i in args.ids))
    return EXIT_OK


def _add_campaign_flags(p) -> None:
    """The fuzz campaign's flags, shared by fuzz and selftest."""
    p.add_argument("--rounds", type=T.positive_int, default=None,
                   help="count budget: N sequences (same seed and count: byte-identical "
                        "failure files on any machine)")
    p.add_argument("--engine", choices=ENGINES, default=DEFAULT_ENGINE, help=ENGINES_HELP)
    p.add_argument("--workers", type=T.positive_int, default=1, help="local worker processes")
    p.add_argument("--shrink-replays", type=T.nonnegative_int, default=DEFAULT_REPLAYS,
                   help="shrinking budget in replays of the trace (0: no shrinking)")


def _no_cache_flag(p) -> None:
    p.add_argument("--no-cache", action="store_true",
                   help="rerun every proof; by default a proof whose covered sources (spec/pages.py, "
                        "the proof module) are unchanged since it last passed is reused from "
                        "OUT/.kvcheck-cache/proofs.json (a failure is never cached)")


# ---------------------------------------------------------------------------

class Formatter(argparse.RawDescriptionHelpFormatter):
    """Each option's default stated once: after its help, unless the help says it (its
    own "default: ...") or there is none to state (None, a flag that is off);
    descriptions and examples kept as written."""

    def _get_help_string(self, action):
        return help_with_default(action)


def help_with_default(action) -> str:
    text = action.help or ""
    if "default" in text or action.default in (None, False, argparse.SUPPRESS) \
            or action.default == [] or not action.option_strings:
        return text
    return text + " (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """Reports a usage error as one line, `kvcheck CMD: error: ...`, and exits 2."""

    def error(self, message):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("kvcheck")
    except PackageNotFoundError:
        return "unknown"


def _command(sub, name: str, summary: str, example: str, fn):
    p = sub.add_parser(name, help=summary, description=f"{summary}\n\nexample:\n  {example}",
                       formatter_class=Formatter)
    p.set_defaults(fn=fn)
    return p


def _backend_flag(p, default="impl", what="system under test"):
    p.add_argument("--backend", type=T.backend, default=default,
                   help=f"{what}: {T.BACKENDS_HELP}")


def build_parser() -> argparse.ArgumentParser:
    from kvcheck.check import cmd_check
    from kvcheck.preflight import environment_help
    from kvcheck.replay_cmd import cmd_replay
    from kvcheck.selftest import cmd_fuzz, cmd_selftest

    p = Parser(prog="kvcheck", formatter_class=Formatter,
               description="Model checker for the KV-cache bookkeeping of SGLang streaming sessions.",
               epilog=EXIT_CODES + "\n\n" + environment_help() + "\n\nfailure ids in reports: I* spec invariants, C* concrete "
                      "checks, L* upstream leak checks, D1/D2 divergence, E1 exception, M1 "
                      "upstream assertion, X1 refused operation; `kvcheck explain ID` says more.")
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")

    c = _command(sub, "check", "invariant verification within a fixed budget (what `make check` runs)",
                 "kvcheck check --junit-xml kvcheck.xml --json kvcheck.json", cmd_check)
    _backend_flag(c)
    c.add_argument("--examples", type=T.positive_int, default=100,
                   help="differential sequences (each draws its own configuration, speculative decoding on or off)")
    c.add_argument("--out", type=T.writable_dir, default=FAILURES, help="where failure traces go")
    c.add_argument("--skip-explore", action="store_true",
                   help="leave out exhaustive exploration: the spec's preset `check` and, with "
                        "--backend impl, every transition of preset check-impl on impl; with "
                        "--backend sglang:VERSION, every transition of preset "
                        "check-sglang-VERSION on that release (instead of the spec's, which "
                        "does not depend on the backend)")
    c.add_argument("--skip-proofs", action="store_true", help="leave out the z3 and CrossHair proofs")
    crosshair_time_limit_flag(c)
    c.add_argument("--jobs", type=T.positive_int, default=None,
                   help="parts run in this many processes at once, the exploration one process "
                        "per scope (1: one part after another, output as it comes); default: one "
                        "per usable core. Results do not depend on it")
    c.add_argument("--interpreted", action="store_true",
                   help="run the spec interpreted even when `make cython` has built it (by "
                        "default worker processes use a build that matches the sources; "
                        "tests/test_compiled.py shows both explore the same states)")
    _no_cache_flag(c)
    c.add_argument("--engine", choices=ENGINES, default=DEFAULT_ENGINE,
                   help=f"the differential part's fuzz engine: {ENGINES_HELP}")
    c.add_argument("--junit-xml", type=T.writable_file, metavar="FILE",
                   help="also write a JUnit XML report (one test case per part and per corpus trace)")
    c.add_argument("--json", type=T.writable_file, metavar="FILE",
                   help="also write a JSON summary (parts, failures, trace paths, seeds, timings)")
    T.accept_flag(c)

    f = _command(sub, "fuzz", "randomised differential runs for a time budget",
                 "kvcheck fuzz --seconds 300 --seed 7", cmd_fuzz)
    f.add_argument("--seconds", type=T.positive_float, default=None,
                   help="time budget; default: 60 s unless --rounds is given")
    f.add_argument("--seed", type=T.seed, default=None,
                   help="recorded and printed; rerun with it (default: a random seed)")
    _backend_flag(f)
    f.add_argument("--out", type=T.writable_dir, default=FAILURES, help="where shrunk failure traces go")
    _add_campaign_flags(f)
    T.accept_flag(f)
    f.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="run the campaign as Ray tasks (a local Ray without ADDRESS; needs "
                        "pip install 'kvcheck[ray]')")

    r = _command(sub, "replay", "run one trace on the spec and a backend, step by step",
                 "kvcheck replay stateful_tests/regressions/worked_example_5_4.json", cmd_replay)
    r.add_argument("trace", help="a trace file (docs/trace.schema.json)")
    r.add_argument("--backend", type=T.backend, default=None,
                   help=f"{T.BACKENDS_HELP}; default: the trace's recorded upstream release "
                        "when it names one, else impl")
    r.add_argument("--plant", metavar="FAULT", default=None,
                   help="switch on a planted fault of impl/faults.py; default: the trace's "
                        "#meta.planted_fault, if any")
    r.add_argument("-q", "--quiet", action="store_true", help="only the verdict")
    r.add_argument("--state", type=int, metavar="N",
                   help="print the full state of every side after step N (-1: initial)")
    r.add_argument("--grid", action="store_true", help="print the page x step owner grid")
    r.add_argument("--html", type=T.writable_file, metavar="FILE",
                   help="write the self-contained HTML report to FILE")
    r.add_argument("--emit-pytest", type=T.writable_file, metavar="OUT.py",
                   help="write a standalone pytest test that replays the trace on --backend")
    r.add_argument("--emit-style", choices=("fixed", "recorded"), default="fixed",
                   help="what the --emit-pytest test asserts: fixed, every step passes (it "
                        "fails while the defect is there, passes once it is fixed; named "
                        "after the invariant and the operation); recorded, the trace's "
                        "recorded outcome (a regression corpus entry)")
    r.add_argument("--itf", type=T.writable_file, metavar="FILE",
                   help="write the run as an ITF trace (Apalache/Quint)")

    s = _command(sub, "selftest", "fuzz against each planted fault in impl/; all must be caught",
                 "kvcheck selftest --seconds 20 free_tail_unaligned", cmd_selftest)
    s.add_argument("--seconds", type=T.positive_float, default=None,
                   help="budget per fault; default: 60 s unless --rounds is given")
    s.add_argument("--seed", type=T.seed, default=1, help="the fuzz seed for every fault")
    _add_campaign_flags(s)
    s.add_argument("--out", type=T.writable_dir, default=FAILURES / "selftest",
                   help="where the traces go")
    s.add_argument("faults", nargs="*", help="fault names (default: all)")

    e = _command(sub, "explore", "exhaustive bounded exploration of the spec (BFS)",
                 "kvcheck explore --preset check --max-states 100000", cmd_explore)
    from kvcheck import explore_cmd as X
    X.add_arguments(e)

    pr = _command(sub, "prove", "z3 lemmas, inductive accounting, CrossHair contracts",
                  "kvcheck prove -v --no-crosshair", cmd_prove)
    pr.add_argument("-v", "--verbose", action="store_true", help="print each result as it finishes")
    pr.add_argument("--no-crosshair", action="store_true", help="z3 only, skip the CrossHair run")
    pr.add_argument("--out", type=T.writable_dir, default=FAILURES,
                    help="output directory; proof results are cached in OUT/.kvcheck-cache")
    _no_cache_flag(pr)
    crosshair_time_limit_flag(pr)

    cv = _command(sub, "coverage", "line and branch coverage of impl/ (or a release's modules) "
                  "by check's runs and a fixed-count fuzz run", "kvcheck coverage --backend "
                  "sglang:0.5.23 --rounds 50", cmd_coverage)
    from kvcheck import coverage as CV
    CV.add_arguments(cv)

    x = _command(sub, "explain", "what a failure id (I*, C*, L*, D1, D2, E1, M1, X1) means",
                 "kvcheck explain I20 X1", cmd_explain)
    x.add_argument("ids", nargs="*", metavar="ID", help="failure ids (default: list them all)")
    return p


class _Sigint:
    """The handler main() installs first: it notes every Ctrl-C, so that one a library
    swallowed (z3 answers unknown, an import turns it into a RuntimeError) still ends
    the command with exit 130, and raises KeyboardInterrupt as Python's own does."""

    def __init__(self) -> None:
        self.seen = False

    def __call__(self, signum, frame):
        self.seen = True
        raise KeyboardInterrupt

    def install(self) -> None:
        import signal
        import threading
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:   # e.g. `cmd &`
            signal.signal(signal.SIGINT, self)


def _from_interrupt(e: BaseException) -> bool:
    """Whether an exception was caused by a Ctrl-C (a KeyboardInterrupt in its chain)."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def main(argv=None) -> int:
    import signal

    from kvcheck import clock
    clock.start()
    sigint = _Sigint()
    old = signal.getsignal(signal.SIGINT)
    sigint.install()
    hook, sys.unraisablehook = sys.unraisablehook, _ctrl_c_reaches_main
    try:
        rc = _main(argv)
    finally:
        if signal.getsignal(signal.SIGINT) is sigint:
            signal.signal(signal.SIGINT, old)
        if sys.unraisablehook is _ctrl_c_reaches_main:
            sys.unraisablehook = hook
    if sigint.seen and rc != EXIT_INTERRUPTED:
        print("kvcheck: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return rc


def _main(argv=None) -> int:
    # Hypothesis keeps its files under the project, never in the directory kvcheck runs from
    os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", str(HYPOTHESIS_HOME.resolve()))
    cmd = "kvcheck"
    try:
        parser = build_parser()
        try:
            args, extra = parser.parse_known_args(argv)
            if extra:                            # named by the subcommand that got them
                commands = parser._subparsers._group_actions[0].choices
                commands.get(getattr(args, "cmd", None), parser).error(
                    f"unrecognized arguments: {' '.join(extra)}")
        except SystemExit as e:                  # --help, --version, a usage error
            return e.code if isinstance(e.code, int) else EXIT_USAGE
        if not getattr(args, "fn", None):
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        cmd = f"kvcheck {args.cmd}"
        from kvcheck.preflight import preflight
        preflight(args)
        return args.fn(args)
    except (UsageError, BackendError) as e:
        print(f"{cmd}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{cmd}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # stdout's reader closed it (`kvcheck fuzz ... | head`): stop as a shell tool does on
        # SIGPIPE, without a traceback; stdout goes to /dev/null so that the interpreter's
        # flush at exit does not raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_PIPE
    except Exception as e:      # an interrupt a library turned into another error
        if not _from_interrupt(e):
            raise
        print(f"{cmd}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
