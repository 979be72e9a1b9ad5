"""The transitions out of one state as one worker computes them (`Expander`): each
operation stepped, its successor fingerprinted, the invariants evaluated where they can fire."""
from __future__ import annotations

from typing import Callable

from kvcheck.spec import model as M
from kvcheck.fast_invariants import applies as applies_fast
from kvcheck.fast_invariants import state_clean
from kvcheck.spec.invariants import STATE_INVARIANTS, STEP_INVARIANTS, check_state, check_step
from kvcheck.spec.progress import drained
from kvcheck.spec.state import State
from kvcheck.spec.view import abstract
from kvcheck.explore.candidates import candidate_ops
from kvcheck.explore.goals import SITUATIONS, situation_applies
from kvcheck.explore.scope import Scope
from kvcheck.explore.symmetry import state_key

SPEC_ASSERTION = "M1"      # an upstream assertion the spec reached (kvcheck.checker's id)
SPEC_EXCEPTION = "E1"      # the spec itself raised something else (a defect in spec/)

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
