"""The breadth-first search over a scope: visited set of fingerprints with parent links,
levels kept or rebuilt, every state and transition checked; its Result, and a
violation's shortest trace."""
from __future__ import annotations

import gc
import itertools
import sys
import time
from array import array
from bisect import bisect_left, bisect_right
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Optional

from kvcheck.spec import model as M
from kvcheck.spec import ops as O
from kvcheck.fast_invariants import applies as applies_fast
from kvcheck.fast_invariants import state_clean
from kvcheck.spec.invariants import STATE_INVARIANTS, STEP_INVARIANTS, check_state, check_step
from kvcheck.spec.progress import P1, drained
from kvcheck.spec.state import State, initial_state
from kvcheck.spec.view import abstract
from kvcheck.explore.candidates import candidate_ops
from kvcheck.explore.goals import SITUATIONS, _op_applies, situation_applies
from kvcheck.explore.scope import Scope
from kvcheck.explore.symmetry import state_key

SPEC_ASSERTION = "M1"      # an upstream assertion the spec reached (kvcheck.checker's id)
SPEC_EXCEPTION = "E1"      # the spec itself raised something else (a defect in spec/)

# ---------------------------------------------------------------------------
# the search
# ---------------------------------------------------------------------------

PREFILTERED_STEP_INVARIANTS = frozenset({"I10", "I16", "I25", "I28"})


def step_check_needed(b: State, op, out: str, a: State) -> bool:
    """A sound over-approximation of "some step invariant can fire on this transition",
    on the concrete states, so that the abstract view of a transition into an already
    visited state is built only when it matters. It covers the step invariants of
    spec/invariants.py as they are: I25 (rejected restore idempotent) a rejected schedule
    of a request that holds a row through its slot's virtual anchor; I16 (locked node
    evicted) a step that removes a node locked before it; I10 (slot fixed) a step that
    changes a slot's protected length or anchor (a node keeps its path for life, so an
    unchanged anchor names the same path); I28 (checkpoint advance) a step that changes a
    checkpoint. When spec/ gains another step invariant the explorer stops using it (see
    `explore`); tests check it against the full check_step."""
    if out == "rejected":
        r = dict.get(b.reqs, getattr(op, "rid", None))
        if r is not None and r.row is not None and r.last_node is not None \
                and r.last_node[0] == "virtual":
            return True
    bn = b.nodes                    # key views and plain reads: nothing is copied
    for nid in dict.keys(bn) - dict.keys(a.nodes):
        if dict.__getitem__(bn, nid).lock_ref > 0:
            return True
    get = dict.get                  # reads; an entity the step did not touch is shared
    aslots = a.slots
    for sid, t in dict.items(b.slots):
        u = get(aslots, sid)
        if u is not None and u is not t and (u.protected != t.protected
                                             or u.last_node != t.last_node):
            return True
    asess = a.sessions
    for sid, x in dict.items(b.sessions):
        y = get(asess, sid)
        if y is not None and y is not x and y.checkpoint != x.checkpoint:
            return True
    return False

@dataclass
class Found:
    id: str
    name: str
    message: str
    depth: int                # number of ops in the trace
    ops: list


@dataclass
class Result:
    scope: Scope
    symmetric: bool
    states: int = 0
    transitions: int = 0
    max_depth: int = 0
    complete_depth: int = -1          # every state at depth <= this was expanded
    exhausted: bool = False           # no new states below the depth bound
    stopped: Optional[str] = None     # why the search stopped early
    seconds: float = 0.0
    op_counts: Counter = field(default_factory=Counter)
    outcome_counts: Counter = field(default_factory=Counter)
    op_first: dict = field(default_factory=dict)          # op name -> depth first taken
    outcome_first: dict = field(default_factory=dict)     # (op, outcome) -> depth
    reached: dict = field(default_factory=dict)           # situation id -> depth
    violations: list = field(default_factory=list)        # Found, first per id
    level_sizes: list = field(default_factory=list)
    rebuilt_levels: list = field(default_factory=list)    # depths not kept (frontier_states)
    frontier_states: Optional[int] = None
    visited: tuple = field(default=(), repr=False)      # (seen set, parents, via)
    op_table: list = field(default_factory=list, repr=False)   # via's operations
    backend_check: str = ""           # `--backend impl`: the transition check's verdict line
    beyond_traces: dict = field(default_factory=dict)   # kind -> trace of the first stop
                                      # where the backend alone differed (TransitionReport.differs)
    workers: "WorkerTimes" = field(default_factory=lambda: WorkerTimes())

    def bytes_per_state(self, sample: int = 2000) -> float:
        """Memory of the visited set and the parent links per distinct state (a sample of
        the keys sized deeply, so that whole keys are counted with their contents)."""
        if not self.visited:
            return 0.0
        seen, parents, via = self.visited
        keys = list(itertools.islice(seen, sample))
        per_key = sum(_deep_size(k) for k in keys) / max(len(keys), 1)
        total = (sys.getsizeof(seen) + per_key * len(seen) + parents.itemsize * len(parents)
                 + via.itemsize * len(via))
        return total / max(self.states, 1)

    @property
    def states_per_s(self) -> float:
        return self.states / self.seconds if self.seconds > 0 else 0.0


@dataclass
class WorkerTimes:
    """Where a parallel search's CPU went: each worker's CPU seconds, per level and in
    all (empty for a search in one process)."""
    levels: list = field(default_factory=list)      # per level: {worker: CPU seconds}

    def level(self) -> None:
        self.levels.append({})

    def note(self, w: int, cpu: float) -> None:
        self.levels[-1][w] = cpu

    @property
    def count(self) -> int:
        return 1 + max((w for lv in self.levels for w in lv), default=0)

    @property
    def cpu(self) -> float:
        return sum(sum(lv.values()) for lv in self.levels)

    @property
    def critical(self) -> float:
        """CPU seconds of the busiest worker of each level, summed: the wall time the
        levels take on free cores, every worker waiting for the slowest."""
        return sum(max(lv.values(), default=0.0) for lv in self.levels)


def _whole_key(key: tuple) -> tuple:
    return key


def _deep_size(x, _seen=None) -> int:
    """Bytes of x and of everything it holds that no other sized object shares."""
    _seen = set() if _seen is None else _seen
    if id(x) in _seen:
        return 0
    _seen.add(id(x))
    if isinstance(x, int) and -5 <= x <= 256:
        return 0                    # CPython's shared small ints
    n = sys.getsizeof(x)
    if isinstance(x, (tuple, list, frozenset, set)):
        n += sum(_deep_size(y, _seen) for y in x)
    return n


FRONTIER_STATES = 250_000
"""`_search`'s default: a level of more states is rebuilt by re-execution, not kept
(about 1.5 GB a level kept; the nightly's levels pass it from depth 16)."""


def _level_states(s0: State, d: int, starts: list, parents: array, via: array,
                  op_table: list, lo: Optional[int] = None, hi: Optional[int] = None):
    """The states of BFS level d, in index order, as (index, state, None): rebuilt by
    re-executing the parent links from the initial state s0, depth first (only the path
    and its siblings are held). Breadth-first search gives every state a higher index
    than its parent and the children of one parent consecutive indices, in the parents'
    order, so a level's parent links are sorted and a node's children are found by
    bisection; `starts[k]` is the first index of level k. A child with no children of
    its own above level d is not rebuilt. Re-execution is exact: a step is a function of
    its state and op, and the op is the one that first reached the state. `lo`, `hi`:
    only the level's states with an index in [lo, hi) (and of the levels above, only
    their ancestors, a contiguous range of each level)."""
    lo = starts[d] if lo is None else lo
    hi = starts[d + 1] if hi is None else hi
    if d == 0:
        if lo <= 0 < hi:
            yield 0, s0, None
        return
    if lo >= hi:
        return
    bounds = [(lo, hi)]                 # the ancestors' index range at levels d, d-1, ..., 1
    for _ in range(d - 1):
        a, b = bounds[-1]
        bounds.append((parents[a], parents[b - 1] + 1))
    bounds.reverse()                    # bounds[k - 1]: level k's
    step = M.step
    stack = [(0, s0, 0)]
    while stack:
        i, s, k = stack.pop()
        a, b = bounds[k]
        lo_c = bisect_left(parents, i, max(starts[k + 1], a), min(starts[k + 2], b))
        hi_c = bisect_right(parents, i, lo_c, min(starts[k + 2], b))
        if k + 1 == d:
            for j in range(lo_c, hi_c):
                yield j, step(s, op_table[via[j]], True)[0], None
            continue
        below, end = starts[k + 2], starts[k + 3]
        for j in range(hi_c - 1, lo_c - 1, -1):     # popped in index order
            c = bisect_left(parents, j, below, end)
            if c < end and parents[c] == j:
                stack.append((j, step(s, op_table[via[j]], True)[0], k + 1))


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


class Expander:
    """The transitions out of one state, as one worker computes them (`expand`): each
    operation stepped, its successor fingerprinted, the invariants evaluated where they
    can fire, and every transition that matters to the merge written down as a note. It
    decides nothing that depends on other workers: `known` holds the fingerprints merged
    before (the visited set itself in one process, a copy of the earlier levels' in a
    worker), `fresh` those this worker found since `new_chunk`; a successor in neither is
    a candidate, which the merge (`Merge.parent`) turns into a new state unless an earlier
    part of the level found it first."""

    def __init__(self, sc: Scope, symmetric: bool, check: bool, known: set,
                 stop_on_violation: bool, fingerprint: Callable = hash) -> None:
        cfg = sc.cfg
        self.sc, self.cfg, self.symmetric = sc, cfg, symmetric
        self.check = check and not cfg.accept
        self.prefilter = {i.id for i in STEP_INVARIANTS} == PREFILTERED_STEP_INVARIANTS
        self.fast = applies_fast(cfg, [i.id for i in STATE_INVARIANTS])
        self.fp = fingerprint
        self.known = known
        self.fresh: set = set()
        self.stop_on_violation = stop_on_violation
        self.pending = [x for x in SITUATIONS if situation_applies(x, sc) is None]

    def new_chunk(self) -> None:
        self.fresh = set()

    def expand(self, s: State, a) -> tuple:
        """(ocs, notes, hits, succ, halted) of the transitions out of s (a: its abstract
        view, or None), in the order `candidate_ops` lists them: ocs the (op name,
        outcome) of each (outcome None where the step raised); notes, in order, one per
        transition the merge must see, (position, op, fingerprint, candidate, state
        violations, step violations, exception), a violation or an exception as (id,
        name, message); hits (position, situation ids); succ the candidates' successors,
        in order; halted: a violation stopped the expansion (stop_on_violation)."""
        cfg, sc, sym, fp = self.cfg, self.sc, self.symmetric, self.fp
        check, prefilter, fast = self.check, self.prefilter, self.fast
        known, fresh, pending = self.known, self.fresh, self.pending
        step = M.step
        ocs: list = []
        notes: list = []
        hits: list = []
        succ: list = []
        for pos, op in enumerate(candidate_ops(s, sc, sym)):
            name = op.name
            try:
                s2, out = step(s, op, True)
            except Exception as e:
                ocs.append((name, None))
                if cfg.accept:      # a leaf: the lockstep judges it (`_search`)
                    continue
                if isinstance(e, M.ModelError):
                    exc = (SPEC_ASSERTION, "upstream assertion reached by the spec", str(e))
                else:               # a defect in spec/ itself
                    exc = (SPEC_EXCEPTION, "the spec raised", f"{type(e).__name__}: {e}")
                notes.append((pos, op, None, False, (), (), exc))
                continue
            ocs.append((name, out))
            if pending:
                hit = [x for x in pending if x.detect(cfg, s, op, out, s2)]
                if hit:
                    hits.append((pos, [x.id for x in hit]))
                    for x in hit:
                        pending.remove(x)
            key = fp(state_key(s2, sym))
            new = key not in known and key not in fresh
            vs_state = vs_step = ()
            if check:
                # the abstract views only where a reference evaluation needs them
                a2 = None
                if not prefilter or step_check_needed(s, op, out, s2):
                    if a is None:
                        a = abstract(s)
                    a2 = abstract(s2)
                    vs_step = _found(check_step(a, op, out, a2, cfg))
                if new and not (fast and state_clean(s2)):
                    vs_state = _found(check_state(a2 or abstract(s2), cfg))
                if new and sc.progress and not vs_state:
                    vs_state = _found([v for v in drained(s2)[:1] if v is not None])
            if not new and not vs_step:
                continue
            notes.append((pos, op, key, new, vs_state, vs_step, None))
            if new:
                fresh.add(key)
                succ.append(s2)
            if (vs_state or vs_step) and self.stop_on_violation:
                return ocs, notes, hits, succ, True
        return ocs, notes, hits, succ, False


def _found(vs) -> tuple:
    """Violations as plain (id, name, message) tuples: they travel between processes."""
    return tuple((v.id, v.name, str(v)) for v in vs)


class Merge:
    """The search's own records (the Result, the visited set, the parent links) and the
    merge of each expanded state's notes into them, in the order one process expands
    them (the order of the parents' indices): the same records whoever expanded what."""

    def __init__(self, res: Result, all_violations: bool, max_states: Optional[int],
                 root_fingerprint) -> None:
        self.res = res
        self.all_violations, self.max_states = all_violations, max_states
        self.parents = array("i", [-1])         # parent index of each state
        self.via = array("i", [-1])             # index into op_table of the op that reached it
        self.op_table: list = res.op_table
        self.op_index: dict = {}
        self.seen = {root_fingerprint}
        res.visited = (self.seen, self.parents, self.via)
        self.found_ids: set = set()
        self.stop = False                   # a violation or a budget: no more merging
        self.stop_at_level_end = False      # an exception in a step: finish the level
        self.level_ocs: Counter = Counter()
        self.level_new: list = []           # fingerprints this level added to the visited set
        self.nxt_n = 0
        self.d1 = 1

    def trace_of(self, idx: int, op=None) -> list:
        out = [] if op is None else [op]
        while idx > 0:
            out.append(self.op_table[self.via[idx]])
            idx = self.parents[idx]
        out.reverse()
        return out

    def begin_level(self, d1: int) -> None:
        self.d1, self.nxt_n = d1, 0
        self.level_ocs = Counter()
        self.level_new = []

    def parent(self, idx: int, ocs: list, notes: list, hits: list) -> list:
        """Merge the expansion of state idx: [(candidate number, new state index)] of the
        candidates that became new states, in order; sets `stop` where the search ends."""
        res, seen, d1 = self.res, self.seen, self.d1
        made: list = []
        k = -1
        end = len(ocs)
        for pos, op, key, cand, vs_state, vs_step, exc in notes:
            if exc is not None:
                # an exception inside the step: keep going to the end of this level, so
                # that an invariant violation at the same depth (which replays cleanly
                # through run_ops) is preferred
                if exc[0] not in self.found_ids:
                    self.found_ids.add(exc[0])
                    res.violations.append(Found(*exc, d1, self.trace_of(idx, op)))
                    if not self.all_violations:
                        self.stop_at_level_end = True
                continue
            if cand:
                k += 1
            known = not cand or key in seen
            vs = vs_step if known else vs_state + vs_step
            if vs:
                v = vs[0]
                if v[0] not in self.found_ids:
                    self.found_ids.add(v[0])
                    res.violations.insert(0, Found(*v, d1, self.trace_of(idx, op)))
                    if not self.all_violations:
                        del res.violations[1:]
                        res.stopped = "first violation found"
                        self.stop, end = True, pos + 1
                        break
                if not known:
                    seen.add(key)           # violating: recorded, never expanded
                    self.level_new.append(key)
                continue
            if known:
                continue
            n = len(self.parents)
            seen.add(key)
            self.level_new.append(key)
            self.parents.append(idx)
            j = self.op_index.get(op)
            if j is None:
                j = self.op_index[op] = len(self.op_table)
                self.op_table.append(op)
            self.via.append(j)
            made.append((k, n))
            self.nxt_n += 1
            res.states += 1
            if self.max_states is not None and res.states >= self.max_states:
                res.stopped = f"state budget {self.max_states} reached"
                self.stop, end = True, pos + 1
                break
        res.transitions += end
        self.level_ocs.update(ocs if end == len(ocs) else ocs[:end])
        for pos, ids in hits:
            if pos < end:
                for x in ids:
                    res.reached.setdefault(x, d1)
        return made

    def end_level(self) -> None:
        """The level's operation and outcome counts into the Result, with the depth each
        was first taken at."""
        res, d1 = self.res, self.d1
        for (name, out), n in self.level_ocs.items():
            res.op_counts[name] += n
            if out is not None:
                res.op_first.setdefault(name, d1)
                res.outcome_counts[(name, out)] += n
                res.outcome_first.setdefault((name, out), d1)
        self.level_ocs = Counter()


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


def missed(res: Result) -> list:
    """Reachability goals that apply to the scope's config but were not reached."""
    sc = res.scope
    out = [n for n in O.OP_NAMES if n not in res.op_first and not _op_applies(n, sc)]
    out += [x.id for x in SITUATIONS if situation_applies(x, sc) is None
            and x.id not in res.reached and x.id not in sc.out_of_reach]
    return out


def to_trace(res: Result, v: Found):
    """A violation's trace; P1's runs the drain after its operations and fails once the
    drain has run its course (`Lockstep.drain`)."""
    from dataclasses import replace
    from kvcheck.trace import Expect, Trace
    cfg, step = res.scope.cfg, v.depth - 1
    if v.id == P1[0]:
        s = initial_state(cfg)
        for op in v.ops:
            s, _ = M.step(s, op)
        cfg, step = replace(cfg, drain=True), len(v.ops) + drained(s)[1]
    return Trace(cfg, list(v.ops), Expect("violation", v.id, step, "spec"),
                 {"source": "explore", "scope": res.scope.name,
                  "symmetry": res.symmetric, "message": v.message,
                  "states": res.states, "shortest": True})


# ---------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------
