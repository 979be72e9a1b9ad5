"""kvcheck proofs: z3 lemmas over the page arithmetic of spec/pages.py (symbolic page
size), 1-induction of the accounting identity over abstract counters, negative controls
that must be refuted, and CrossHair on the spec's PEP 316 contracts.

    proofs.run_all(verbose, crosshair, cache, only) -> list[Result]
    proofs.report(results) -> str
    python -m proofs          (exit 1 unless every lemma is proved and every control refuted)
"""
from __future__ import annotations

import signal
import sys
import threading
import time

from kvcheck.proofs.core import Result, ctrl_c_stops_z3, stop_if_interrupted

__all__ = ["Result", "run_all", "report", "ok", "interrupted", "ProofsInterrupted"]


LEMMA_SOURCES = ("spec/pages.py", "proofs/core.py", "proofs/symexec.py", "proofs/lemmas.py")
INDUCTION_SOURCES = ("spec/pages.py", "proofs/core.py", "proofs/symexec.py", "proofs/induction.py")
"""What each z3 unit's outcome depends on (proofs/cache.py hashes these files)."""


def run_all(verbose: bool = False, crosshair: bool = True, cache=None,
            only: str | None = None, time_limit: float | None = None) -> list[Result]:
    """Every proof unit; `cache` (kvcheck.proofs.cache.ProofCache) reuses a unit whose covered
    sources are unchanged since it last passed; `only`: units whose name contains it;
    `time_limit`: CrossHair's wall-clock safety net (None: its default)."""
    from kvcheck.proofs import induction as I
    from kvcheck.proofs import lemmas as L
    from kvcheck.proofs.cache import cached_unit, digest, source_key
    from kvcheck.proofs.crosshair_check import TIME_LIMIT, run_crosshair

    box: list = []
    th = None
    if crosshair:  # CrossHair runs in subprocesses, concurrently with z3
        limit = TIME_LIMIT if time_limit is None else time_limit
        th = threading.Thread(target=lambda: box.extend(
            run_crosshair(limit, cache=cache, only=only)), daemon=True)
        th.start()
    results: list[Result] = []

    def emit(rs):
        results.extend(rs)
        for r in rs:            # each result as it completes (verbose: with its detail)
            print(_line(r) if verbose else _line(r).splitlines()[0], file=sys.stderr, flush=True)
        stop_if_interrupted()

    def units():
        lemma_key = source_key(*LEMMA_SOURCES)
        for lem in L.LEMMAS:
            name = getattr(lem, "name", str(lem))
            if only is None or only in name:
                emit(cached_unit(cache, name, digest(lemma_key, name),
                                 lambda lem=lem: L.run_lemma(lem)))
        induction_key = source_key(*INDUCTION_SOURCES)
        for name, run in I.units():
            if only is None or only in name:
                emit(cached_unit(cache, name, digest(induction_key, name), run))
        while th is not None and th.is_alive():
            th.join(0.2)
            stop_if_interrupted()
        emit(box)

    try:
        with ctrl_c_stops_z3():
            units()
    except KeyboardInterrupt:
        _ignore_further_interrupts()
        if cache is not None:   # the units that finished are not lost
            cache.save()
        raise ProofsInterrupted(results, cache) from None
    if cache is not None:
        cache.save()
    return results


def _ignore_further_interrupts() -> None:
    """Once interrupted, the run only saves and reports: a second SIGINT must not cut the
    save short."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:      # not the main thread: its interrupts are the caller's
        pass


class ProofsInterrupted(KeyboardInterrupt):
    """Ctrl-C during run_all: `results` holds the units that finished, whose passing
    results are saved in `cache` (None without one)."""

    def __init__(self, results: list, cache) -> None:
        super().__init__()
        self.results, self.cache = results, cache

    def written(self) -> str:
        kept = sum(r.ok and not r.cached for r in self.results)
        if self.cache is None or not self.cache.enabled or not kept:
            return f"{len(self.results)} units finished; nothing written"
        return f"{len(self.results)} units finished; {kept} new results saved in {self.cache.path}"


def ok(results: list[Result]) -> bool:
    return bool(results) and all(r.ok for r in results)


def interrupted(results: list[Result]) -> list[Result]:
    """The units a wall-clock safety net stopped: no verdict either way."""
    return [r for r in results if r.status == "interrupted"]


def _word(r: Result) -> str:
    if r.kind == "crosshair" and r.status == "proved":
        return "checked"
    return r.status


def _line(r: Result) -> str:
    mark = "ok  " if r.ok else "STOP" if r.status == "interrupted" else "FAIL"
    exp = "" if r.ok or r.status == "interrupted" else f" (expected {r.expected})"
    took = " cached" if r.cached else f"{r.seconds:6.2f}s"
    s = f"{mark} {_word(r):8s} {took:>7s}  {r.name}{exp}"
    if r.detail and (not r.ok or r.kind in ("control", "crosshair", "induction")):
        s += f"\n{'':22s}{r.detail}"
    return s


def report(results: list[Result]) -> str:
    lines = []
    for kind, title in (("lemma", "Page-arithmetic lemmas (z3, symbolic P >= 1)"),
                        ("induction", "Inductive accounting (1-induction, abstract counters)"),
                        ("crosshair", "CrossHair (PEP 316 contracts of spec/pages.py)"),
                        ("control", "Negative controls (must be refuted)")):
        rs = [r for r in results if r.kind == kind]
        if not rs:
            continue
        lines.append(f"== {title}")
        lines.extend(_line(r) for r in rs)
    n_stopped = len(interrupted(results))
    n_bad = sum(not r.ok for r in results) - n_stopped
    total = sum(r.seconds for r in results
                if not r.name.startswith("crosshair") and not r.cached)
    n_cached = sum(r.cached for r in results)
    lines.append(f"== {len(results) - n_bad - n_stopped}/{len(results)} as expected"
                 f" ({sum(r.kind == 'lemma' or r.kind == 'induction' for r in results)} proofs, "
                 f"{sum(r.kind == 'control' for r in results)} controls); z3 {total:.1f}s in all"
                 + (f"; {n_cached} reused from the cache (sources unchanged)" if n_cached else "")
                 + ("" if not n_bad else f"; {n_bad} NOT as expected")
                 + ("" if not n_stopped else f"; {n_stopped} interrupted by the time limit "
                    "(no verdict)"))
    return "\n".join(lines)
