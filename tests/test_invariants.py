"""Every invariant fires, with its id and the owner/page, on a state corrupted to break it.

The base states are real spec states (DOMAIN.md's worked example mid-turn-2, where a
request borrows the slot's row and the slot locks the first-turn prompt; and a shared
prefix run where a split node is locked by two requests)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from kvcheck.spec import ops as O
from kvcheck.spec.config import Config
from kvcheck.spec.invariants import INVARIANT_IDS, STATE_INVARIANTS, STEP_INVARIANTS, check_state, check_step
from kvcheck.spec.model import initial_state, step
from kvcheck.spec.view import abstract
from kvcheck.stateful_tests import scenarios as S


def state_after(sc, n):
    s = initial_state(sc.config)
    for op in sc.ops[:n]:
        s, _ = step(s, op)
    return abstract(s)


W = state_after(S.WORKED_EXAMPLE, 7)         # turn 2 running on the slot's row
X = state_after(S.SHARED_PREFIX, 6)          # two turns locking a split path
CFG_W = S.WORKED_EXAMPLE.config
CFG_X = S.SHARED_PREFIX.config


def ids(s, cfg):
    return {v.id for v in check_state(s, cfg)}


def with_req(s, rid, **kw):
    return replace(s, reqs=tuple(replace(r, **kw) if r.rid == rid else r for r in s.reqs))


def with_slot(s, sid, **kw):
    return replace(s, slots=tuple(replace(t, **kw) if t.sid == sid else t for t in s.slots))


def req(s, rid):
    return next(r for r in s.reqs if r.rid == rid)


def test_base_states_are_clean():
    assert check_state(W, CFG_W) == [] and check_state(X, CFG_X) == []
    assert W.slots and W.reqs and W.nodes and len(X.nodes) >= 2


def corruptions():
    r2 = req(W, 2)
    page = r2.row_pages[4]                  # page E, owned by the running turn
    deep = max(X.nodes, key=lambda n: len(n.path))
    parent = next(n for n in X.nodes if n.path == deep.parent)
    return {
        "I1": (replace(W, evictable_size=W.evictable_size + 4), CFG_W, None),
        "I2": (replace(W, free_pages=W.free_pages[1:]), CFG_W, W.free_pages[0]),
        "I3": (replace(W, free_pages=tuple(sorted(W.free_pages + W.free_pages[:1]))), CFG_W, W.free_pages[0]),
        "I17": (replace(W, free_pages=tuple(sorted(W.free_pages + (page,)))), CFG_W, page),
        "I4": (replace(W, free_rows=tuple(sorted(W.free_rows + (r2.row,)))), CFG_W, None),
        "I5": (with_req(W, 2, phase="queued", anchor=None, locked=False), CFG_W, None),
        "I6": (with_slot(W, 1, committed=W.slots[0].allocated + 1), CFG_W, None),
        "I7": (with_req(W, 2, allocated=r2.committed + 1), replace(CFG_W, spec_enabled=False), None),
        "I8": (with_slot(W, 1, protected=7), CFG_W, None),
        "I9": (with_req(W, 2, protected=r2.committed + 4), CFG_W, None),
        "I12": (with_req(W, 2, committed_freed=True), CFG_W, None),
        "I13": (replace(X, nodes=tuple(replace(n, lock_ref=n.lock_ref + 1) if n is deep else n
                                       for n in X.nodes)), CFG_X, None),
        "I14": (replace(X, nodes=tuple(replace(n, lock_ref=parent.lock_ref + 1) if n is deep else n
                                       for n in X.nodes)), CFG_X, None),
        "I15": (replace(X, protected_size=X.protected_size + 2), CFG_X, None),
        "I20": (replace(W, sessions=tuple(replace(x, inflight=False) for x in W.sessions)), CFG_W, None),
        "I22": (replace(W, slots=()), CFG_W, None),
        "I24": (with_slot(W, 1, row=None), CFG_W, None),
        "I29": (with_req(W, 2, row=None, row_pages=()), CFG_W, None),
        "I26": (replace(W, content=tuple((p, (99,) * 4 if p == page else c) for p, c in W.content)), CFG_W, page),
        "I27": (with_slot(W, 1, row_pages=(W.slots[0].row_pages[1], W.slots[0].row_pages[0])
                          + W.slots[0].row_pages[2:]), CFG_W, None),
    }


@pytest.mark.parametrize("inv_id", sorted(corruptions()))
def test_each_state_invariant_fires(inv_id):
    s, cfg, page = corruptions()[inv_id]
    vs = check_state(s, cfg)
    hit = [v for v in vs if v.id == inv_id]
    assert hit, f"{inv_id} did not fire; got {[str(v) for v in vs]}"
    text = str(hit[0])
    assert inv_id in text and INVARIANT_IDS[inv_id] in text
    if page is not None:
        assert any(v.page == page for v in hit), text


def test_every_state_invariant_has_a_corruption_test():
    from test_hybrid import hybrid_corruptions     # I40-I45: tests/test_hybrid.py
    from test_mamba_tree import mamba_tree_corruptions     # I44-I46 on tree-held states
    assert {i.id for i in STATE_INVARIANTS} <= \
        set(corruptions()) | set(hybrid_corruptions()) | set(mamba_tree_corruptions())


def test_every_declared_check_is_in_a_table():
    """A check declared with `invariant` in spec/invariants_*.py runs only if a table of
    spec/invariants.py lists it."""
    import importlib
    from pathlib import Path

    import kvcheck.spec
    listed = {i.check for i in STATE_INVARIANTS + STEP_INVARIANTS}
    declared = set()
    for f in Path(kvcheck.spec.__path__[0]).glob("invariants_*.py"):
        m = importlib.import_module(f"kvcheck.spec.{f.stem}")
        declared |= {fn for fn in vars(m).values() if hasattr(fn, "inv_id")}
    assert declared == listed, sorted(fn.inv_id for fn in declared ^ listed)


def test_step_invariants_fire():
    b = W
    # I10: a slot's protected length moved
    assert "I10" in {v.id for v in check_step(W, O.Decode(2), "ok", with_slot(W, 1, protected=4))}
    # I16: a locked node vanished
    locked = next(n for n in X.nodes if n.lock_ref > 0)
    gone = replace(X, nodes=tuple(n for n in X.nodes if n is not locked))
    assert "I16" in {v.id for v in check_step(X, O.Evict(4), "ok", gone)}
    # I25: a rejected retry of a restored turn changed the slot
    queued = with_req(W, 2, phase="queued")
    assert "I25" in {v.id for v in check_step(queued, O.Schedule(2, admit=False), "rejected",
                                                with_slot(queued, 1, allocated=12, committed=12))}
    # I28: the checkpoint advanced without a successful finish
    moved = replace(b, sessions=tuple(replace(x, checkpoint=x.checkpoint + (5,)) for x in b.sessions))
    assert "I28" in {v.id for v in check_step(W, O.Retract(2), "ok", moved)}
    assert "I28" not in {v.id for v in check_step(W, O.Finish(2), "ok", moved)}
    assert {i.id for i in STEP_INVARIANTS} == {"I10", "I16", "I25", "I28"}


def test_violation_names_owner_and_page():
    s, cfg, page = corruptions()["I17"]
    v = next(v for v in check_state(s, cfg) if v.id == "I17")
    assert v.owner == "req 2" and v.page == page and "kv_committed_len" in v.message


def test_i10_publishing_allowance_is_borrow_era_only():
    """A slot whose protected prefix grows during its turn's prefill_chunk is a borrow-era
    prompt publish; in the wrapper era the same change is an I10 violation."""
    a = W
    t = W.slots[0]
    b = with_slot(W, 1, protected=t.protected + 4)
    op = O.PrefillChunk(2)
    assert "I10" in {v.id for v in check_step(a, op, "ok", b, CFG_W)}
    assert "I10" in {v.id for v in check_step(a, op, "ok", b)}
    assert "I10" not in {v.id for v in check_step(a, op, "ok", b, replace(CFG_W, era="borrow"))}
