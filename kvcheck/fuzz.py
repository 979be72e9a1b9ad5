"""Randomised differential campaigns (`kvcheck fuzz`, `kvcheck selftest`, the
differential part of `kvcheck check`).

A campaign runs sequences of one engine (kvcheck.engines: `walk` by default, or
`hypothesis`) in chunks (kvcheck.engines.campaign), inline, in `--workers N` local
processes or as Ray tasks, within a count budget (`rounds` sequences: the same seed
and count give byte-identical failure files anywhere) or a seconds budget. The driver
alone deduplicates failures by root cause (failure id, side, operation, owner kind)
and writes them:

1. the unshrunk trace is written and reported at once (id, step, one-line summary,
   path), before anything else happens;
2. kvcheck's shrinker (kvcheck.shrink) shrinks it within a budget of replays, with a
   live progress line, and the shrunk trace replaces the unshrunk one.

SIGINT at any moment (generation, shrinking, writing) ends the campaign with a report
that lists every trace written, unshrunk ones marked; a trace is never half-written
(writes finish before the interrupt is taken) and an interrupt that a library swallows
still stops the campaign at the next sequence or replay.
"""
from __future__ import annotations

import random
import signal
import sys
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from kvcheck import clock
from kvcheck.backends import known_findings, planted_upstream
from kvcheck.checker import run_ops
from kvcheck.engines import DEFAULT_ENGINE
from kvcheck.engines.campaign import Campaign, RawFailure, make_executor
from kvcheck.engines.stats import Stats, beyond_line, differed_lines
from kvcheck.shrink import DEFAULT_REPLAYS, shrink
from kvcheck.trace import beyond_trace, failure_trace
from kvcheck.spec.ops import OP_NAMES

WORKER_CHUNK = 8
"""Sequences per chunk handed to a worker process or Ray task (a chunk ends early at
its first failure, so a failure is reported without waiting for the rest)."""
PROGRESS_EVERY_S = 5.0


def on_trace_written(path: Path, backend: str) -> Optional[Path]:
    """Called for every trace file a campaign writes (unshrunk, then shrunk), after its
    report line is printed: the one place where a written trace gets its companion
    files. Writes the HTML report (kvcheck.html_report) beside the trace and returns
    its path; a report that cannot be written is said on stderr and loses nothing else
    (the trace is already on disk)."""
    from kvcheck.html_report import write_html_report
    try:
        return write_html_report(path, backend=backend)
    except Exception as e:  # noqa: BLE001  (the trace must survive a report bug)
        print(f"kvcheck: warning: no HTML report for {path}: {type(e).__name__}: {e}",
              file=sys.stderr, flush=True)
        return None


@dataclass
class Found:
    id: str
    side: str
    step: int
    path: Path
    length: int
    original_length: int
    seconds_to_find: float      # campaign start -> first report printed
    summary: str
    index: int = 0              # the sequence that found it
    shrunk: bool = False
    seconds_to_shrunk: Optional[float] = None
    replays: int = 0
    seconds_generated: float = 0.0  # campaign start -> the failing sequence reached the driver
    html: Optional[Path] = None     # the HTML report beside the trace
    since_start: float = 0.0        # the command's start (kvcheck.clock) -> first report


@dataclass
class FuzzReport:
    seed: int
    backend: str
    engine: str = DEFAULT_ENGINE
    workers: int = 1
    seconds: float = 0.0
    sequences: int = 0
    steps: int = 0
    coverage: dict = field(default_factory=dict)
    outcomes: dict = field(default_factory=dict)
    paths: dict = field(default_factory=dict)
    found: list = field(default_factory=list)
    duplicates: int = 0
    interrupted: bool = False
    beyond: dict = field(default_factory=dict)
    """Sequences that stopped comparing beyond the accepted findings' model, by reason
    (`checker.Beyond`); `not_compared`: their steps left uncompared."""
    not_compared: int = 0
    beyond_checked: int = 0
    beyond_differs: dict = field(default_factory=dict)
    beyond_past: int = 0
    """Stops where the system under test ran alone on the stop's step, by kind
    (`checker.Beyond.kind`) those where it did not show what the spec stopped at
    (`Stats.beyond_differs`), and those where it did not but was past what the spec
    follows of it (`Stats.beyond_past`)."""
    beyond_traces: dict = field(default_factory=dict)
    """Kind (`checker.Beyond.kind`) -> the trace of the first such stop (`_Driver.stop`)."""

    def render(self) -> str:
        rate = self.steps / self.seconds if self.seconds else 0.0
        lines = [f"fuzz: backend {self.backend}, engine {self.engine}, seed {self.seed}, "
                 f"{self.workers} worker(s), {self.seconds:.1f} s"
                 f"{' (INTERRUPTED)' if self.interrupted else ''}",
                 f"  sequences {self.sequences}, steps {self.steps}, {rate:.0f} steps/s",
                 "  operation coverage (applied steps):"]
        width = max(len(n) for n in OP_NAMES)
        for n in OP_NAMES:
            outs = ", ".join(f"{k.split(':', 1)[1]} {v}" for k, v in sorted(self.outcomes.items())
                             if k.split(":", 1)[0] == n)
            lines.append(f"    {n:<{width}} {self.coverage.get(n, 0):>7}  {outs}")
        if self.paths:
            lines.append("  paths: " + ", ".join(f"{p} {n}" for p, n in sorted(self.paths.items())))
        missing = [n for n in OP_NAMES if not self.coverage.get(n)]
        if missing:
            lines.append(f"  NOT REACHED: {', '.join(missing)}")
        if self.beyond:
            lines.append("  " + beyond_line(self.beyond, self.not_compared, self.beyond_checked,
                                            self.beyond_differs, self.beyond_past))
            lines += differed_lines(self.beyond_traces)
        if not self.found:
            lines.append("  no failure found" + (" before the interrupt" if self.interrupted else ""))
        for f in self.found:
            how = (f"{f.length} ops, shrunk from {f.original_length}" if f.shrunk else
                   f"{f.length} ops, UNSHRUNK (interrupted while shrinking)")
            lines.append(f"  FAILURE {f.id} on {f.side} at step {f.step} ({how}; first reported "
                         f"{f.since_start:.1f} s after the start): {f.summary}")
            lines.append(f"    trace:  {f.path}")
            if f.html is not None:
                lines.append(f"    report: {f.html}")
            lines.append(f"    replay: kvcheck replay {f.path} --backend {self.backend}")
            lines.append(f"    keep it: mv {f.path} stateful_tests/regressions/ "
                         "(replayed by make check and make test from then on)")
        if self.duplicates:
            lines.append(f"  ({self.duplicates} more failure(s) with an already-reported root cause)")
        if self.interrupted and self.found:
            lines.append("  traces written: " + ", ".join(
                f"{f.path}{'' if f.shrunk else ' (unshrunk)'}" for f in self.found))
        return "\n".join(lines)


# -- interrupts ----------------------------------------------------------------------------

class Interrupts:
    """SIGINT sets a flag and raises KeyboardInterrupt, except inside `deferred()` (a
    trace being written), where it is raised when the block ends. The flag is checked
    between sequences and replays, so an interrupt swallowed by a library still ends
    the campaign."""

    def __init__(self) -> None:
        self.flag = False
        self.depth = 0

    def handler(self, signum, frame):
        self.flag = True
        if not self.depth:
            raise KeyboardInterrupt

    def check(self) -> None:
        if self.flag:
            raise KeyboardInterrupt

    @contextmanager
    def deferred(self):
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
        if not self.depth:
            self.check()

    @contextmanager
    def installed(self):
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        old = signal.signal(signal.SIGINT, self.handler)
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, old)


# -- console output ------------------------------------------------------------------------

class Console:
    """What a campaign prints on stderr as it goes: the first report of every failure
    (always), shrink progress (a live rich line on a terminal, one line otherwise),
    and, unless quiet, the header and a campaign-wide progress line. `silent`: nothing at
    all (a benchmark that prints its own table)."""

    def __init__(self, quiet: bool = False, prefix: str = "", silent: bool = False) -> None:
        from rich.console import Console as RichConsole
        self.quiet, self.prefix, self.silent = quiet or silent, prefix, silent
        self.rich = RichConsole(stderr=True, highlight=False, soft_wrap=True)

    def line(self, msg: str, always: bool = False) -> None:
        if self.silent:
            return
        if always or not self.quiet:
            print(self.prefix + msg, file=sys.stderr, flush=True)

    def found(self, f: Found) -> None:
        self.line(f"FOUND {f.id} on {f.side} at step {f.step} (sequence {f.index}, "
                  f"{f.since_start:.1f} s after the start): {f.summary}", always=True)
        self.line(f"  unshrunk trace ({f.original_length} ops): {f.path}", always=True)

    @contextmanager
    def shrinking(self, f: Found, max_replays: int):
        """Yields on_replay(replays, length) for the shrinker."""
        if self.silent or not self.rich.is_terminal:
            yield lambda n, length: None
            return
        from rich.progress import BarColumn, Progress, TextColumn
        with Progress(TextColumn(self.prefix + "  shrinking {task.description}"), BarColumn(),
                      TextColumn("{task.completed}/{task.total} replays, {task.fields[ops]} ops"),
                      console=self.rich, transient=True) as prog:
            task = prog.add_task(f"{f.id}", total=max_replays, ops=f.original_length)
            yield lambda n, length: prog.update(task, completed=n, ops=length)

    def shrunk(self, f: Found) -> None:
        self.line(f"  shrunk {f.original_length} -> {f.length} ops in {f.replays} replays "
                  f"({f.seconds_to_shrunk:.1f} s): {f.path}", always=True)


# -- the campaign ---------------------------------------------------------------------------

def root_cause(failure) -> tuple:
    """What deduplicates failures across sequences and workers: the failure id, the side,
    the operation at the failing step and the kind of owner the first violation names."""
    owner = failure.violations[0].owner if failure.violations else None
    kind = owner.split()[0] if owner else "-"
    return (failure.id, failure.side, failure.op.name, kind)


def fuzz(seconds: Optional[float] = None, seed: Optional[int] = None, backend: str = "impl",
         out_dir: str | Path = "failures", *, rounds: Optional[int] = None,
         engine: str = DEFAULT_ENGINE, workers: int = 1, use_ray: bool = False,
         ray_address: Optional[str] = None, stop_on_first: bool = False, quiet: bool = False,
         shrink_replays: int = DEFAULT_REPLAYS, label: str = "", planted: tuple = (),
         spec_enabled: Optional[bool] = None, console: Optional[Console] = None,
         accept: tuple = ()) -> FuzzReport:
    """Run a campaign within `rounds` sequences and/or `seconds` (at least one).
    `accept`: recorded upstream findings whose behaviour the spec takes (`--accept`)."""
    from kvcheck.impl import faults
    from kvcheck.backends import resolve
    if rounds is None and seconds is None:
        raise ValueError("fuzz needs a budget: rounds or seconds")
    factory, bname = resolve(backend)       # a bad backend is a usage error before any work
    out_dir = _writable_dir(Path(out_dir))
    if seed is None:
        seed = random.SystemRandom().randrange(2**32)
    console = console or Console(quiet)
    c = Campaign(engine, seed, backend, spec_enabled, tuple(accept))
    report = FuzzReport(seed=seed, backend=bname, engine=engine)
    stats = Stats()
    ints = Interrupts()
    start = time.monotonic()
    drv = _Driver(c, report, console, ints, out_dir, factory, bname, shrink_replays,
                  label or ",".join(planted), start)
    executor = None
    preload_engine(engine)
    with ints.installed(), faults.planted(*planted):
        try:
            executor = make_executor(workers, ray_address, use_ray)
            _header(console, c, bname, rounds, seconds, workers, use_ray)
            report.workers = executor.workers
            _loop(executor, c, stats, drv, rounds, seconds, stop_on_first, tuple(planted), start)
        except KeyboardInterrupt:
            report.interrupted = True
        finally:
            if executor is not None:
                executor.shutdown()
    report.seconds = time.monotonic() - start
    report.sequences, report.steps = stats.sequences, stats.steps
    report.coverage, report.outcomes = dict(stats.coverage), dict(stats.outcomes)
    report.paths = dict(stats.paths)
    report.beyond, report.not_compared = dict(stats.beyond), stats.not_compared
    report.beyond_checked, report.beyond_differs = stats.beyond_checked, dict(stats.beyond_differs)
    report.beyond_past = stats.beyond_past
    return report


ENGINE_MODULES = {"walk": ("kvcheck.engines.walk",),
                  "guided": ("kvcheck.engines.walk", "kvcheck.engines.guided"),
                  "hypothesis": ("kvcheck.engines.hypothesis_machine",)}


def preload_engine(engine: str) -> None:
    """Import the modules an inline chunk of `engine` imports, before the Ctrl-C handler
    is installed: a KeyboardInterrupt raised inside a module's import (a dataclass's
    `__set_name__`) reaches the driver as a RuntimeError, which would end the campaign with
    a traceback instead of exit 130."""
    import importlib
    for name in ENGINE_MODULES.get(engine, ()):
        importlib.import_module(name)


def _writable_dir(path: Path) -> Path:
    """The failure folder (checked as the --out flag is, then created): one that cannot
    take a trace is a usage error before any work, not a traceback after a failure."""
    from argparse import ArgumentTypeError

    from kvcheck.argtypes import writable_dir
    from kvcheck.errors import UsageError
    try:
        path = writable_dir(str(path))
        path.mkdir(parents=True, exist_ok=True)
    except (ArgumentTypeError, OSError) as e:
        raise UsageError(f"--out {path}: cannot write failure traces there ({e})") from None
    return path


def _header(console, c, bname, rounds, seconds, workers, use_ray) -> None:
    from kvcheck.backends import known_findings
    budget = " and ".join(x for x in (f"{rounds} sequences" if rounds is not None else "",
                                      f"{seconds:g} s" if seconds is not None else "") if x)
    console.line(f"kvcheck fuzz: backend {bname}, engine {c.engine}, seed {c.seed} (rerun with "
                 f"--seed {c.seed}), {budget}"
                 + (f", {workers} workers" if workers > 1 else "") + (" on Ray" if use_ray else ""))
    if c.accept:
        console.line(f"  the spec takes upstream's behaviour for {', '.join(c.accept)} (--accept)")
        if c.engine != "hypothesis":
            console.line("  one sequence in two leaves out the operations that lead past the accepted "
                         "findings' model (a second live turn of a session), so it is compared to its end")
    if known_findings(c.backend, c.accept) is not None:
        console.line("  leaving out operations that trigger the findings recorded for "
                     f"{bname} (docs/upstream-findings.md; their traces stay in stateful_tests/upstream/)")


def _loop(executor, c, stats, drv, rounds, seconds, stop_on_first, planted, start) -> None:
    unit = c.chunk_unit
    chunk = unit if executor.workers <= 1 else max(unit, WORKER_CHUNK)
    todo: deque = deque()           # (start, end) ranges left over by chunks that stopped early
    nxt = 0
    pending: list = []
    last = start

    def more() -> bool:
        if stop_on_first and drv.report.found:
            return False
        if seconds is not None and time.monotonic() - start >= seconds:
            return False
        return bool(todo) or rounds is None or nxt < rounds

    while True:
        drv.ints.check()
        while more() and len(pending) < 2 * executor.workers:
            if todo:
                a, b = todo.popleft()
            else:
                a, b = nxt, nxt + chunk if rounds is None else min(nxt + chunk, rounds)
                nxt = b
            pending.append(executor.submit(c, a, b - a, planted))
            if executor.workers <= 1:
                break
        if not pending:
            return
        done, pending = executor.wait(pending)
        for res in done:
            stats.merge(res.stats)
            if res.end < res.limit:
                todo.append((res.end, res.limit))
            for st in res.stops:
                drv.stop(st)
            if res.failure is not None and not (stop_on_first and drv.report.found):
                drv.failure(res.failure)
        now = time.monotonic()
        if now - last >= PROGRESS_EVERY_S:
            last = now
            el = now - start
            drv.console.line(f"  [{el:6.1f}s] sequences {stats.sequences}, steps {stats.steps} "
                             f"({stats.steps / el:.0f}/s), failures {len(drv.report.found)}"
                             + (f", duplicates {drv.report.duplicates}" if drv.report.duplicates else ""))


class _Driver:
    """Deduplicates, writes, reports and shrinks each failure, in the driver process."""

    def __init__(self, c, report, console, ints, out_dir, factory, bname, replays, label, start):
        self.c, self.report, self.console, self.ints = c, report, console, ints
        self.out_dir, self.factory, self.bname = out_dir, factory, bname
        self.replays, self.label = replays, label
        self.seen: set = set()
        self.start = start

    def stop(self, raw) -> None:
        """The first stop of each reason where the system under test, alone on the stop's
        step, did not show what the spec stopped at: its trace (expectation: pass up to the
        stop; `kvcheck replay` prints both sides' verdicts at that step), not a failure."""
        b = raw.beyond
        if b.kind in self.report.beyond_traces:
            return
        meta = {"source": "fuzz", "engine": self.c.engine, "seed": self.c.seed,
                "round": raw.index, "backend": self.bname, **planted_upstream(self.bname)}
        with self.ints.deferred():
            path = beyond_trace(raw.cfg, raw.ops, b, meta).save(
                self.out_dir / "beyond" / f"{b.kind}-seed{self.c.seed}-r{raw.index}.json")
            self.report.beyond_traces[b.kind] = str(path)

    def failure(self, raw: RawFailure) -> None:
        generated = time.monotonic() - self.start
        key = root_cause(raw.failure)
        if key in self.seen:
            self.report.duplicates += 1
            return
        self.seen.add(key)
        f = raw.failure
        name = f"{f.id}-{f.side}-seed{self.c.seed}-r{raw.index}.json"
        meta = {"source": "fuzz", "engine": self.c.engine, "seed": self.c.seed,
                "round": raw.index, "backend": self.bname, **planted_upstream(self.bname),
                **({"planted_fault": self.label} if self.label else {})}
        with self.ints.deferred():
            path = _write(raw.cfg, raw.ops, f, {**meta, "shrunk": False}, self.out_dir / name)
            found = Found(f.id, f.side, f.step, path, len(raw.ops), len(raw.ops),
                          time.monotonic() - self.start, _summary(f), raw.index,
                          seconds_generated=generated, since_start=clock.since_start())
            self.report.found.append(found)
        self.console.found(found)
        found.html = self.companions(found)
        self._shrink(raw, found, meta)

    def companions(self, found: Found) -> Optional[Path]:
        """The HTML report of a trace just written (interrupt-safe like the trace)."""
        with self.ints.deferred():
            html = on_trace_written(found.path, self.bname)
        if html is not None:
            self.console.line(f"  report: {html}", always=True)
        return html

    def _shrink(self, raw: RawFailure, found: Found, meta: dict) -> None:
        failure, cfg = raw.failure, raw.cfg
        skip = known_findings(self.bname, cfg.accept)     # as the engines left them out

        def outcome(candidate):
            self.ints.check()
            backend = self.factory(cfg) if self.factory else None
            try:
                return run_ops(cfg, candidate, backend, backend_name=self.bname,
                               skip=skip).failure
            finally:
                if backend is not None and hasattr(backend, "close"):
                    backend.close()

        def fails_same(candidate) -> bool:
            f = outcome(candidate)
            return f is not None and f.id == failure.id and f.side == failure.side

        replays = [0]
        with self.console.shrinking(found, self.replays) as progress:
            def on_replay(n, length):
                replays[0] = n
                progress(n, length)
            small = shrink(raw.ops, fails_same, max_replays=self.replays, on_replay=on_replay) \
                if fails_same(raw.ops) else raw.ops
        final = outcome(small) or failure
        with self.ints.deferred():
            _write(cfg, small, final, {**meta, "summary": _summary(final)}, found.path)
            found.id, found.side, found.step = final.id, final.side, final.step
            found.length, found.summary, found.shrunk = len(small), _summary(final), True
            found.replays = replays[0] + 2
            found.seconds_to_shrunk = time.monotonic() - self.start
        self.console.shrunk(found)
        found.html = self.companions(found) or found.html


def _summary(f) -> str:
    return str(f.violations[0]) if f.violations else \
        f"{f.id} {f.name}" + (f": {f.details[0]}" if f.details else "")


def _write(cfg, ops, failure, meta, path) -> Path:
    return failure_trace(cfg, ops, failure, meta).save(path)
