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
from kvcheck.spec.state import State
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
                  op_table: list):
    """The states of BFS level d, in index order, as (index, state, None): rebuilt by
    re-executing the parent links from the initial state s0, depth first (only the path
    and its siblings are held). Breadth-first search gives every state a higher index
    than its parent and the children of one parent consecutive indices, in the parents'
    order, so a level's parent links are sorted and a node's children are found by
    bisection; `starts[k]` is the first index of level k. A child with no children of
    its own above level d is not rebuilt. Re-execution is exact: a step is a function of
    its state and op, and the op is the one that first reached the state."""
    if d == 0:
        yield 0, s0, None
        return
    step = M.step
    stack = [(0, s0, 0)]
    while stack:
        i, s, k = stack.pop()
        lo = bisect_left(parents, i, starts[k + 1], starts[k + 2])
        hi = bisect_right(parents, i, lo, starts[k + 2])
        if k + 1 == d:
            for j in range(lo, hi):
                yield j, step(s, op_table[via[j]], True)[0], None
            continue
        below, end = starts[k + 2], starts[k + 3]
        for j in range(hi - 1, lo - 1, -1):     # popped in index order
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


def _search(sc: Scope, *, symmetric: bool = True, all_violations: bool = False,
            max_states: Optional[int] = None, max_seconds: Optional[float] = None,
            check: bool = True, progress: Optional[Callable] = None,
            progress_every: float = 2.0, fingerprints: bool = True,
            frontier_states: Optional[int] = FRONTIER_STATES) -> Result:
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
    per state (None: always kept; 0: never). Both give the same search, state for state."""
    cfg = sc.cfg
    check = check and not cfg.accept
    res = Result(sc, symmetric, frontier_states=frontier_states)
    prefilter = {i.id for i in STEP_INVARIANTS} == PREFILTERED_STEP_INVARIANTS
    fast = applies_fast(cfg, [i.id for i in STATE_INVARIANTS])
    t0 = time.perf_counter()
    s0 = M.initial_state(cfg)
    a0 = abstract(s0)
    parents = array("i", [-1])          # parent index of each state
    via = array("i", [-1])              # index into op_table of the op that reached it
    op_table: list = res.op_table
    op_index: dict = {}
    fp = hash if fingerprints else _whole_key
    seen = {fp(state_key(s0, symmetric))}
    res.visited = (seen, parents, via)
    res.states = 1
    res.level_sizes.append(1)
    if check:
        vs = check_state(a0, cfg)
        if vs:
            res.violations.append(Found(vs[0].id, vs[0].name, str(vs[0]), 0, []))
            res.seconds = time.perf_counter() - t0
            return res
    pending_sits = [x for x in SITUATIONS if situation_applies(x, sc) is None]
    frontier = [(0, s0, a0)]
    level_n = 1                         # states in the level being expanded
    starts = [0, 1]                     # index of each level's first state, and the end
    depth = 0
    next_progress = t0 + progress_every
    found_ids = set()
    stop = False

    def trace_of(idx, op=None):
        out = [] if op is None else [op]
        while idx > 0:
            out.append(op_table[via[idx]])
            idx = parents[idx]
        out.reverse()
        return out

    stop_at_level_end = False
    op_counts, outcome_counts = res.op_counts, res.outcome_counts
    op_first, outcome_first = res.op_first, res.outcome_first
    step, enabled_ops = M.step, candidate_ops
    while level_n and not stop:
        if depth >= sc.max_depth or stop_at_level_end:
            break
        nxt = []                        # None once the level outgrows frontier_states
        nxt_n = 0
        d1 = depth + 1
        for idx, s, a in frontier:
            for op in enabled_ops(s, sc, symmetric):
                res.transitions += 1
                name = op.name
                op_counts[name] += 1
                try:
                    s2, out = step(s, op, True)
                except Exception as e:
                    if cfg.accept:      # a leaf: the lockstep judges it (docstring)
                        continue
                    if isinstance(e, M.ModelError):
                        found = Found(SPEC_ASSERTION, "upstream assertion reached by the spec",
                                      str(e), d1, trace_of(idx, op))
                    else:                   # a defect in spec/ itself
                        found = Found(SPEC_EXCEPTION, "the spec raised",
                                      f"{type(e).__name__}: {e}", d1, trace_of(idx, op))
                    s2 = None
                if s2 is None:
                    # an exception inside the step: keep going to the end of this level,
                    # so that an invariant violation at the same depth (which replays
                    # cleanly through run_ops) is preferred
                    if found.id not in found_ids:
                        found_ids.add(found.id)
                        res.violations.append(found)
                        if not all_violations:
                            stop_at_level_end = True
                    continue
                oc = (name, out)
                outcome_counts[oc] += 1
                if name not in op_first:
                    op_first[name] = d1
                if oc not in outcome_first:
                    outcome_first[oc] = d1
                if pending_sits:
                    hit = [x for x in pending_sits if x.detect(cfg, s, op, out, s2)]
                    for x in hit:
                        res.reached[x.id] = d1
                        pending_sits.remove(x)
                key = fp(state_key(s2, symmetric))
                known = key in seen
                if not check:
                    if known:
                        continue
                    vs = ()
                else:
                    # the abstract views only where a reference evaluation needs them
                    a2 = None
                    vs = []
                    if not prefilter or step_check_needed(s, op, out, s2):
                        if a is None:
                            a = abstract(s)
                        a2 = abstract(s2)
                        vs = check_step(a, op, out, a2, cfg)
                    elif known:
                        continue
                    if not known and not (fast and state_clean(s2)):
                        vs = check_state(a2 or abstract(s2), cfg) + vs
                if vs:
                    v = vs[0]
                    if v.id not in found_ids:
                        found_ids.add(v.id)
                        res.violations.insert(0, Found(v.id, v.name, str(v), d1, trace_of(idx, op)))
                        if not all_violations:
                            del res.violations[1:]
                            res.stopped = "first violation found"
                            stop = True
                            break
                    if not known:
                        seen.add(key)           # violating: recorded, never expanded
                    continue
                if known:
                    continue
                n = len(parents)
                seen.add(key)
                parents.append(idx)
                k = op_index.get(op)
                if k is None:
                    k = op_index[op] = len(op_table)
                    op_table.append(op)
                via.append(k)
                nxt_n += 1
                if nxt is not None:
                    if frontier_states is None or nxt_n <= frontier_states:
                        nxt.append((n, s2, None))     # its abstract view: built when needed
                    else:
                        nxt = None      # rebuilt from the parent links when expanded
                res.states += 1
                if max_states is not None and res.states >= max_states:
                    res.stopped = f"state budget {max_states} reached"
                    stop = True
                    break
            if progress is not None:
                now = time.perf_counter()
                if now >= next_progress:
                    next_progress = now + progress_every
                    progress(res, depth, nxt_n, now - t0)
            if stop:
                break
            if max_seconds is not None and time.perf_counter() - t0 > max_seconds:
                res.stopped = f"time budget {max_seconds:g} s reached"
                stop = True
                break
        if not stop:
            res.complete_depth = depth
        depth = d1
        starts.append(len(parents))
        if nxt_n:
            res.max_depth = depth
            res.level_sizes.append(nxt_n)
        level_n = nxt_n
        if nxt is None:
            res.rebuilt_levels.append(depth)
            frontier = _level_states(s0, depth, starts, parents, via, op_table)
        else:
            frontier = nxt
    if not level_n and not stop:
        res.exhausted = True
    if stop_at_level_end and not res.stopped:
        res.stopped = "first violation found (an exception in the step; level finished)"
    # invariant violations first (they replay through run_ops), then M1, then E1
    res.violations.sort(key=lambda v: (v.depth, v.id == SPEC_EXCEPTION, v.id == SPEC_ASSERTION))
    res.seconds = time.perf_counter() - t0
    return res


def missed(res: Result) -> list:
    """Reachability goals that apply to the scope's config but were not reached."""
    sc = res.scope
    out = [n for n in O.OP_NAMES if n not in res.op_first and not _op_applies(n, sc)]
    out += [x.id for x in SITUATIONS if situation_applies(x, sc) is None
            and x.id not in res.reached and x.id not in sc.out_of_reach]
    return out


def to_trace(res: Result, v: Found):
    from kvcheck.trace import Expect, Trace
    return Trace(res.scope.cfg, list(v.ops),
                 Expect("violation", v.id, v.depth - 1, "spec"),
                 {"source": "explore", "scope": res.scope.name,
                  "symmetry": res.symmetric, "message": v.message,
                  "states": res.states, "shortest": True})


# ---------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------
