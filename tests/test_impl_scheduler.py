"""impl/ Scheduler facade: DOMAIN.md 5.4 worked example with exact page ids, chunked
prefill, retract/retry, pre-abort, hazards H3/H4/H5 fixed, deferred close, eviction,
OOM, leak checks and concrete checks."""
import pytest
import torch

from kvcheck.impl import checks
from kvcheck.impl.device import resolve_device
from kvcheck.impl.scheduler import Scheduler

DEV = resolve_device()


def row_of(s, rid_or_slot, n):
    return s.req_to_token_pool.req_to_token[rid_or_slot, :n].tolist()


def accounting(s):
    return (s.token_to_kv_pool_allocator.available_size(), s.tree_cache.evictable_size(),
            s.tree_cache.protected_size(), s.tree_cache.session_held_tokens(s.active_pool_idxs()))


def test_worked_example_p4_two_turns_spec_overshoot_close():
    s = Scheduler(page_size=4, num_pages=16, num_rows=4, max_context_len=64,
                  overlap=True, spec_enabled=True, device=DEV)
    assert s.open_session(1) == "ok"
    prompt = tuple(range(10, 20))
    assert s.submit_turn(1, 1, prompt, 6) == "ok"    # finished below by a stop token
    assert s.schedule(1) == "ok"
    r = s.reqs[1]
    # alloc_extend(0 -> 10): A, B, C = pages 1, 2, 3; node8 holds A, B and is locked
    assert row_of(s, r.req_pool_idx, 10) == list(range(4, 14))
    (node8,) = s.radix_cache.all_nodes()
    assert node8.path() == prompt[:8] and node8.lock_ref == 1
    assert (r.cache_protected_len, r.last_node) == (8, node8)
    assert s.tree_cache.protected_size() == 8
    for _ in range(4):
        assert s.decode(1, 7) == "ok"
    assert (r.kv_committed_len, len(r.output_ids)) == (14, 5)
    assert s.finish(1) == "ok"                    # overlap: committed = allocated = 15
    slot = s.tree_cache.slots[1]
    assert (slot.req_pool_idx, slot.kv_committed_len, slot.kv_allocated_len,
            slot.cache_protected_len, slot.last_node) == (0, 15, 15, 8, node8)
    assert accounting(s) == (64 - 16, 0, 8, 8)     # session_held = C, D
    assert checks.leak_check(s) == [] and checks.concrete_findings(s) == []
    sess = s.session_controller.sessions[1]
    assert sess.checkpoint() == list(prompt) + [1, 7, 7, 7, 7] and not sess.inflight

    # turn 2: +3 tokens; prefix 15; position 15 in D (index 19), 16-17 in new page E (5)
    assert s.submit_turn(1, 2, (30, 31, 32), 2) == "ok"
    assert s.schedule(2) == "ok"
    r2 = s.reqs[2]
    assert r2.req_pool_idx == 0 and r2.cache_protected_len == 8
    assert row_of(s, 0, 18) == list(range(4, 20)) + [20, 21]
    assert (r2.kv_committed_len, r2.kv_allocated_len) == (18, 18)
    # spec over-allocation to 24 (E, F), one draft accepted: committed 20, output 3 > 2,
    # so check_finished ends the turn in this step: target 20, _free_kv_aligned(20, 24) frees F
    assert s.spec_decode(2, drafts=2, accepted=1, token=9) == "ok"
    assert 2 not in s.reqs
    assert row_of(s, 0, 24)[18:] == [22, 23, 24, 25, 26, 27]
    assert (slot.kv_committed_len, slot.kv_allocated_len) == (20, 20)
    assert 6 in s.token_to_kv_pool_allocator.get_all_free_pages().tolist()
    assert sess.checkpoint() == list(prompt) + [1, 7, 7, 7, 7] + [30, 31, 32, 1, 9]
    assert accounting(s) == (64 - 20, 0, 8, 12)
    # close: dec_lock_ref(node8), free row[8:20] = C, D, E, row returned
    assert s.close_session(1) == "ok"
    assert accounting(s) == (64 - 8, 8, 0, 0)
    assert sorted(s.token_to_kv_pool_allocator.get_all_free_pages().tolist()) == list(range(3, 17))
    assert sorted(s.req_to_token_pool.free_slots) == [0, 1, 2, 3]
    assert s.tree_cache.slots == {} and node8.lock_ref == 0
    assert checks.leak_check(s) == [] and checks.concrete_findings(s) == []


@pytest.mark.parametrize("P,n", [(1, 7), (4, 7), (4, 8), (4, 9)])
def test_non_overlap_finish_and_plain_release_around_page_boundaries(P, n):
    s = Scheduler(page_size=P, num_pages=32 // P, num_rows=2, max_context_len=32, device=DEV)
    s.submit_request(1, tuple(range(1, n + 1)), 4)
    assert s.schedule(1) == "ok"
    s.decode(1)
    s.decode(1)
    r = s.reqs[1]
    assert (r.kv_committed_len, r.seqlen) == (n + 2, n + 3)   # last sampled token has no KV
    assert s.finish(1) == "ok"
    keys = (n + 2) // P * P
    assert max(len(x.path()) for x in s.radix_cache.all_nodes()) == keys
    assert s.tree_cache.evictable_size() == keys
    assert s.token_to_kv_pool_allocator.available_size() == 32 - keys
    assert s.req_to_token_pool.free_slots == [1, 0]
    assert checks.leak_check(s) == [] and checks.concrete_findings(s) == []


def test_chunked_prefill_plain_shares_prefix_and_split_copies_lock():
    s = Scheduler(page_size=4, num_pages=16, num_rows=3, chunk_size=8, device=DEV)
    a = tuple(range(1, 14))
    s.submit_request(1, a, 4)
    assert s.schedule(1) == "ok"
    r = s.reqs[1]
    assert (r.phase, r.kv_committed_len) == ("prefill", 8)
    assert s.prefill_chunk(1) == "ok"             # inserts [0, 8) first, then the last chunk
    assert r.phase == "decode" and r.cache_protected_len == 12
    (n8, n12) = sorted(s.radix_cache.all_nodes(), key=lambda n: len(n.path()))
    assert (n8.path(), n12.path(), n8.lock_ref, n12.lock_ref) == (a[:8], a[:12], 1, 1)
    assert s.tree_cache.protected_size() == 12
    # a second request sharing 4 tokens splits node [0, 8) at 4; the parent copies lock 1
    s.submit_request(2, a[:4] + (99, 98, 97), 2)
    assert s.schedule(2) == "ok"
    mid = s.reqs[2].last_node
    assert mid.path() == a[:4] and mid.lock_ref == 2 and n8.lock_ref == 1 and n8.parent is mid
    assert s.tree_cache.protected_size() == 12
    assert checks.leak_check(s) == [] and checks.concrete_findings(s) == []


def test_retract_and_retry_streaming_keeps_checkpoint_and_inflight():
    s = Scheduler(page_size=4, num_pages=16, num_rows=2, overlap=True, device=DEV)
    s.open_session(1)
    s.submit_turn(1, 1, tuple(range(1, 10)), 8)
    s.schedule(1)
    s.decode(1)
    s.decode(1)
    assert s.retract(1) == "ok"                   # FIX(H4): parked, no finish_req
    sess = s.session_controller.sessions[1]
    r = s.reqs[1]
    assert sess.inflight and sess.checkpoint() == []
    slot = s.tree_cache.slots[1]
    assert (slot.kv_committed_len, slot.kv_allocated_len, slot.cache_protected_len) == (12, 12, 8)
    assert (r.phase, r.is_retracted, r.req_pool_idx, r.kv_committed_len) == ("queued", True, None, 0)
    assert r.output_ids == [1, 1, 1]
    assert checks.leak_check(s) == [] and checks.concrete_findings(s) == []
    # retry: restores the slot; prefix = min(12, 12 - 1) = 11; _free_tail frees nothing
    assert s.schedule(1) == "ok"
    assert (r.req_pool_idx, r.kv_committed_len, r.is_retracted) == (slot.req_pool_idx, 12, False)
    assert r.output_ids == [1, 1, 1, 1]
    assert checks.leak_check(s) == []
    assert s.close_session(1) == "deferred"
    assert s.finish(1) == "ok"                    # deferred close carried out
    assert s.session_controller.sessions == {} and s.tree_cache.slots == {}
    assert s.token_to_kv_pool_allocator.available_size() + s.tree_cache.evictable_size() == 64


def test_stub_does_not_clear_inflight_h3_and_queued_abort_clears_it_h5():
    s = Scheduler(page_size=1, num_pages=32, num_rows=3, device=DEV)
    s.open_session(1)
    assert s.submit_turn(1, 1, (1, 2, 3), 2) == "ok"
    assert s.submit_turn(1, 2, (4,), 2) == "stub"
    stub = s.reqs[2]
    assert stub.origin_input_ids == [0] and stub.to_finish is not None and stub.session is not None
    assert s.abort_queued(2) == "ok"              # FIX(H3): turn 1 stays in flight
    sess = s.session_controller.sessions[1]
    assert sess.inflight
    assert s.close_session(1) == "deferred"
    assert s.abort_queued(1) == "ok"              # FIX(H5): clears in flight; close runs
    assert s.session_controller.sessions == {}


def test_preabort_of_next_turn_detaches_at_schedule():
    s = Scheduler(page_size=1, num_pages=32, num_rows=3, device=DEV)
    s.open_session(1)
    s.submit_turn(1, 1, (1, 2, 3), 2)
    s.schedule(1)
    s.finish(1)
    slot = s.tree_cache.slots[1]
    before = (slot.req_pool_idx, slot.kv_committed_len, slot.kv_allocated_len)
    s.submit_turn(1, 2, (4, 5), 2)
    s.pre_abort(2)
    assert s.schedule(2) == "ok"                  # detached, radix path, finishes aborted
    assert 2 not in s.reqs
    assert (slot.req_pool_idx, slot.kv_committed_len, slot.kv_allocated_len) == before
    assert not s.session_controller.sessions[1].inflight
    assert checks.leak_check(s) == [] and checks.concrete_findings(s) == []


def test_rejected_admission_keeps_borrowed_row_and_retry_is_idempotent():
    s = Scheduler(page_size=4, num_pages=16, num_rows=2, device=DEV)
    s.open_session(1)
    s.submit_turn(1, 1, tuple(range(1, 7)), 2)
    s.schedule(1)
    s.decode(1)                                   # output 2 = max: finishes in this step
    s.submit_turn(1, 2, (9, 9), 2)
    free0 = s.token_to_kv_pool_allocator.available_size()
    assert s.schedule(2, admit=False) == "rejected"
    r = s.reqs[2]
    assert r.req_pool_idx == s.tree_cache.slots[1].req_pool_idx and not r.lock_held
    assert s.schedule(2, admit=False) == "rejected"
    assert s.token_to_kv_pool_allocator.available_size() == free0
    assert s.schedule(2) == "ok"
    assert checks.leak_check(s) == [] and checks.concrete_findings(s) == []


def test_eviction_before_allocation_and_decode_oom_changes_nothing():
    s = Scheduler(page_size=4, num_pages=4, num_rows=3, max_context_len=32, device=DEV)
    s.submit_request(1, tuple(range(1, 10)), 2)   # 9 tokens: 3 pages
    s.schedule(1)
    s.finish(1)                                   # node of 8 tokens (2 pages), evictable
    assert s.tree_cache.evictable_size() == 8
    s.submit_request(2, (50,) * 13, 8)            # 4 pages: needs the evictable ones
    assert s.schedule(2) == "ok"
    assert s.tree_cache.evictable_size() == 0 and s.radix_cache.all_nodes()[0].path() == (50,) * 12
    r = s.reqs[2]
    s.decode(2)
    s.decode(2)                                   # committed 15: still page 4
    assert r.kv_committed_len == 15
    s.decode(2)
    assert r.kv_committed_len == 16
    snapshot = (r.kv_committed_len, r.kv_allocated_len, list(r.output_ids),
                s.token_to_kv_pool_allocator.available_size())
    assert s.decode(2) == "oom"                   # position 16 starts a page: none left
    assert snapshot == (r.kv_committed_len, r.kv_allocated_len, list(r.output_ids),
                        s.token_to_kv_pool_allocator.available_size())
    assert s.submit_request(3, (1, 2), 1) == "ok" and s.schedule(3) == "rejected"


def test_mid_abort_borrow_era_checkpoints_into_tree():
    s = Scheduler(page_size=4, num_pages=16, num_rows=2, era="borrow", device=DEV)
    s.open_session(1)
    s.submit_turn(1, 1, tuple(range(1, 7)), 4)
    s.schedule(1)
    s.decode(1)
    s.finish(1)
    s.submit_turn(1, 2, (20, 21, 22, 23), 4)
    s.schedule(2)
    s.decode(2)
    assert s.abort_running(2) == "ok"
    assert s.tree_cache.slots == {}
    paths = sorted(n.path() for n in s.radix_cache.all_nodes())
    assert paths[-1] == (1, 2, 3, 4, 5, 6, 1, 1, 20, 21, 22, 23)
    assert all(n.lock_ref == 0 for n in s.radix_cache.all_nodes())
    assert not s.session_controller.sessions[1].inflight
    assert s.tree_cache.protected_size() == 0
    assert checks.leak_check(s) == [] and checks.concrete_findings(s) == []


def test_concrete_findings_report_owner_and_page():
    s = Scheduler(page_size=4, num_pages=8, num_rows=2, device=DEV)
    s.submit_request(1, tuple(range(1, 7)), 3)
    s.schedule(1)
    alloc = s.token_to_kv_pool_allocator
    r = s.reqs[1]
    page = int(s.req_to_token_pool.req_to_token[r.req_pool_idx, 4]) // 4
    alloc.free(torch.tensor([page * 4], device=DEV))          # a live page freed
    alloc.free(torch.tensor([page * 4 + 1], device=DEV))      # and again
    s.req_to_token_pool.free_slots.append(r.req_pool_idx)
    s.req_to_token_pool.req_to_token[r.req_pool_idx, 5] = 0   # congruence broken, page 0
    ids = {(f.id, f.owner, f.page) for f in checks.concrete_findings(s)}
    assert ("C1", "req 1", page) in ids
    assert ("C2", "allocator", page) in ids
    assert ("C3", "req 1", 0) in ids
    assert ("C4", "req 1", 0) in ids
    assert ("C5", "req 1", None) in ids
    assert any(f.id == "L1" for f in checks.leak_check(s))


def test_closing_session_hands_out_a_plain_stub():
    s = Scheduler(page_size=1, num_pages=16, num_rows=2, device=DEV)
    s.open_session(1)
    s.submit_turn(1, 1, (1, 2), 2)
    assert s.close_session(1) == "deferred"
    assert s.submit_turn(1, 2, (3,), 2) == "stub"
    stub = s.reqs[2]
    assert (stub.session, stub.streaming, stub.rejected, stub.origin_input_ids) == (None, False, True, [0])


def test_preabort_of_retracted_turn_drops_the_parked_slot():
    s = Scheduler(page_size=1, num_pages=32, num_rows=2, device=DEV)
    s.open_session(1)
    s.submit_turn(1, 1, (1, 2, 3), 4)
    s.schedule(1)
    s.decode(1)
    s.retract(1)
    assert 1 in s.tree_cache.slots
    s.pre_abort(1)
    assert s.schedule(1) == "ok"                  # detached; parked partial turn released
    assert s.tree_cache.slots == {} and not s.session_controller.sessions[1].inflight
    assert s.session_controller.sessions[1].checkpoint() == []
    assert checks.leak_check(s) == [] and checks.concrete_findings(s) == []
