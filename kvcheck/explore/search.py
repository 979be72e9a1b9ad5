"""The breadth-first search over a scope (`explore`): the level loop, each level expanded
in this process (or on a pool's workers), its progress lines and time budget."""
from __future__ import annotations

import gc
import time
from typing import Callable, Optional

from kvcheck.spec import model as M
from kvcheck.spec.invariants import check_state
from kvcheck.spec.state import State
from kvcheck.spec.view import abstract
from kvcheck.explore.candidates import candidate_ops
from kvcheck.explore.expand import SPEC_ASSERTION, SPEC_EXCEPTION, Expander
from kvcheck.explore.frontier import FRONTIER_STATES, _level_states
from kvcheck.explore.merge import Merge
from kvcheck.explore.result import Found, Result
from kvcheck.explore.scope import Scope
from kvcheck.explore.symmetry import state_key


def _whole_key(key: tuple) -> tuple:
    return key


def reachable_states(sc: Scope, symmetric: bool = True) -> list:
    """Every distinct state of the scope within its depth bound, level by level, the
    initial state first: a plain breadth-first walk (no invariants, no bookkeeping) for
    tests and benchmarks that look at each state."""
    frontier = [M.initial_state(sc.cfg)]
    seen, out = {state_key(frontier[0], symmetric)}, list(frontier)
    for _ in range(sc.max_depth):
        nxt = []
        for s in frontier:
            for op in candidate_ops(s, sc, symmetric):
                s2, _ = M.step(s, op, checked=True)
                k = state_key(s2, symmetric)
                if k not in seen:
                    seen.add(k)
                    nxt.append(s2)
        out += nxt
        frontier = nxt
    return out


def explore(sc: Scope, **kw) -> Result:
    """The breadth-first search (`_search`, which documents the options) with Python's
    cyclic garbage collector paused: the frontier holds tens of thousands of states,
    each a few dozen containers, and every collection of the oldest generation walks
    them all (x1.16 interpreted, x1.4 compiled on `bench`, depth 9). A state holds no
    reference cycle (entities name each other by id), so nothing is left for the
    collector; it runs again, as it was, when the search returns."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        return _search(sc, **kw)
    finally:
        if was_on:
            gc.enable()


def _search(sc: Scope, *, symmetric: bool = True, all_violations: bool = False,
            max_states: Optional[int] = None, max_seconds: Optional[float] = None,
            check: bool = True, progress: Optional[Callable] = None,
            progress_every: float = 2.0, fingerprints: bool = True,
            frontier_states: Optional[int] = FRONTIER_STATES, pool=None) -> Result:
    """Breadth-first search over the scope. Stops at the first violation unless
    all_violations (then it records the first, shortest, trace per violation id and does
    not expand violating states).

    The visited set holds a 64-bit fingerprint of each state's canonical key (TLC and
    Stateright style; fingerprints=False: the whole key, the old way), each state's parent
    index and the index of the operation that reached it (two flat arrays); a
    counterexample trace is the chain of operations, re-executed from the initial state
    by whoever replays it. Two distinct keys share a fingerprint with probability about
    n^2 / 2^65 (1e-7 at a million states): one state would be wrongly merged.

    The invariants: a new state's state invariants are first asked of
    `kvcheck.fast_invariants.state_clean` (on the State itself), and only a state it does not call clean gets an AbstractState and
    spec/invariants.py's `check_state`, which writes the report. A transition's step
    invariants run (on the two abstract views) where `step_check_needed` says they can
    fire. So most states never get an abstract view; a frontier state gets one only when
    one of its transitions needs it.

    Under `Config.accept` the search judges nothing (check is off, and a step that raises
    is a leaf): the spec follows upstream's recorded behaviour there, and the transition
    check's lockstep (kvcheck/engines/exhaustive.py) judges every step, telling a path
    past the accepted findings' model (it stops comparing there) from a defect of the
    spec (reported, as always).

    The frontier: a level of up to `frontier_states` states is kept as State objects
    (about 6 KB each, shared entities divided); a larger one is not kept at all, and its
    states are rebuilt when the level is expanded by re-executing the parent links from
    the initial state (`_level_states`), so that memory stays at the visited set's bytes
    per state (None: always kept; 0: never). Both give the same search, state for state.

    Each state is expanded by an `Expander` and its notes merged by a `Merge`, one state
    after the other in this process, or, with `pool` (kvcheck/explore/parallel.py), a
    level's states in contiguous parts by the pool's workers and their notes merged here
    in the same order: the same Result."""
    cfg = sc.cfg
    check = check and not cfg.accept
    res = Result(sc, symmetric, frontier_states=frontier_states)
    t0 = time.perf_counter()
    s0 = M.initial_state(cfg)
    a0 = abstract(s0)
    fingerprint = (pool.fingerprint if pool is not None else hash) if fingerprints else _whole_key
    m = Merge(res, all_violations, max_states, fingerprint(state_key(s0, symmetric)))
    res.states = 1
    res.level_sizes.append(1)
    if check:
        vs = check_state(a0, cfg)
        if vs:
            res.violations.append(Found(vs[0].id, vs[0].name, str(vs[0]), 0, []))
            res.seconds = time.perf_counter() - t0
            return res
    if pool is None:
        level = _InlineLevels(Expander(sc, symmetric, check, m.seen, not all_violations,
                                      fingerprint), s0, a0, frontier_states)
    else:
        level = pool.levels(sc, symmetric, check, all_violations, fingerprints,
                            frontier_states)
    level_n = 1                         # states in the level being expanded
    starts = [0, 1]                     # index of each level's first state, and the end
    depth = 0
    clock = _Clock(t0, progress, progress_every, max_seconds)
    while level_n and not m.stop:
        if depth >= sc.max_depth or m.stop_at_level_end:
            break
        m.begin_level(depth + 1)
        level.expand(m, depth, starts, clock)
        m.end_level()
        if not m.stop:
            res.complete_depth = depth
        depth += 1
        starts.append(len(m.parents))
        level_n = m.nxt_n
        if level_n:
            res.max_depth = depth
            res.level_sizes.append(level_n)
        kept = frontier_states is None or level_n <= frontier_states
        if not kept:
            res.rebuilt_levels.append(depth)
        if level_n and not m.stop:
            level.next(m, depth, starts, kept)
    if not level_n and not m.stop:
        res.exhausted = True
    if m.stop_at_level_end and not res.stopped:
        res.stopped = "first violation found (an exception in the step; level finished)"
    # invariant violations first (they replay through run_ops), then M1, then E1
    res.violations.sort(key=lambda v: (v.depth, v.id == SPEC_EXCEPTION, v.id == SPEC_ASSERTION))
    res.seconds = time.perf_counter() - t0
    return res


class _Clock:
    """The search's progress lines and its time budget."""

    def __init__(self, t0: float, progress: Optional[Callable], every: float,
                 max_seconds: Optional[float]) -> None:
        self.t0, self.progress, self.every, self.max_seconds = t0, progress, every, max_seconds
        self.next_progress = t0 + every

    @property
    def deadline(self) -> Optional[float]:
        return None if self.max_seconds is None else self.t0 + self.max_seconds

    def tick(self, m: Merge, depth: int) -> None:
        """A progress line when one is due."""
        if self.progress is not None:
            now = time.perf_counter()
            if now >= self.next_progress:
                self.next_progress = now + self.every
                self.progress(m.res, depth, m.nxt_n, now - self.t0)

    def out_of_time(self, m: Merge) -> bool:
        """Past the time budget: the search stops (`stopped` says why)."""
        if self.max_seconds is not None and time.perf_counter() - self.t0 > self.max_seconds:
            self.time_up(m)
        return m.stop

    def time_up(self, m: Merge) -> None:
        m.res.stopped = f"time budget {self.max_seconds:g} s reached"
        m.stop = True


class _InlineLevels:
    """Every level expanded in this process, state after state, each state's notes merged
    as soon as it is expanded; the next level kept as State objects or rebuilt."""

    def __init__(self, exp: Expander, s0: State, a0, frontier_states: Optional[int]) -> None:
        self.exp, self.s0, self.frontier_states = exp, s0, frontier_states
        self.frontier = [(0, s0, a0)]
        self.nxt: Optional[list] = None

    def expand(self, m: Merge, depth: int, starts: list, clock: _Clock) -> None:
        exp, limit = self.exp, self.frontier_states
        nxt: Optional[list] = []            # None once the level outgrows frontier_states
        for idx, s, a in self.frontier:
            exp.new_chunk()
            ocs, notes, hits, succ, _ = exp.expand(s, a)
            made = m.parent(idx, ocs, notes, hits)
            if nxt is not None and made:
                if limit is None or m.nxt_n <= limit:
                    nxt.extend((n, succ[k], None) for k, n in made)   # abstract view: when needed
                else:
                    nxt = None      # rebuilt from the parent links when expanded
            clock.tick(m, depth)
            if m.stop or clock.out_of_time(m):
                break
        self.nxt = nxt

    def next(self, m: Merge, depth: int, starts: list, kept: bool) -> None:
        if kept and self.nxt is not None:
            self.frontier = self.nxt
        else:
            self.frontier = _level_states(self.s0, depth, starts, m.parents, m.via, m.op_table)
        self.nxt = None
