"""The spec walks DOMAIN.md's examples with their exact numbers."""
from __future__ import annotations

import pytest

from kvcheck.spec import ops as O
from kvcheck.spec.config import Config
from kvcheck.spec.invariants import check_state, check_step
from kvcheck.spec.allocator import available_size
from kvcheck.spec.model import initial_state, step
from kvcheck.spec.sessions import _free_tail
from kvcheck.spec.state import Req, Slot
from kvcheck.spec.view import abstract
from kvcheck.stateful_tests import scenarios as S


def walk(sc, upto=None):
    """Run a scenario on the spec with every invariant after every step; yields states."""
    s = initial_state(sc.config)
    prev = abstract(s)
    states = [s]
    for op in sc.ops[:upto]:
        s, out = step(s, op)
        b = abstract(s)
        vs = check_state(b, sc.config) + check_step(prev, op, out, b, sc.config)
        assert not vs, f"{op}: {[str(v) for v in vs]}"
        prev = b
        states.append(s)
    return states


def free_set(s):
    return set(s.free_pages)


def test_worked_example_5_4():
    st = walk(S.WORKED_EXAMPLE)
    P = 4
    s = st[3]                                     # after turn 1's prefill
    r = s.reqs[1]
    assert (r.committed, r.allocated, r.protected) == (10, 10, 8)
    assert s.protected_size == 8 and s.evictable_size == 0
    A, B, C = s.rows[r.row][:3]
    assert len(s.free_pages) == 12 - 3
    s = st[5]                                     # turn 1 finished (output 5 = max) under overlap
    slot = s.slots[1]
    assert (slot.committed, slot.allocated, slot.protected) == (15, 15, 8)
    assert slot.last_node is not None and slot.last_node[0] == "node"
    D = s.rows[slot.row][3]
    # idle accounting: session_held = ceil_align(15) - 8 = 8 (pages C, D)
    assert available_size(s) == 48 - 16 and s.protected_size == 8
    s = st[7]                                     # turn 2 prefilled
    r = s.reqs[2]
    assert r.prefix_len == 15                     # min(15, 18 - 1)
    assert (r.committed, r.allocated) == (18, 18)
    row = s.rows[r.row]
    assert row[:4] == [A, B, C, D]                # position 15 continued in D
    E = row[4]
    assert E not in (A, B, C, D)
    assert len(s.free_pages) == 12 - 5
    s = st[8]                                     # spec step to allocated 24 (E, F), output 4 > 2:
    slot = s.slots[1]                             # finishes at target 20, F freed again
    assert (slot.committed, slot.allocated) == (20, 20)
    assert len(s.free_pages) == 12 - 5 and E not in free_set(s)
    F = s.rows[slot.row][5]
    assert F in free_set(s)
    s = st[9]                                     # close: C, D, E freed, A, B evictable
    assert {C, D, E} <= free_set(s) and not ({A, B} & free_set(s))
    assert s.evictable_size == 8 and s.protected_size == 0
    assert len(s.free_pages) == 12 - 2 and not s.slots and not s.sessions
    assert sorted(s.free_rows) == [0, 1]


def test_trim_overshoot_2_8():
    st = walk(S.TRIM_OVERSHOOT)
    before, after = st[-2], st[-1]
    r = before.reqs[1]
    assert (r.committed, r.allocated, len(r.output)) == (36, 38, 11)
    # the last step: allocated 44, committed 39, output 14 > 12 -> finish: lookahead 40,
    # target 26 + 12 = 38: frees positions 38..43, everything becomes 38
    slot = after.slots[1]
    assert (slot.committed, slot.allocated) == (38, 38)
    assert {after.rows[slot.row][i] for i in range(38, 44)} <= free_set(after)
    assert not {after.rows[slot.row][i] for i in range(38)} & free_set(after)
    assert len(after.free_pages) == 60 - 38
    assert after.sessions[1].checkpoint == r.origin + tuple(r.output) + (1,)  # output truncated to 12


def test_free_tail_page_aligned_2_8():
    """P = 4, committed 7, allocated 12, prefix 5: frees positions 8..11 only."""
    cfg = Config(page_size=4, num_pages=8, num_rows=2, max_context_len=16)
    s = initial_state(cfg)
    s.free_pages = [4, 5, 6, 7, 8]
    s.rows[0][:3] = [1, 2, 3]
    slot = Slot(row=0, committed=7, allocated=12, protected=0)
    req = Req(9, 1, True, False, tuple(range(7)), [], 4, row=0, committed=7, allocated=12)
    _free_tail(s, slot, req, 5)
    assert s.free_pages == [3, 4, 5, 6, 7, 8]           # row-page 2 (positions 8..11)
    assert (slot.committed, slot.allocated) == (5, 5) and (req.committed, req.allocated) == (5, 5)
    assert s.rows[0][1] == 2                             # positions 5..7 stay attached


def test_first_mid_abort_2_10():
    st = walk(S.FIRST_MID_ABORT)
    before, after = st[-2], st[-1]
    r = before.reqs[1]
    assert (r.allocated, r.protected) == (20, 0)
    assert free_set(after) - free_set(before) == set(before.rows[r.row][:20])
    assert len(after.free_pages) == 40 and sorted(after.free_rows) == [0, 1]
    assert not after.slots and after.sessions[1].inflight_rid is None


def test_nth_mid_abort_2_10():
    st = walk(S.NTH_MID_ABORT)
    before, after = st[-2], st[-1]
    r, slot = before.reqs[2], before.slots[1]
    assert slot.row == r.row and r.allocated > slot.allocated and r.allocated > r.committed
    freed = free_set(after) - free_set(before)
    assert freed == set(before.rows[r.row][slot.protected:r.allocated])   # one range
    assert not after.slots and r.row in after.free_rows
    assert after.sessions[1].checkpoint == before.sessions[1].checkpoint  # no finish_req
    assert after.evictable_size == slot.protected                          # lock dropped


def test_pre_abort_detach_2_9():
    st = walk(S.PRE_ABORT)
    before, after = st[-2], st[-1]
    assert after.slots[1] == before.slots[1]          # row, committed, allocated unchanged
    assert 2 not in after.reqs                         # the stub finished (aborted)
    assert after.sessions[1].inflight_rid is None      # abort_req cleared it
    assert after.sessions[1].checkpoint == before.sessions[1].checkpoint


def test_retract_retry_overlap_2_11():
    st = walk(S.RETRACT_OVERLAP)
    retracted, retried = st[-2], st[-1]
    slot = retracted.slots[1]
    r = retracted.reqs[1]
    assert r.seqlen == 13 and (slot.committed, slot.allocated) == (13, 13)   # committed == seqlen
    assert retracted.sessions[1].inflight_rid == 1       # FIX(H4): still in flight
    assert retracted.sessions[1].checkpoint == ()        # FIX(H4): checkpoint not advanced
    r2 = retried.reqs[1]
    assert r2.prefix_len == 12                           # min(13, 13 - 1)
    assert (retried.slots[1].committed, retried.slots[1].allocated) == (12, 12)
    assert (r2.committed, r2.allocated) == (13, 13)     # [12, 13) re-extended from the boundary
    assert retried.content[retried.rows[r2.row][3]][0] == r2.fill_ids[12]


def test_close_deferred_2_12():
    st = walk(S.CLOSE_DEFERRED)
    deferred = st[7]
    assert deferred.sessions[1].close_pending and 1 in deferred.slots
    done = st[-1]
    assert not done.sessions and not done.slots
    assert len(done.free_pages) * 2 + done.evictable_size == 32 and done.protected_size == 0


def test_shared_prefix_split_under_lock():
    st = walk(S.SHARED_PREFIX)
    s = st[6]            # req 2 matched [1..4] inside req 1's locked [1..8] node
    locks = sorted((len(n.key), n.lock_ref) for n in s.nodes.values() if n.id)
    assert (4, 2) in locks and (4, 1) in locks       # split parent copied lock_ref, then +1
    assert len(st[-1].free_pages) == 14 and not st[-1].nodes.keys() - {0}


def test_first_turn_finishing_at_prefill_keeps_the_match_lock_4_3():
    st = walk(S.FINISH_AT_PREFILL)
    s = st[6]                                     # session 1's first turn finished in its prefill
    slot = s.slots[1]
    path = s.nodes[slot.last_node[1]].key if slot.last_node[1] else ()
    assert (slot.protected, slot.committed, slot.allocated) == (4, 7, 7)
    assert 2 not in s.reqs and s.sessions[1].checkpoint == (1, 2, 3, 4, 9, 9, 9, 1)
    assert len(path) == 4 and s.nodes[slot.last_node[1]].lock_ref == 1   # the split node [1..4]
    s = st[9]                                     # session 2: root match, protected 0
    assert s.slots[2].last_node == ("node", 0) and s.slots[2].protected == 0
    assert (s.slots[2].committed, s.slots[2].allocated) == (3, 3)


@pytest.mark.parametrize("sc", S.SCENARIOS, ids=lambda sc: sc.name)
def test_scenarios_hold_every_invariant(sc):
    walk(sc)


def test_every_scenario_is_in_the_regression_corpus():
    """`kvcheck check` replays the corpus; each scenario must be there, unchanged."""
    from pathlib import Path
    from kvcheck.trace import load
    reg = Path(__file__).resolve().parents[1] / "stateful_tests" / "regressions"
    for sc in S.SCENARIOS:
        t = load(reg / f"{sc.name}.json")
        assert (t.config, tuple(t.ops), t.expect.result) == (sc.config, sc.ops, "pass"), sc.name
