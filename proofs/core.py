"""Result records and the prove/refute driver shared by every proof module.

z3 is bounded by its resource limit (`rlimit`: a count of solver steps), never by
wall-clock time, so a proof's outcome is the same on a loaded CI machine as on an idle
laptop. On the machine these were calibrated on, 1M rlimit units are roughly 0.7 s."""
from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import z3

RLIMIT_WHOLE = 60_000_000
"""The whole goal at once (split=False, linear goals); the largest decided needs ~11M."""
RLIMIT_ATTEMPTS = (4_000_000, 20_000_000, 20_000_000)
"""Per conjunct: no hints, monotonicity hints, hints + purified arithmetic. The largest
decided conjunct needs ~0.5M without hints and ~1.3M with them."""


@dataclass
class Result:
    name: str
    kind: str                  # "lemma" | "control" | "induction" | "crosshair"
    status: str                # "proved" | "refuted" | "unknown" | "error"
    seconds: float
    expected: str = "proved"   # a negative control expects "refuted"
    detail: str = ""
    model: dict = field(default_factory=dict)
    cached: bool = False       # reused from proofs/cache.py (same sources, same tools)

    @property
    def ok(self) -> bool:
        return self.status == self.expected


def conjuncts(g) -> list:
    if z3.is_and(g):
        out = []
        for c in g.children():
            out += conjuncts(c)
        return out
    return [g]


def _multiplicands(terms, p) -> list:
    """Every u such that p*u (or a quotient x / p) occurs in the terms."""
    seen, out = set(), {}

    def walk(t):
        if t.get_id() in seen:
            return
        seen.add(t.get_id())
        if z3.is_mul(t):
            ch = t.children()
            if any(c.eq(p) for c in ch):
                rest = [c for c in ch if not c.eq(p)]
                if rest:
                    r = rest[0]
                    for x in rest[1:]:
                        r = r * x
                    out[r.get_id()] = r
        if z3.is_app_of(t, z3.Z3_OP_IDIV) and t.children()[1].eq(p):
            out[t.get_id()] = t
        for c in t.children():
            walk(c)

    for t in terms:
        walk(t)
    return list(out.values())


def monotonicity(terms, divisors, limit: int = 40) -> list:
    """Instances of a valid fact of integer arithmetic that z3's nonlinear engine does
    not find by itself: for p > 0, p*u < p*v + p implies u <= v (p*(u-v) < p, so
    u - v < 1). Instantiated for the page-size divisors p over the multiplicands of p
    (and their negations) occurring in the formula. Adding valid facts keeps an unsat
    answer a proof and a sat model a real counterexample."""
    out = []
    uniq = {d.get_id(): d for d in divisors}
    for p in uniq.values():
        ms = _multiplicands(terms, p)[:limit]
        ms = ms + [-u for u in ms]
        ax = []
        for u in ms:
            ax.append(z3.Implies(p * u < p, u <= 0))
            ax.append(z3.Implies(p * u > -p, u >= 0))
            for v in ms:
                if not u.eq(v):
                    ax.append(z3.Implies(p * u < p * v + p, u <= v))
        if ax:
            out.append(z3.Implies(p > 0, z3.And(*ax)))
    return out


def _solve(hyps, extra, goal, rlimit: int, tactic: bool, logic: str | None = None):
    if logic:
        s = z3.SolverFor(logic)
    elif tactic:
        s = z3.Then("simplify", "purify-arith", "propagate-values", "solve-eqs", "smt").solver()
    else:
        s = z3.Solver()
    s.set("rlimit", int(rlimit))
    s.add(*hyps)
    s.add(*extra)
    s.add(z3.Not(goal))
    return checked(s), s


def checked(s):
    """s.check(), except that a Ctrl-C during it raises KeyboardInterrupt: without that, a
    check cut short reads as an undecided proof and the run goes on."""
    s.set("ctrl_c", False)      # Ctrl-C is ctrl_c_stops_z3's, not z3's own handler's
    r = s.check()
    stop_if_interrupted()
    if r == z3.unknown and "interrupted" in s.reason_unknown():
        raise KeyboardInterrupt
    return r


_CTRL_C = threading.Event()


def stop_if_interrupted() -> None:
    """Raise KeyboardInterrupt if a Ctrl-C arrived under ctrl_c_stops_z3."""
    if _CTRL_C.is_set():
        raise KeyboardInterrupt


@contextlib.contextmanager
def ctrl_c_stops_z3():
    """Ctrl-C stops the run, always, and cuts z3's running call short. Python's SIGINT
    handler alone is not enough: z3 catches the signal itself during a check (and answers
    unknown), and a KeyboardInterrupt raised inside a z3 object's __del__ is printed and
    dropped, so a run once went on to exit 0. Here Python's handler takes every SIGINT
    (z3's is off) and its wakeup fd wakes a watcher thread, which records the interrupt and
    interrupts z3; `checked` and the unit loop then raise KeyboardInterrupt
    (stop_if_interrupted). Off the main thread, where Python takes no signals, it changes
    nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _CTRL_C.clear()
    r, w = os.pipe()
    os.set_blocking(w, False)
    old_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)

    def watch():
        with os.fdopen(r, "rb", buffering=0) as pipe:
            while got := pipe.read(64):     # b"" once the run closes its end
                if signal.SIGINT in got:
                    _CTRL_C.set()
                    z3.main_ctx().interrupt()

    threading.Thread(target=watch, daemon=True, name="kvcheck-ctrl-c").start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(old_fd)
        os.close(w)


def check(hyps: list, goal, divisors=(), split: bool = True, logic: str | None = None,
          rlimits=RLIMIT_ATTEMPTS, rlimit_whole: int = RLIMIT_WHOLE):
    """Prove hyps => goal for all values of the free variables, conjunct by conjunct.
    Returns (status, model-as-dict or None): "proved", "refuted" (with a
    counterexample) or "unknown" (resource limit)."""
    status = "proved"
    if not split:  # the whole goal at once first (often faster for linear goals)
        r, s = _solve(hyps, [], goal, rlimit_whole, False, logic)
        if r == z3.unsat:
            return "proved", None
        if r == z3.sat:
            return "refuted", _model(s.model())
    for g in conjuncts(goal):
        mono = monotonicity(list(hyps) + [g], divisors) if divisors else []
        res = None
        # cheap first (no hints), then with the monotonicity hints, then purified
        attempts = zip(([], mono, mono), (False, False, True), rlimits)
        for extra, tactic, budget in attempts:
            r, s = _solve(hyps, extra, g, budget, tactic)
            if r == z3.unsat:
                res = "unsat"
                break
            if r == z3.sat:
                return "refuted", _model(s.model())
        if res != "unsat":
            status = "unknown"
    return status, None


CONTROL_RETRY = 5
"""A negative control left unknown by the first budget runs again with this many times it."""


def check_control(hyps: list, goal, **kw):
    """`check` for a negative control, which only has to show its counterexample: z3's
    search (its term order follows whatever ran before in the process, so pytest-xdist's
    test order changes it) can spend the first budget; a control left unknown runs again
    with CONTROL_RETRY times every budget. A proof's own budget is never raised."""
    status, model = check(hyps, goal, **kw)
    if status == "unknown":
        kw["rlimits"] = tuple(CONTROL_RETRY * r for r in kw.get("rlimits", RLIMIT_ATTEMPTS))
        kw["rlimit_whole"] = CONTROL_RETRY * kw.get("rlimit_whole", RLIMIT_WHOLE)
        status, model = check(hyps, goal, **kw)
    return status, model


def _model(m) -> dict:
    out = {}
    for d in m.decls():
        if d.arity() > 0:
            continue
        v = m[d]
        try:
            out[d.name()] = v.as_long() if z3.is_int_value(v) else (
                z3.is_true(v) if z3.is_bool(v) else str(v))
        except Exception:  # pragma: no cover
            out[d.name()] = str(v)
    return out


def timed(name: str, kind: str, expected: str, fn: Callable[[], tuple]) -> Result:
    t0 = time.perf_counter()
    try:
        status, model, detail = fn()
    except Exception as e:  # a crash is a failure, reported with its message
        return Result(name, kind, "error", time.perf_counter() - t0, expected,
                      detail=f"{type(e).__name__}: {e}")
    return Result(name, kind, status, time.perf_counter() - t0, expected, detail=detail,
                  model=model or {})


def fmt_model(model: dict, keep=None) -> str:
    items = sorted((k, v) for k, v in model.items()
                   if not k.startswith("k!") and "!" not in k and (keep is None or k in keep))
    return ", ".join(f"{k}={v}" for k, v in items)
