"""Hybrid SWA models: the SWA KV pool beside the full one and each holder's window cursor,
below which its SWA KV is freed (0.5.15's rules; "borrow era" marks 0.5.23's, by `config.era`).

SWA (`SWATokenToKVPoolAllocator`): every full page the allocator hands out gets an SWA
page (`full_to_swa_index_mapping`, 0 = none); `free` releases both; `free_swa` (the
out-of-window free of decode) releases only the SWA page and zeroes the mapping entry.
"""
from __future__ import annotations

import bisect

from kvcheck.spec.pages import ceil_align, floor_align, row_pages
from kvcheck.spec.state import Req, Slot, State
from kvcheck.spec.violations import ModelError


def swa_evict_target(evicted: int, pre_len: int, window: int, p: int) -> int:
    """`free_swa_out_of_window_slots` (radix cache): the new cursor,
    `max(evicted, pre_len - max(window, P))`, floored to a page when P > 1. The caller
    frees `[evicted, new)` only when new > evicted. proofs/hybrid_lemmas.py proves that
    the cursor never passes pre_len and stays page-aligned.
    pre: p >= 1
    pre: window >= 1
    pre: 0 <= evicted <= pre_len
    post: __return__ <= pre_len
    post: __return__ <= evicted or __return__ % p == 0
    """
    new = max(evicted, pre_len - max(window, p))
    return floor_align(new, p) if p > 1 else new


def swa_keep(window: int, p: int) -> int:
    """Borrow era (0.5.23 `free_swa_out_of_window_slots`, prefix-sharing cache): the tokens
    kept behind pre_len, `ceil_align(max(window, P), P)`, so a key ending at
    page_floor(pre_len) still has a whole window of live SWA."""
    return ceil_align(max(window, p), p)


def swa_dead_lo(protected: int, swa_evict_floor: int, p: int) -> int:
    """Borrow era `ReqKvInfo.swa_dead_lo`: the lowest SWA position a request may free
    itself, above the tree-owned prefix and the eviction shield `swa_evict_floor`
    (page-aligned upward). The floor is 0 unless `Config.prefill_aware_swa`
    (`set_swa_evict_floor`), so it is cache_protected_len there.
    pre: p >= 1
    pre: protected % p == 0
    post: __return__ >= protected
    post: __return__ % p == 0
    """
    lo = max(protected, swa_evict_floor)
    return ceil_align(lo, p) if p > 1 and lo > protected else lo


def set_swa_evict_floor(s: State, req: Req) -> None:
    """0.5.23 `Scheduler.get_new_batch_prefill`, after `prepare_for_extend`: under
    prefill-aware SWA every request of a prefill batch (each chunk, a retried request, a
    turn on its slot's record) gets `swa_evict_floor = extend_end`; nothing resets it."""
    if s.cfg.prefill_aware_swa:
        req.swa_evict_floor = req.extend_end


def cursor_at_dead_lo(holder, p: int) -> bool:
    """Prefill-aware SWA: a due eviction raises the cursor to `swa_dead_lo` (the floor,
    page-aligned upward) even where that passes the committed KV, freeing nothing."""
    return holder.swa_evict_floor > holder.protected and \
        holder.swa_evicted_seqlen == swa_dead_lo(holder.protected, holder.swa_evict_floor, p)


def swa_evict_due(cursor: int, pre_len: int, window: int, interval: int) -> bool:
    """Borrow era `_swa_eviction_trigger`: evict once `interval` tokens have slid out of the
    window past the cursor (`pre_len - window >= cursor + interval`), a distance, not
    0.5.15's step count (`forward_iter % interval`)."""
    return pre_len - window >= cursor + interval


def swa_evict_target_borrow(evicted: int, pre_len: int, window: int, p: int) -> int:
    """Borrow era: `max(evicted, pre_len - ceil_align(max(window, P), P))`, page-floored.
    pre: p >= 1
    pre: window >= 1
    pre: 0 <= evicted <= pre_len
    post: __return__ <= pre_len
    post: __return__ <= evicted or __return__ % p == 0
    """
    return floor_align(max(evicted, pre_len - swa_keep(window, p)), p)


def swa_on(s: State) -> bool:
    return s.cfg.swa_window > 0


def swa_available_size(s: State) -> int:
    return len(s.swa_free_pages) * s.cfg.page_size


def available_size(s: State, full: int) -> int:
    """`SWATokenToKVPoolAllocator.available_size`: min of both pools."""
    return min(full, swa_available_size(s)) if swa_on(s) else full


def swa_can_alloc(s: State, n: int) -> bool:
    """`new_pages_available`: the SWA pool has n pages too."""
    return not swa_on(s) or n <= len(s.swa_free_pages)


def swa_short(s: State, n: int) -> bool:
    """The SWA pool has fewer than n tokens free."""
    return swa_on(s) and swa_available_size(s) < n


def map_swa_pages(s: State, full_pages) -> None:
    """`set_full_to_swa_mapping`: each new full page gets the lowest free SWA page."""
    if not swa_on(s):
        return
    taken, s.swa_free_pages = s.swa_free_pages[:len(full_pages)], s.swa_free_pages[len(full_pages):]
    for p, w in zip(full_pages, taken):
        s.full_to_swa_index_mapping[p] = w


def free_swa(s: State, full_pages) -> None:
    """`free_swa`: the SWA pages mapped from these full pages (unique, skipping 0) return
    to the SWA pool; the mapping entries become 0 (so a second free is a no-op)."""
    if not swa_on(s):
        return
    for p in sorted(set(full_pages)):
        w = s.full_to_swa_index_mapping.pop(p, 0)
        if w > 0:
            bisect.insort(s.swa_free_pages, w)


def free_swa_out_of_window_slots(s: State, req: Req) -> None:
    """`ScheduleBatch.maybe_evict_swa` in a decode batch (radix cache): from the second
    decode batch, on maintenance steps, free the SWA KV of row positions that fell out of
    the window, `[swa_evicted_seqlen, new)`, never below cache_protected_len. Upstream
    runs it in `alloc_for_decode` once `check_decode_mem` passed, before the allocation;
    the spec runs it right after a successful allocation (the same pages are freed; only
    which free SWA page ids the allocation draws differs, which canonical renaming hides)."""
    if not swa_on(s):
        return
    if s.cfg.era == "borrow":
        _free_swa_out_of_window_borrow(s, req)
        return
    s.forward_iter += 1
    if req.decode_batch_idx < 1 or (s.forward_iter - 1) % s.cfg.swa_eviction_interval:
        return
    P = s.cfg.page_size
    req.swa_evicted_seqlen = max(req.swa_evicted_seqlen, req.protected)
    new = swa_evict_target(req.swa_evicted_seqlen, req.seqlen - 1, s.cfg.swa_window, P)
    if new > req.swa_evicted_seqlen:
        row = s.rows[req.row]
        free_swa(s, [row[k] for k in row_pages(req.swa_evicted_seqlen, new, P)])
        req.swa_evicted_seqlen = new


def _free_swa_out_of_window_borrow(s: State, req: Req) -> None:
    """Borrow era (0.5.23 `maybe_evict_swa` -> `evict_sliding_windows` ->
    `free_swa_out_of_window_slots`, radix cache): from the second decode batch, once the
    distance rule is due, the cursor is raised to `swa_dead_lo` and `[cursor, new)` is
    freed SWA-side, keeping `ceil_align(max(window, P), P)` tokens behind pre_len."""
    if req.decode_batch_idx >= 1:
        _free_swa_borrow(s, req, req.seqlen - 1, s.cfg.swa_eviction_interval)


def free_out_of_window_slots(s: State, req: Req, key_len: int) -> None:
    """Borrow era `checkpoint_into_tree` of an unfinished request (0.5.23
    `unified_radix_cache.py` l.1211-1222, `SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS`,
    on by default; `SWAComponent.free_out_of_window_slots`): before the insert,
    `free_swa_out_of_window_slots` with `pre_len = len(radix_key) - 1` (the key before page
    alignment) and the default eviction interval 1, so the part of a long prompt below
    the window is freed SWA-side at its first checkpoint, not only in decode."""
    if swa_on(s) and s.cfg.era == "borrow":
        _free_swa_borrow(s, req, key_len - 1, 1)


def _free_swa_borrow(s: State, req: Req, pre_len: int, interval: int) -> None:
    """0.5.23 `common.free_swa_out_of_window_slots` (prefix-sharing cache)."""
    window, P = s.cfg.swa_window, s.cfg.page_size
    if not swa_evict_due(req.swa_evicted_seqlen, pre_len, window, interval):
        return
    evicted = max(req.swa_evicted_seqlen, swa_dead_lo(req.protected, req.swa_evict_floor, P))
    req.swa_evicted_seqlen = evicted
    new = swa_evict_target_borrow(evicted, pre_len, window, P)
    if new > evicted:
        row = s.rows[req.row]
        pages = [row[k] for k in row_pages(evicted, new, P)]
        if None in pages:       # only two turns on one record (accepted U1/U2) get here
            raise ModelError(f"free_swa_out_of_window_slots: req {req.rid}'s pre_len {pre_len} "
                             f"runs past its record's allocated row ({req.allocated}): upstream "
                             f"frees req_to_token entries it never allocated")
        free_swa(s, pages)
        req.swa_evicted_seqlen = new


def swa_dead_pages(s: State, holder, start: int, end: int) -> set:
    """Borrow era `free_kv_row_segments`: the row-page indices of `[start, end)` inside
    `[swa_dead_lo, swa_evicted_seqlen)`, which go back full-side only
    (`free_full_segments`); the rest go through `free_segments` (both sides). Empty in
    the wrapper era or without SWA. Upstream asserts the cursor page-aligned when a range
    has both parts (the rewinds above keep it so)."""
    if not swa_on(s) or s.cfg.era != "borrow":
        return set()
    P = s.cfg.page_size
    lo = swa_dead_lo(holder.protected, holder.swa_evict_floor, P)
    hi = max(holder.swa_evicted_seqlen, lo)
    lo, hi = max(lo, start), min(hi, end)
    return set(row_pages(lo, hi, P)) if lo < hi else set()


def sync_borrowed(slot: Slot, req: Req, acting: bool) -> None:
    """Borrow era: the turn runs on the slot's record (`req.kv is slot.kv`), whose
    `component_evicted_seqlens` and Mamba refs are one; the acting turn wrote them last.
    (The Mamba refs are shared from `take` on: `_take` gives the slot the turn's.)"""
    if acting:
        slot.swa_evicted_seqlen = req.swa_evicted_seqlen
        slot.swa_evict_floor = req.swa_evict_floor
    req.swa_evicted_seqlen = slot.swa_evicted_seqlen
    req.swa_evict_floor = slot.swa_evict_floor


def decode_batch_done(req: Req) -> None:
    """`prepare_for_decode`: `req.decode_batch_idx += 1` after the allocation."""
    req.decode_batch_idx += 1


def clamp_swa_evicted(holder, n: int) -> None:
    """`_free_tail` / `_trim_overshoot`: `swa_evicted_seqlen = min(swa_evicted_seqlen, n)`
    (0.5.23: `ReqKvInfo.clamp_evicted_seqlens(n)` over `component_evicted_seqlens`)."""
    holder.swa_evicted_seqlen = min(holder.swa_evicted_seqlen, n)


def swa_aligned_rewind(s: State, req: Req, n: int) -> int:
    """FIX (0.5.23 `try_match_prefix` / `_trim_overshoot`): a rewind below the SWA cursor
    lands on a page boundary, so the partial page (whose SWA KV is freed) is re-prefilled
    rather than continued. 0.5.15 keeps n and clamps the cursor mid-page."""
    P = s.cfg.page_size
    if swa_on(s) and P > 1 and req.swa_evicted_seqlen > n:
        return floor_align(n, P)
    return n


def row_swa_held(allocated: int, protected: int, cursor: int, floor: int, P: int,
                 row_pages, mapped) -> int:
    """SWA tokens one row's holders keep (I43, on the abstract and on the fast path):
    `ceil_align(allocated) - max(protected, cursor)`; under prefill-aware SWA (a floor above
    the protected prefix) the row pages from the protected prefix on still mapped to an
    SWA page (`mapped`: full page ids with an SWA page)."""
    if floor <= protected:
        return -(-allocated // P) * P - max(protected, cursor)
    return P * sum(1 for k in range(protected // P, -(-allocated // P))
                   if row_pages[k] in mapped)


def swa_held_tokens(s: State, holder) -> int:
    """`session_held_swa_tokens` of one holder (0.5.23 `kv_private_swa_tokens`):
    `ceil_align(allocated) - protected - max(0, swa_evicted_seqlen - swa_dead_lo)`, which
    is `ceil_align(allocated) - max(protected, swa_evicted_seqlen)` with the floor 0."""
    P = s.cfg.page_size
    lo = swa_dead_lo(holder.protected, holder.swa_evict_floor, P)
    return (-(-holder.allocated // P) * P - holder.protected
            - max(0, holder.swa_evicted_seqlen - lo))


def save_swa_fields(slot: Slot, req: Req, is_first: bool) -> None:
    """`save_from_req`: the cursor always, the SWA lock boundary with the first turn."""
    slot.swa_evicted_seqlen = req.swa_evicted_seqlen
    slot.swa_evict_floor = req.swa_evict_floor
    if is_first:
        slot.swa_uuid_for_lock = req.swa_uuid_for_lock


def restore_swa_fields(slot: Slot, req: Req) -> None:
    """`restore_to_req`."""
    req.swa_evicted_seqlen = slot.swa_evicted_seqlen
    req.swa_evict_floor = slot.swa_evict_floor
    req.swa_uuid_for_lock = slot.swa_uuid_for_lock


def reset_for_retract(req: Req) -> None:
    """`reset_for_retract`: the cursor and the batch index restart, the branching point is
    dropped; the Mamba refs are already None (saved into the slot or freed by
    release_kv_cache)."""
    req.swa_evicted_seqlen = 0
    req.decode_batch_idx = 0
    req.swa_branching_seqlen = None
