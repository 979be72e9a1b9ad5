"""Planted faults: deliberate small defects for the checker's self-test.

Product code never sets ACTIVE; a fault is switched on only through `planted(name)`
(or by adding its name to ACTIVE in a test). Each check sits where the real defect
would be, as `if "<name>" in faults.ACTIVE:`.
"""
from __future__ import annotations

from contextlib import contextmanager

FAULTS: dict[str, str] = {
    "restore_clears_slot":
        "V0: restore_to_req clears slot.req_pool_idx, so a rejected-then-retried turn loses the slot's KV",
    "free_tail_unaligned":
        "_free_kv_aligned frees from target instead of ceil_align(target): a page still holding committed tokens is freed",
    "save_keeps_row":
        "save_from_req keeps req.req_pool_idx, so release_kv_cache also frees the overalloc tail and the row the slot now owns",
    "preabort_no_detach":
        "H1: find_active_slot restores the slot into a pre-aborted request instead of detaching it",
    "close_skips_dec_lock":
        "release_session skips dec_lock_ref on the first turn's radix node: the prompt stays locked forever",
    "close_not_deferred":
        "SessionController._close releases the session at once even while a turn is in flight (I22)",
    "ephemeral_slot_no_lock_node":
        "the ephemeral slot of a first-turn mid-abort is built without last_node: its lock is never dropped",
    "free_no_page_dedup":
        "allocator free() skips unique(index // P): one call frees a page once per token index",
    "free_tail_slot_untouched":
        "_free_tail trims only the request, not the slot: a retry frees the same tail twice",
    "split_no_lock_copy":
        "_split_node does not copy lock_ref to the new parent: path lock counts break",
    "overalloc_free_from_committed":
        "release_kv_cache frees the overallocation from committed instead of ceil_align(committed): the tail page is freed twice",
    "retract_advances_checkpoint":
        "H4 unfixed: retract of a streaming turn calls finish_req (checkpoint advances, _inflight cleared)",
    "abort_req_unconditional":
        "H3 unfixed: Session.abort_req clears _inflight whichever request calls it",
    "trim_overshoot_missing":
        "H2 (#22897): a finishing turn skips _trim_overshoot; speculative KV past max_new_tokens stays in the slot",
    "save_commit_unclamped":
        "#28754: the slot's kv_committed_len is set to the target without min(allocated): committed > allocated",
    "midabort_allocated_not_maxed":
        "mid-abort releases the slot without slot.kv_allocated_len = max(slot, req): the turn's tail leaks",
    "session_held_counts_borrowed":
        "#22213: session_held_tokens ignores active_pool_idxs, so a borrowed slot is counted twice while busy",
    "session_held_req_count_counts_borrowed":
        "session_held_req_count ignores active_pool_idxs (#22213's row side): a borrowed slot's row "
        "is counted twice while busy (L2)",
    "cache_unfinished_no_row_rewrite":
        "cache_unfinished_req frees the duplicates but does not point the row at the tree's copies",
    "evict_ignores_lock":
        "evict takes locked leaves too: a running turn's or a slot's prompt pages are freed under it",
    "decode_new_page_off_by_one":
        "alloc_decode takes a new page when seq_len % P == 0 instead of 1: row/page congruence breaks",
    "queued_abort_keeps_inflight":
        "H5 unfixed: a queued abort of a streaming turn makes no session call; _inflight stays set",
    "free_list_has_page_0":
        "the allocator's clear() builds free_pages from page 0: the reserved padding page (dummy "
        "writes of padded tokens) is handed out (C4)",
    "finished_keys_past_committed":
        "cache_finished_req keys the whole fill_ids instead of kv_committed_len: the last sampled "
        "token, whose KV was never written, is inserted with its stale row entry (C4, C1)",
    "free_keeps_req_pool_idx":
        "ReqToTokenPool.free returns the row but leaves req.req_pool_idx set: a retracted request "
        "still names the row it gave back (C5)",
    "protected_len_unaligned":
        "cache_unfinished_req sets cache_protected_len to the committed length, not len(new_indices) "
        "(the page-aligned part the tree owns): the tail page counts as protected (L1)",
    "unfinished_pops_committed":
        "cache_unfinished_req reads the committed length through pop_committed_kv_cache, as "
        "cache_finished_req does: a running request's committed KV is marked freed (D1, then E1)",
    # hybrid models (impl/swa.py, impl/mamba.py; docs/semantics.md "Hybrid models")
    "swa_free_skips_swa":
        "SWATokenToKVPoolAllocator.free releases only the full side: a free page still maps to SWA KV (I41, I40)",
    "swa_mapping_kept":
        "free_swa returns the SWA pages but leaves full_to_swa_index_mapping pointing at them (I40, I41)",
    "swa_evict_frees_past_cursor":
        "free_swa_out_of_window_slots frees one page more than it moves swa_evicted_seqlen: in-window KV lost (I42)",
    "restore_drops_swa_cursor":
        "restore_to_req does not copy swa_evicted_seqlen: the turn re-counts SWA KV the window already freed (D1)",
    "release_session_keeps_mamba":
        "H7 (#23496): release_session skips _free_slot_mamba: the slot's Mamba state leaks on close (I44)",
    "ephemeral_slot_no_mamba":
        "the first-turn mid-abort's ephemeral slot is built without the request's Mamba refs: they are orphaned (I44)",
    "lazy_track_frees_sentinel":
        "0.5.15 _free_slot_mamba frees the whole lazy track buffer: the -1 sentinel enters the free list (I44)",
    # borrow era (0.5.23) hybrid rules
    "swa_evict_step_count":
        "0.5.23 SWA eviction on 0.5.15's step count (forward_iter % interval) instead of the distance rule (D1)",
    "swa_keep_not_ceil_aligned":
        "0.5.23 free_swa_out_of_window_slots keeps max(window, P) instead of ceil_align(max(window, P), P) (D1)",
    "swa_dead_lo_zero":
        "0.5.23 free_swa_out_of_window_slots starts at the cursor, not max(cursor, swa_dead_lo): tree-owned SWA KV freed",
    "swa_dead_range_past_cursor":
        "0.5.23 free_kv_row_segments ends the full-side-only range a page past swa_evicted_seqlen: live SWA KV leaks (E1: swa.peer_released)",
    "mamba_donate_when_node_has_state":
        "0.5.23 Mamba tree: a finished request whose insert ends on a node that already has a state "
        "drops its own as if donated instead of free_mamba_cache: the slot leaks (I44)",
    "swa_dead_lo_ignores_floor":
        "0.5.23 ReqKvInfo.swa_dead_lo ignores swa_evict_floor (prefill-aware SWA): window eviction frees the prompt's SWA KV (D1)",
    # scheduling rounds (impl/schedule_policy.py, impl/running_batch.py, impl/scheduler.py decode_round)
    "round_kv_budget_not_shared":
        "PrefillAdder forgets what earlier requests of the round reserved: each is admitted against "
        "the whole free and evictable KV, and the batch's allocation fails after admission (E1)",
    "round_rows_not_shared":
        "PrefillAdder forgets the rows earlier requests of the round take: the batch's "
        "alloc_req_slots runs out (E1)",
    "round_refused_keeps_lock":
        "a request the round's budget refuses keeps its admission lock (no dec_lock_ref): the "
        "matched prefix stays locked with no holder (I13)",
    "round_evicts_per_request":
        "prepare_for_extend evicts for each request of the batch as it allocates instead of once "
        "for the batch's extend (D1: other nodes evicted)",
    "round_hook_skips_second":
        "maybe_hand_to_session runs for the batch's first request only: a later turn of the round "
        "never hands its record to a slot (D1)",
    "round_chunk_left_behind":
        "the round never continues the chunked request (add_chunked_req admits nothing): its "
        "prefill stalls while new requests run (D1)",
    "round_chunk_budget_not_shared":
        "each request of the round gets the whole chunk budget: a round prefills more than "
        "chunked_prefill_size tokens and no request is cut into a chunk (D1)",
    "retract_victim_most_output":
        "retract_decode pops from the front of its keep order: the request with the most output "
        "is retracted first (D1)",
    "retract_decode_keeps_retracting":
        "retract_decode's loop does not stop when the rest fits: every request but one is "
        "retracted (D1)",
    "decode_round_skips_finish":
        "the decode round's result never finishes a request at max_new_tokens: it keeps its "
        "KV and row past its last token (D1)",
    "round_stub_drops_slot":
        "a pre-aborted stub's abort drops its session's slot although it never ran on it (U7's "
        "path without the assertion): the slot is released under the session's running turn (I22)",
    "round_stub_nukes_slot":
        "wrapper era: a rejected stub admitted beside its session's finishing first turn releases "
        "the slot that turn just made instead of its own row and KV (U8's path): the stub's row "
        "and page leak (I2, I4)",
    "preempt_takes_finished":
        "preempt_to_schedule does not skip the finished requests still in the running batch (the "
        "two-phase finish): a finished request's KV and row are released a second time",
    "preempt_oldest_first":
        "preempt_to_schedule breaks a priority tie by the earliest queue entry instead of the "
        "latest: the longer-running request is preempted (D1)",
    "preempt_takes_all":
        "preempt_to_schedule does not stop once the victims' remaining output covers the new "
        "request: every running request of lower priority is preempted (D1)",
    "preempt_rows_not_counted":
        "the rows preemption frees are not given to the round: the request it preempted for is "
        "refused for want of a row (D1)",
}

ACTIVE: set[str] = set()


@contextmanager
def planted(*names: str):
    """Switch the named faults on for the duration of the block."""
    for n in names:
        if n not in FAULTS:
            raise KeyError(f"unknown planted fault {n!r}; known: {', '.join(sorted(FAULTS))}")
    added = [n for n in names if n not in ACTIVE]
    ACTIVE.update(added)
    try:
        yield
    finally:
        ACTIVE.difference_update(added)
