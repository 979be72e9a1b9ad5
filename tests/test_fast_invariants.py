"""kvcheck/fast_invariants.py against the reference (spec/invariants.py on kvcheck.spec.view.abstract):
the same verdict on every state of a preset, and on states corrupted one field at a time
(each corruption breaks some invariant on some state, so a fast path that stops looking
at that field disagrees). KVCHECK_FULL_PRESETS=1 walks whole scopes (check-overlap:
76,623 states, a few minutes); by default depth bounds keep this file to seconds."""
from __future__ import annotations

import os
from dataclasses import replace

import pytest

from kvcheck import explore as E
from kvcheck import fast_invariants as F
from kvcheck.spec import model as M
from kvcheck.spec.invariants import STATE_INVARIANTS, check_state
from kvcheck.spec.view import abstract

FULL = bool(os.environ.get("KVCHECK_FULL_PRESETS"))


def reference_clean(s) -> bool:
    return not check_state(abstract(s), s.cfg)


def states_of(sc, depth=None):
    """Every distinct state of the scope (BFS, symmetric keys), up to `depth` steps."""
    return E.reachable_states(sc if depth is None else replace(sc, max_depth=depth))


CHECK_OVERLAP = E.preset_scope("check", "check-overlap")


def test_fast_path_covers_every_state_invariant():
    ids = {i.id for i in STATE_INVARIANTS}
    assert F.applies(CHECK_OVERLAP.cfg, ids) and F.applies(E.HYBRID_SCOPE.cfg, ids)
    assert not F.applies(CHECK_OVERLAP.cfg, ids | {"I99"})  # an invariant added since


@pytest.mark.parametrize("scope,depth", [(CHECK_OVERLAP, 6), (E.preset_scope("check", "check-spec-borrow"), 6),
                                         (E.PRESETS["p1"][0], 5), (E.HYBRID_SCOPE, 7),
                                         (E.HYBRID_BORROW_SCOPE, 7), (E.MAMBA_TREE_SCOPE, 7)],
                         ids=lambda x: getattr(x, "name", x))
def test_same_verdict_on_every_state(scope, depth):
    states = states_of(scope, None if FULL else depth)
    assert len(states) > 250
    for s in states:
        assert F.state_clean(s) == reference_clean(s) == True  # noqa: E712 (the spec is clean)


def _corruptions(s):
    """Copies of s with one field broken (a state is never mutated once cloned: each
    corruption works on its own clone and takes its entity through the CowMap)."""
    out = []

    def edit(fn):
        t = s.clone()
        if fn(t) is not False:
            out.append(t)

    reqs = sorted(dict(s.reqs))
    nodes = [nid for nid in dict(s.nodes) if nid != 0]
    slots = sorted(dict(s.slots))
    if s.free_pages:
        edit(lambda t: t.free_pages.append(t.free_pages[0]))                 # I3
        edit(lambda t: t.free_pages.pop())                                   # I2 leak / I1
    edit(lambda t: t.free_pages.append(t.cfg.num_pages + 1))                 # out of range
    edit(lambda t: setattr(t, "evictable_size", t.evictable_size + 1))      # I15 / I1
    edit(lambda t: setattr(t, "protected_size", t.protected_size + 1))
    if s.free_rows:
        edit(lambda t: t.free_rows.pop())                                    # I4 leak
        edit(lambda t: t.free_rows.append(t.free_rows[0]))
    for nid in nodes:
        edit(lambda t, nid=nid: setattr(t.nodes[nid], "lock_ref", t.nodes[nid].lock_ref + 1))
        edit(lambda t, nid=nid: setattr(t.nodes[nid], "lock_ref", t.nodes[nid].lock_ref - 1))
        edit(lambda t, nid=nid: setattr(t.nodes[nid], "pages", t.nodes[nid].pages[:-1]))

        def bad_content(t, nid=nid):
            p = dict.__getitem__(t.nodes, nid).pages[0]
            t.content[p] = (-7,) + tuple(t.content[p][1:])
        edit(bad_content)
    for rid in reqs:
        for f, d in (("committed", 1), ("committed", -1), ("allocated", 1), ("allocated", -1),
                     ("protected", 1), ("protected", -2)):
            edit(lambda t, rid=rid, f=f, d=d: setattr(t.reqs[rid], f, getattr(t.reqs[rid], f) + d))
        for f in ("committed_freed", "overallocated_freed", "locked", "rejected", "streaming"):
            edit(lambda t, rid=rid, f=f: setattr(t.reqs[rid], f, not getattr(t.reqs[rid], f)))
        edit(lambda t, rid=rid: setattr(t.reqs[rid], "phase", "queued"))
        edit(lambda t, rid=rid: setattr(t.reqs[rid], "phase", "decode"))
        edit(lambda t, rid=rid: setattr(t.reqs[rid], "row", None))
        edit(lambda t, rid=rid: setattr(t.reqs[rid], "last_node", None))
        edit(lambda t, rid=rid: setattr(t.reqs[rid], "session", 9))
        edit(lambda t, rid=rid: t.reqs[rid].output.append(5))
        row = dict.__getitem__(s.reqs, rid).row
        if row is not None:
            def swap_page(t, row=row):
                r = t.rows[row]
                if not r or r[0] is None:
                    return False
                r[0] = t.free_pages[0] if t.free_pages else r[0] + 1
            edit(swap_page)
            edit(lambda t, row=row: t.free_rows.append(row))
    for sid in slots:
        for f, d in (("committed", 1), ("allocated", 1), ("allocated", -1), ("protected", 2)):
            edit(lambda t, sid=sid, f=f, d=d: setattr(t.slots[sid], f, getattr(t.slots[sid], f) + d))
        edit(lambda t, sid=sid: setattr(t.slots[sid], "row", None))
        edit(lambda t, sid=sid: setattr(t.slots[sid], "last_node", None))
        edit(lambda t, sid=sid: t.slots.pop(sid))
    if s.cfg.swa_window:
        m = s.full_to_swa_index_mapping
        if m:
            edit(lambda t: t.full_to_swa_index_mapping.popitem())                # I40 leak
            edit(lambda t: t.swa_free_pages.append(next(iter(t.full_to_swa_index_mapping.values()))))
            edit(lambda t: t.free_pages.append(next(iter(t.full_to_swa_index_mapping))))
        if s.swa_free_pages:
            edit(lambda t: t.swa_free_pages.pop())
        for rid in reqs:
            edit(lambda t, rid=rid: setattr(t.reqs[rid], "swa_evicted_seqlen",
                                            t.reqs[rid].swa_evicted_seqlen + 2))
        for sid in slots:
            edit(lambda t, sid=sid: setattr(t.slots[sid], "swa_evicted_seqlen",
                                            t.slots[sid].swa_evicted_seqlen + 2))
    if s.cfg.mamba_slots:
        if s.mamba_free_slots:
            edit(lambda t: t.mamba_free_slots.pop())                             # I44 leak
            edit(lambda t: t.mamba_free_slots.append(t.mamba_free_slots[0]))
        for rid in reqs:
            edit(lambda t, rid=rid: setattr(t.reqs[rid], "mamba_pool_idx", None))
            edit(lambda t, rid=rid: setattr(t.reqs[rid], "mamba_pool_idx", -1))
            edit(lambda t, rid=rid: setattr(t.reqs[rid], "mamba_ping_pong_track_buffer", None))
        for sid in slots:
            edit(lambda t, sid=sid: setattr(t.slots[sid], "mamba_pool_idx", None))
            edit(lambda t, sid=sid: setattr(t.slots[sid], "mamba_pool_idx", 1))
    for sid in sorted(dict(s.sessions)):
        edit(lambda t, sid=sid: setattr(t.sessions[sid], "inflight_rid",
                                        None if t.sessions[sid].inflight_rid else 77))
        if s.sessions[sid].checkpoint:                                       # I26 on the slot
            edit(lambda t, sid=sid: setattr(t.sessions[sid], "checkpoint",
                                            (-3,) + t.sessions[sid].checkpoint[1:]))
        edit(lambda t, sid=sid: t.sessions.pop(sid))
    return out


def _verdicts(s):
    """(fast, reference) for one state; a state the reference cannot even view (a dangling
    anchor) counts as not clean on its side."""
    try:
        ref = reference_clean(s)
    except Exception:
        ref = False
    return F.state_clean(s), ref


@pytest.mark.parametrize("scope,depth", [(CHECK_OVERLAP, 4), (E.HYBRID_SCOPE, 5),
                                         (E.HYBRID_BORROW_SCOPE, 5)],
                         ids=lambda x: getattr(x, "name", x))
def test_same_verdict_on_corrupted_states(scope, depth):
    states = states_of(scope, depth + 2 if FULL else depth)
    broken = disagree = 0
    for s in states[::4]:
        for t in _corruptions(s):
            fast, ref = _verdicts(t)
            broken += not ref
            if fast != ref:
                disagree += 1
                assert fast == ref, (check_state(abstract(t), t.cfg), E.state_key(t))
    assert broken > 300, broken
    assert disagree == 0


def test_a_slot_whose_kv_is_not_its_sessions_tokens_breaks_i26():
    """I26 on a slot: positions [0, kv_committed_len) of its row hold the KV of the tokens
    the session's next turn builds on (the checkpoint); both evaluations say so."""
    found = 0
    for s in states_of(CHECK_OVERLAP, 6):
        sids = [sid for sid, t in dict(s.slots).items() if t.committed > 0]
        if not sids:
            continue
        t = s.clone()
        sid = sids[0]
        t.sessions[sid].checkpoint = (-3,) + t.sessions[sid].checkpoint[1:]
        vs = [v for v in check_state(abstract(t), t.cfg) if v.id == "I26"]
        assert [v.owner for v in vs] == [f"slot of session {sid}"], vs
        assert "row position 0 holds KV of token" in vs[0].message and vs[0].page is not None
        assert not F.state_clean(t)
        found += 1
    assert found > 20, found
