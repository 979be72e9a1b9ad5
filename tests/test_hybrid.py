"""Hybrid models (spec/swa_pool.py, spec/swa_tree.py, spec/mamba_pool.py, impl/swa.py,
impl/mamba.py): the SWA pool and window, the Mamba pool, their invariants I40-I45, and spec
vs impl on drawn hybrid configs."""
from __future__ import annotations

from dataclasses import replace

import pytest

from kvcheck.spec import mamba_pool, swa_pool, swa_tree
from kvcheck.spec import ops as O
from kvcheck.spec.config import Config, ConfigError
from kvcheck.spec.invariants import check_state
from kvcheck.spec.model import initial_state, step
from kvcheck.spec.view import abstract

SWA_P1 = Config(page_size=1, num_pages=40, num_rows=3, swa_window=3)
HYB = Config(page_size=2, num_pages=30, num_rows=3, swa_window=2, swa_num_pages=24,
             mamba_slots=7, mamba_extra_buffer="eager")


def run(cfg, ops):
    s = initial_state(cfg)
    for op in ops:
        s, _ = step(s, op)
    return s


def turn1(rid=1, new=(1, 2, 3, 4, 5, 6), max_new=10, decodes=5):
    return [O.OpenSession(1), O.SubmitTurn(1, rid, tuple(new), max_new), O.Schedule(rid)] + \
        [O.Decode(rid, 2)] * decodes


def base_ops():
    """Turn 1 decodes past the window and parks in its slot; a plain request runs; turn 2
    borrows the slot's row."""
    return turn1() + [O.Finish(1), O.SubmitRequest(2, (1, 2, 3, 4, 5, 6, 7), 9), O.Schedule(2)] + \
        [O.Decode(2, 3)] * 6 + [O.SubmitTurn(1, 3, (9, 9), 6), O.Schedule(3)] + [O.Decode(3, 1)] * 3


BASE = abstract(run(HYB, base_ops()))


# -- the window --------------------------------------------------------------------------

def test_window_frees_the_swa_kv_behind_it_from_the_second_decode_batch():
    """The prompt is the tree's (cache_protected_len 6); each decode batch after the first
    frees the SWA KV of [cursor, pre_len - window), pre_len = seqlen - 1, full KV stays."""
    s = run(SWA_P1, turn1(decodes=1))
    assert s.reqs[1].swa_evicted_seqlen == 0            # first decode batch: no eviction
    for _ in range(6):
        pre_len = s.reqs[1].seqlen - 1
        s, _ = step(s, O.Decode(1, 2))
        r = s.reqs[1]
        assert r.swa_evicted_seqlen == max(6, pre_len - 3)
        row = s.rows[r.row]
        mapped = [row[k] in s.full_to_swa_index_mapping for k in range(r.committed)]
        assert mapped == [True] * 6 + [False] * (r.swa_evicted_seqlen - 6) + \
            [True] * (r.committed - r.swa_evicted_seqlen)
        assert len(s.swa_free_pages) == 40 - r.committed + r.swa_evicted_seqlen - 6
        assert len(s.free_pages) == 40 - r.committed    # the full side keeps every page
    assert r.swa_evicted_seqlen > 6


@pytest.mark.parametrize("evicted, pre_len, window, p, want", [
    (0, 7, 3, 1, 4), (4, 5, 3, 1, 4), (0, 13, 1, 4, 8), (0, 13, 6, 4, 4), (0, 9, 3, 4, 4),
    (8, 9, 3, 4, 8), (2, 6, 5, 4, 0)])
def test_swa_evict_target(evicted, pre_len, window, p, want):
    """`max(cursor, pre_len - max(window, P))`, page-floored (common.py); a result not above
    the cursor frees nothing."""
    assert swa_pool.swa_evict_target(evicted, pre_len, window, p) == want


def test_swa_eviction_interval_skips_non_maintenance_steps():
    every = run(SWA_P1, turn1(max_new=12, decodes=6))
    cfg = replace(SWA_P1, swa_eviction_interval=4)
    s = run(cfg, turn1(max_new=12, decodes=4))  # forward_iter 0..3: the 2nd..4th are not multiples
    assert s.reqs[1].swa_evicted_seqlen == 0
    s = run(cfg, turn1(max_new=12, decodes=6))  # the 5th batch (forward_iter 4) evicts
    assert 6 < s.reqs[1].swa_evicted_seqlen < every.reqs[1].swa_evicted_seqlen


def test_match_stops_where_the_window_has_no_swa_kv_behind_it():
    s = initial_state(replace(SWA_P1, swa_window=2))
    pages = [1, 2, 3, 4, 5, 6]
    s.full_to_swa_index_mapping = {1: 1, 2: 2, 4: 4, 5: 5, 6: 6}     # page 3 a tombstone
    assert swa_tree.swa_match_len(s, pages) == 6       # 3 SWA pages after it >= window 2
    assert swa_tree.swa_match_len(s, pages[:4]) == 2   # 1 < window after it: stop before it
    s.full_to_swa_index_mapping = {1: 1, 3: 3, 4: 4}   # tombstones 2 and 5: exactly 2 between
    assert swa_tree.swa_match_len(s, pages[:5]) == 4
    s.full_to_swa_index_mapping = {}
    assert swa_tree.swa_match_len(s, pages) == 0


TOMBSTONE_CFG = Config(page_size=1, num_pages=40, num_rows=3, swa_window=2)
TOMBSTONE_DECODED = [O.SubmitRequest(1, (1, 2, 3, 4, 5, 6, 7, 8), 10), O.Schedule(1)] + \
    [O.Decode(1, 2)] * 6
# 8 + 3 tombstoned + 1 with SWA KV < window 2 after them: usable up to the tombstones
TOMBSTONE_SHORT = [O.SubmitRequest(2, (1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 2, 2, 9), 2), O.Schedule(2)]
# 3 with SWA KV after them >= window: the whole match is usable
TOMBSTONE_LONG = [O.SubmitRequest(3, (1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 2, 2, 2, 2, 9), 2), O.Schedule(3)]


def test_a_plain_request_matches_only_the_usable_prefix_of_a_tombstoned_path():
    cfg = TOMBSTONE_CFG
    s = run(cfg, TOMBSTONE_DECODED)
    assert s.reqs[1].swa_evicted_seqlen == 11           # output positions 8..10 SWA-freed
    s, _ = step(s, O.Finish(1))                         # inserted, tombstones included
    s = run_from(s, TOMBSTONE_SHORT)
    assert s.reqs[2].prefix_len == 8
    s = run_from(s, TOMBSTONE_LONG)
    assert s.reqs[3].prefix_len == 14
    assert check_state(abstract(s), cfg) == []


def test_impl_matches_a_tombstoned_path_as_the_spec_does():
    """The sequence above in lockstep on impl/: `SWARadixCache.match_prefix`'s re-match and
    `_swa_usable_len`'s tombstone arcs, which no generated sequence reaches
    (docs/coverage.md, impl/swa_radix_cache.py `_swa_usable_len`)."""
    from kvcheck.adapters.impl import ImplBackend
    from kvcheck.checker import run_ops
    # a tight SWA pool: request 2's re-matched extend (5 tokens, not 1) must evict, so a
    # match that kept the tombstones would show in the state (full pages on the wide pool
    # end the same either way: the prefill result frees its duplicates of the tree's pages)
    cfg = replace(TOMBSTONE_CFG, swa_num_pages=14)
    ops = TOMBSTONE_DECODED + [O.Finish(1)] + TOMBSTONE_SHORT + TOMBSTONE_LONG
    res = run_ops(cfg, ops, ImplBackend(cfg))
    assert res.ok, res.failure.render()


def test_impl_evicts_past_a_tombstoned_leaf_until_the_swa_pool_has_the_tokens():
    """`evict_from_tree_cache`'s SWA loop (impl/common.py:35->37, which no generated
    sequence reaches: docs/coverage.md): evict(13) takes the least recent leaves, request
    1's path (14 tokens, 3 of them tombstones: 11 SWA), which leaves the SWA pool at 12 of
    13, so it evicts request 2's leaf too. Spec and impl in lockstep."""
    from kvcheck.adapters.impl import ImplBackend
    from kvcheck.checker import run_ops
    cfg = replace(TOMBSTONE_CFG, swa_num_pages=20)
    ops = TOMBSTONE_DECODED + [O.Finish(1), O.SubmitRequest(2, tuple(range(20, 28)), 1),
                               O.Schedule(2), O.SubmitRequest(3, tuple(range(40, 53)), 2)]
    s = run(cfg, ops)
    assert (len(s.swa_free_pages), s.evictable_size, swa_tree.swa_evictable_size(s)) == (1, 22, 19)
    s, out = step(s, O.Schedule(3))
    assert out == "ok" and s.evictable_size == 0        # both leaves went
    res = run_ops(cfg, ops + [O.Schedule(3)], ImplBackend(cfg))
    assert res.ok, res.failure.render()


def run_from(s, ops):
    for op in ops:
        s, _ = step(s, op)
    return s


def test_admission_counts_only_the_swa_kv_the_tree_can_give_back():
    """Tombstone pages give no SWA KV back: the SWA budget is the free SWA pool plus the SWA
    pages of unlocked nodes; eviction runs until the SWA pool has the tokens too."""
    from kvcheck.adapters.impl import ImplBackend
    from kvcheck.checker import run_ops
    cfg = Config(page_size=1, num_pages=30, num_rows=3, swa_window=1, swa_num_pages=14)
    ops = [O.SubmitRequest(1, (1, 2, 3, 4, 5, 6, 7, 8), 10), O.Schedule(1)] + \
        [O.Decode(1, 2)] * 6 + [O.Finish(1)]
    s = run(cfg, ops)
    assert (len(s.swa_free_pages), s.evictable_size, swa_tree.swa_evictable_size(s)) == (4, 14, 10)
    assert swa_tree.swa_admission_short(s, 15) and not swa_tree.swa_admission_short(s, 14)
    s = run_from(s, [O.SubmitRequest(2, (9,) * 14, 2)])
    assert step(s, O.Schedule(2))[1] == "ok"
    big = run(cfg, ops + [O.SubmitRequest(3, (9,) * 15, 2)])
    assert step(big, O.Schedule(3))[1] == "rejected"    # 15 > 4 free + 10 evictable SWA
    for tail in ([O.SubmitRequest(2, (9,) * 14, 2), O.Schedule(2), O.Decode(2, 1)],
                 [O.SubmitRequest(3, (9,) * 15, 2), O.Schedule(3)]):
        res = run_ops(cfg, ops + tail, ImplBackend(cfg))
        assert res.ok, res.failure.render()


def test_swa_pool_shortage_refuses_admission():
    cfg = Config(page_size=1, num_pages=40, num_rows=3, swa_window=2, swa_num_pages=4)
    s = run(cfg, [O.SubmitRequest(1, (1, 2, 3, 4, 5, 6), 2)])
    s, out = step(s, O.Schedule(1))
    assert out == "rejected" and len(s.free_pages) == 40


@pytest.mark.parametrize("i", [0, 1, 2])
def test_window_lemmas_are_proved_and_their_controls_refuted(i):
    from kvcheck.proofs.lemmas import LEMMAS, run_lemma
    window = [lem for lem in LEMMAS if lem.name.startswith("SWA window")]
    assert len(window) == 3
    results = run_lemma(window[i])
    assert all(r.ok for r in results), [(r.name, r.status, r.detail) for r in results]
    assert [r.status for r in results] == ["proved"] + ["refuted"] * (len(results) - 1)


def test_the_window_lemma_is_about_the_real_function():
    """The z3 term evaluates to what kvcheck.spec.swa_pool.swa_evict_target returns."""
    import z3
    from kvcheck.proofs.hybrid_lemmas import HYB
    from kvcheck.proofs.lemmas import S
    e, pre, w, p = z3.Ints("e pre w p")
    term = S(HYB, "swa_evict_target", e, pre, w, p)
    for args in [(0, 7, 3, 1), (0, 13, 1, 4), (3, 9, 2, 2), (8, 9, 3, 4), (2, 6, 5, 4)]:
        sub = list(zip((e, pre, w, p), map(z3.IntVal, args)))
        assert z3.simplify(z3.substitute(term, *sub)).as_long() == swa_pool.swa_evict_target(*args)
    for args in [(0, 13, 5, 4), (0, 9, 3, 2), (4, 9, 3, 2), (0, 7, 3, 1)]:
        term = S(HYB, "swa_evict_target_borrow", e, pre, w, args[3])
        sub = list(zip((e, pre, w), map(z3.IntVal, args[:3])))
        want = swa_pool.swa_evict_target_borrow(*args)
        assert z3.simplify(z3.substitute(term, *sub)).as_long() == want


# -- Mamba --------------------------------------------------------------------------------

def test_mamba_state_goes_request_to_slot_to_request_and_back_on_close():
    cfg = Config(page_size=1, num_pages=40, num_rows=3, mamba_slots=3, mamba_extra_buffer="eager",
                 overlap=True)
    s = run(cfg, turn1(decodes=1))
    assert mamba_pool.mamba_refs(s.reqs[1]) == (1, 2, 3) and s.mamba_free_slots == []
    s, _ = step(s, O.Finish(1))
    assert mamba_pool.mamba_refs(s.slots[1]) == (1, 2, 3)
    s, _ = step(s, O.SubmitTurn(1, 2, (7,), 2))
    s, _ = step(s, O.Schedule(2))               # restored: no new slot taken
    assert mamba_pool.mamba_refs(s.reqs[2]) == (1, 2, 3) and s.mamba_free_slots == []
    s, _ = step(s, O.AbortRunning(2))           # nth mid-abort: release_session frees them
    assert sorted(s.mamba_free_slots) == [1, 2, 3] and not s.slots


def test_first_turn_mid_abort_returns_mamba_through_the_ephemeral_slot():
    cfg = Config(page_size=1, num_pages=40, num_rows=3, mamba_slots=2, mamba_extra_buffer="lazy",
                 overlap=True)
    s = run(cfg, turn1(decodes=1))
    assert mamba_pool.mamba_refs(s.reqs[1]) == (1, 2, mamba_pool.EMPTY_TRACK)
    s, _ = step(s, O.AbortRunning(1))
    assert sorted(s.mamba_free_slots) == [1, 2]         # the -1 sentinel is not freed


def test_mamba_pool_shortage_refuses_admission():
    cfg = Config(page_size=1, num_pages=40, num_rows=3, mamba_slots=1)
    s = run(cfg, [O.SubmitRequest(1, (1, 2, 3), 3), O.Schedule(1), O.SubmitRequest(2, (4, 5), 3)])
    s, out = step(s, O.Schedule(2))
    assert out == "rejected" and s.reqs[2].row is None
    s, _ = step(s, O.Finish(1))                         # free_mamba_cache: slot back
    s, out = step(s, O.Schedule(2))
    assert out == "ok" and s.reqs[2].mamba_pool_idx == 1


# -- the borrow era (0.5.23) ----------------------------------------------------------------

SWA_B = replace(SWA_P1, era="borrow")


@pytest.mark.parametrize("cursor, pre_len, window, interval, due", [
    (0, 7, 3, 1, True), (0, 3, 3, 1, False), (4, 7, 3, 1, False), (4, 8, 3, 1, True),
    (0, 7, 3, 4, True), (0, 6, 3, 4, False)])
def test_borrow_eviction_is_due_by_distance(cursor, pre_len, window, interval, due):
    """0.5.23 `_swa_eviction_trigger`: `pre_len - window >= cursor + interval`."""
    assert swa_pool.swa_evict_due(cursor, pre_len, window, interval) is due


@pytest.mark.parametrize("evicted, pre_len, window, p, want", [
    (0, 13, 6, 4, 4), (0, 9, 3, 4, 4), (0, 13, 5, 4, 4), (0, 14, 5, 4, 4), (0, 16, 5, 4, 8),
    (0, 7, 3, 1, 4), (8, 9, 3, 4, 8)])
def test_borrow_evict_target_keeps_ceil_aligned_window(evicted, pre_len, window, p, want):
    """0.5.23 keeps `ceil_align(max(window, P), P)` (0.5.15: `max(window, P)`; they differ
    when the window is not a multiple of P: (0, 13, 5, 4) is 8 on 0.5.15)."""
    assert swa_pool.swa_evict_target_borrow(evicted, pre_len, window, p) == want
    assert swa_pool.swa_evict_target(0, 13, 5, 4) == 8


@pytest.mark.parametrize("protected, floor, p, want", [(0, 0, 1, 0), (8, 0, 4, 8), (8, 9, 4, 12), (4, 2, 4, 4)])
def test_swa_dead_lo(protected, floor, p, want):
    assert swa_pool.swa_dead_lo(protected, floor, p) == want


def test_borrow_window_waits_for_interval_tokens_not_steps():
    """The interval counts tokens slid past the cursor (window 3, interval 4, prompt 6
    in the tree): the prompt's checkpoint (interval 1, pre_len 5) left the cursor at 2;
    the first due batch (pre_len - 3 reaches 2 + 4) only raises it to swa_dead_lo = 6;
    it then moves 4 tokens at a time, when pre_len - 3 reaches cursor + 4."""
    cfg = replace(SWA_B, swa_eviction_interval=4)
    s = run(cfg, turn1(max_new=14, decodes=1))
    got = []
    for _ in range(11):
        pre_len = s.reqs[1].seqlen - 1
        s, _ = step(s, O.Decode(1, 2))
        got.append((pre_len, s.reqs[1].swa_evicted_seqlen))
    assert got == [(7, 2), (8, 2), (9, 6), (10, 6), (11, 6), (12, 6), (13, 10), (14, 10),
                   (15, 10), (16, 10), (17, 14)]


def test_borrow_release_frees_the_window_freed_range_full_side_only():
    """`free_kv_row_segments`: `[swa_dead_lo, cursor)` of a row goes back full-side only,
    so closing the session returns every page of both pools exactly once (I40)."""
    ops = turn1(max_new=12, decodes=8) + [O.Finish(1), O.CloseSession(1)]
    s = run(SWA_B, ops[:-1])
    slot = s.slots[1]
    assert slot.swa_evicted_seqlen > slot.protected
    dead = swa_pool.swa_dead_pages(s, slot, slot.protected, slot.allocated)
    assert dead and all(s.rows[slot.row][k] not in s.full_to_swa_index_mapping for k in dead)
    s = run(SWA_B, ops)
    a = abstract(s)
    assert check_state(a, SWA_B) == []
    assert len(s.swa_free_pages) + len(s.full_to_swa_index_mapping) == 40


def test_borrow_slot_and_turn_share_the_cursor():
    """0.5.23: a turn runs on its slot's record, so the slot's cursor is the turn's."""
    s = run(SWA_B, turn1(max_new=12, decodes=8))
    assert s.reqs[1].swa_evicted_seqlen > 0
    assert s.slots[1].swa_evicted_seqlen == s.reqs[1].swa_evicted_seqlen


# -- 0.5.23 prefill-aware SWA ------------------------------------------------------------------

PFSWA = Config(page_size=4, num_pages=24, num_rows=2, era="borrow", swa_window=1,
               prefill_aware_swa=True)


def pfswa_turn1():
    """A 5-token prompt (floor 5, swa_dead_lo 8 above the protected 4), 13 decodes."""
    return turn1(new=(1, 2, 3, 4, 5), max_new=14, decodes=13)


def test_prefill_sets_the_floor_and_the_window_stops_below_it():
    """`get_new_batch_prefill`: `swa_evict_floor = extend_end`; the slot shares it; the
    first due eviction starts at ceil_align(floor) = 8, not at cache_protected_len 4."""
    s = run(PFSWA, turn1(new=(1, 2, 3, 4, 5), max_new=14, decodes=2))
    r, t = s.reqs[1], s.slots[1]
    assert (r.swa_evict_floor, t.swa_evict_floor, r.protected) == (5, 5, 4)
    assert r.swa_evicted_seqlen == 8 > r.committed      # raised to swa_dead_lo (I42 allows it)
    assert check_state(abstract(s), PFSWA) == []
    off = run(replace(PFSWA, prefill_aware_swa=False), turn1(new=(1, 2, 3, 4, 5), max_new=14, decodes=2))
    assert off.reqs[1].swa_evict_floor == 0 and off.reqs[1].swa_evicted_seqlen == 4


def test_a_later_turns_floor_above_the_freed_range_keeps_the_pools_conserved():
    """Turn 2's prefill raises the floor (21, dead_lo 24) above [8, 12), which turn 1's
    window freed: I43 counts the mapped row-pages, and the close returns every page once."""
    ops = pfswa_turn1() + [O.SubmitTurn(1, 2, (6, 7), 3), O.Schedule(2)]
    s = run(PFSWA, ops)
    assert (s.slots[1].swa_evict_floor, s.slots[1].swa_evicted_seqlen) == (21, 12)
    assert check_state(abstract(s), PFSWA) == []
    s = run(PFSWA, ops + [O.Decode(2, 3), O.Decode(2, 3), O.CloseSession(1)])
    assert check_state(abstract(s), PFSWA) == []
    assert len(s.swa_free_pages) + len(s.full_to_swa_index_mapping) == 24     # the rest in the tree


def test_i42_still_fires_for_a_cursor_past_committed_off_swa_dead_lo():
    s = abstract(run(PFSWA, turn1(new=(1, 2, 3, 4, 5), max_new=14, decodes=2)))
    bad = with_req(s, 1, swa_evicted_seqlen=12)
    assert "I42" in {v.id for v in check_state(bad, PFSWA)}


def test_prefill_aware_swa_needs_borrow_era_swa_and_is_omitted_at_its_default():
    for kw in (dict(era="borrow"), dict(swa_window=2)):
        with pytest.raises(ConfigError, match=r"config\.prefill_aware_swa"):
            Config(prefill_aware_swa=True, **kw)
    assert "prefill_aware_swa" not in replace(PFSWA, prefill_aware_swa=False).to_json()
    assert Config.from_json(PFSWA.to_json()) == PFSWA


def test_mamba_ping_pong_empty_names_the_sentinel_entries():
    from types import SimpleNamespace
    r = SimpleNamespace(mamba_ping_pong_track_buffer=None)
    assert mamba_pool.mamba_ping_pong_empty(r) is None
    r.mamba_ping_pong_track_buffer = (3, mamba_pool.EMPTY_TRACK)
    assert mamba_pool.mamba_ping_pong_empty(r) == [False, True]


def test_spec_and_impl_agree_on_drawn_borrow_era_hybrid_configs():
    from kvcheck.adapters.impl import ImplBackend
    from kvcheck.engines.stats import Stats
    from kvcheck.engines.walk import walk
    swa = 0
    for i in range(12):         # 48 steps each (a few seconds); the campaigns run more
        seq = walk(11, i, ImplBackend, "impl", Stats(), config_kw={"hybrid": True, "era": "borrow"},
                   length=48)
        assert seq.cfg.era == "borrow" and seq.cfg.hybrid
        assert seq.failure is None, seq.failure.render()
        swa += bool(seq.cfg.swa_window)
    assert swa >= 4


# -- configuration --------------------------------------------------------------------

def test_hybrid_off_leaves_traces_and_state_as_they_were():
    assert not {"swa_window", "mamba_slots", "swa_num_pages", "mamba_extra_buffer",
                "swa_eviction_interval"} & set(Config().to_json())
    s = initial_state(Config())
    assert s.swa_free_pages == [] and s.mamba_free_slots == [] and s.full_to_swa_index_mapping == {}
    a = abstract(s)
    assert (a.swa_num_pages, a.mamba_slots, a.swa_map, a.mamba_free) == (0, 0, (), ())
    assert Config.from_json(HYB.to_json()) == HYB


@pytest.mark.parametrize("kw, field", [
    (dict(swa_num_pages=4), "config.swa_num_pages"),
    (dict(mamba_extra_buffer="lazy"), "config.mamba_extra_buffer"),
    (dict(swa_window=-1), "config.swa_window"),
    (dict(mamba_slots=2, mamba_extra_buffer="twice"), "config.mamba_extra_buffer"),
    (dict(mamba_slots=2, mamba_extra_buffer="lazy", spec_enabled=True), "config.mamba_extra_buffer"),
])
def test_bad_hybrid_configs_are_refused_naming_the_field(kw, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        Config(**kw)


# -- invariants -----------------------------------------------------------------------------

def _req(s, rid):
    return next(r for r in s.reqs if r.rid == rid)


def with_req(s, rid, **kw):
    return replace(s, reqs=tuple(replace(r, **kw) if r.rid == rid else r for r in s.reqs))


def hybrid_corruptions():
    """id -> a corrupted copy of BASE that breaks it."""
    held = _req(BASE, 3).mamba[0]
    mapped_swa = BASE.swa_map[0][1]
    r2 = _req(BASE, 2)
    return {
        "I40": replace(BASE, swa_free_pages=BASE.swa_free_pages[1:]),
        "I41": replace(BASE, swa_free_pages=tuple(sorted(BASE.swa_free_pages + (mapped_swa,)))),
        "I42": with_req(BASE, 3, swa_evicted_seqlen=_req(BASE, 3).committed + 1),
        "I43": with_req(BASE, 2, swa_evicted_seqlen=r2.protected),
        "I44": replace(BASE, mamba_free=tuple(sorted(BASE.mamba_free + (held,)))),
        "I45": replace(BASE, mamba_free=BASE.mamba_free[1:]),
    }


def test_base_state_is_clean_and_exercises_both_pools():
    assert check_state(BASE, HYB) == []
    assert BASE.slots and BASE.slots[0].mamba and _req(BASE, 2).swa_evicted_seqlen > _req(BASE, 2).protected
    assert any(r.swa_evicted_seqlen for r in BASE.reqs)


@pytest.mark.parametrize("inv_id", sorted(hybrid_corruptions()))
def test_each_hybrid_invariant_fires(inv_id, assert_invariant_fires):
    assert_invariant_fires(hybrid_corruptions()[inv_id], HYB, inv_id)


def test_hybrid_invariants_are_silent_when_hybrid_is_off():
    a = abstract(run(Config(page_size=2, num_pages=30, num_rows=3), base_ops()))
    assert check_state(a, Config()) == []


# -- spec vs impl ----------------------------------------------------------------------------

def test_spec_and_impl_agree_on_drawn_hybrid_configs():
    from kvcheck.adapters.impl import ImplBackend
    from kvcheck.engines.stats import Stats
    from kvcheck.engines.walk import walk
    stats, hybrid = Stats(), 0
    for i in range(40):
        seq = walk(11, i, ImplBackend, "impl", stats, config_kw={"hybrid": True})
        assert seq.failure is None, seq.failure.render()
        hybrid += seq.cfg.hybrid
    assert hybrid >= 20


def test_a_row_holder_without_a_mamba_state_is_reported():
    a = with_req(BASE, 2, mamba=())
    hit = [v for v in check_state(a, HYB) if v.id == "I44"]
    assert any("holds a row but no Mamba state" in v.message and v.owner == "req 2" for v in hit)


def test_wire_roundtrip_keeps_hybrid_fields():
    """The sglang proxy's JSON pipe carries the hybrid fields (a dropped one reads as a
    divergence on every step)."""
    import json
    from kvcheck.adapters.sglang.wire import state_from_json, state_to_json
    assert state_from_json(json.loads(json.dumps(state_to_json(BASE)))) == BASE


def test_sglang_adapter_refuses_what_it_does_not_drive():
    from kvcheck.adapters.sglang.hybrid import refusal
    assert refusal(SWA_P1, "borrow") is None        # 0.5.23: adapters/sglang/swa_unified.py
    assert "config.prefill_aware_swa" in refusal(replace(SWA_P1, era="borrow", prefill_aware_swa=True),
                                                 "borrow")
    assert "config.swa_window" in refusal(replace(SWA_P1, mamba_slots=2), "borrow")
    assert refusal(SWA_P1, "flat") is None          # 0.5.15: adapters/sglang/swa_tree.py
    assert "config.mamba_slots" in refusal(Config(mamba_slots=2), "borrow")
    assert refusal(Config(mamba_slots=2), "flat") is None and refusal(Config(), "borrow") is None


SWA_B4 = Config(page_size=2, num_pages=24, num_rows=4, swa_window=4, era="borrow")


def _tree(s):
    """(path length, key length, tombstoned) of every node, by path length."""
    return sorted((len(n.path), len(n.key), swa_tree.swa_tombstoned(s, n))
                  for n in s.nodes.values() if n.id != 0)


def test_borrow_checkpoint_frees_out_of_window_swa_and_keeps_a_tombstone_node():
    """0.5.23 `checkpoint_into_tree` of a 12-token prompt (window 4, P = 2), as
    tests/test_sglang_swa_unified.py reads it on the release: the out-of-window free runs
    before the insert (cursor 6 = floor(11 - 4)), and the fresh leaf is split at the
    cursor, `[0, 6)` staying an SWA tombstone node (`_clip_to_window`)."""
    s = run(SWA_B4, [O.SubmitRequest(1, tuple(range(1, 13)), 4), O.Schedule(1)])
    assert s.reqs[1].swa_evicted_seqlen == 6 and s.reqs[1].protected == 12
    assert [(p, t) for p, _, t in _tree(s)][0] == (6, True)
    assert all(not t for p, _, t in _tree(s) if p > 6)


def test_borrow_checkpoint_caps_the_live_leaf_at_one_window():
    """0.5.23 `_maybe_split_leaf_for_swa_lock`: the live leaf `[6, 12)` is longer than
    one page-aligned window (4), so it is split at 8: the release's tree (the probe's
    first step) is `[0, 6)` tombstone, `[6, 8)`, `[8, 12)`; the lock boundary is the leaf."""
    s = run(SWA_B4, [O.SubmitRequest(1, tuple(range(1, 13)), 4), O.Schedule(1)])
    assert [(p, k) for p, k, _ in _tree(s)] == [(6, 6), (8, 2), (12, 4)]
    assert s.reqs[1].swa_uuid_for_lock == s.reqs[1].last_node
    assert swa_tree.swa_lock_split(6, 4, 2) == 2 and swa_tree.swa_lock_split(4, 4, 2) is None
    assert swa_tree.swa_lock_split(6, 3, 2) == 2 and swa_tree.swa_lock_split(5, 3, 1) == 2
