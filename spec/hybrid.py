"""Hybrid models: the SWA KV pool and the Mamba state pool (sglang 0.5.15, wrapper era, and
0.5.23, borrow era: the functions marked "borrow era" are 0.5.23's rules, chosen by
`config.era`).

Each function is one upstream rule (docs/semantics.md, "Hybrid models", cites them);
the step's modules (spec/model.py and those it builds on) call them from short hooks.
With `config.swa_window == 0` and `config.mamba_slots == 0` every function is a no-op, so
a non-hybrid run is unchanged.
Like the step's helpers, the mutating ones act on the clone `step` made.

SWA (`SWATokenToKVPoolAllocator`): every full page the allocator hands out gets an SWA
page (`full_to_swa_index_mapping`, 0 = none); `free` releases both; `free_swa` (the
out-of-window free of decode) releases only the SWA page and zeroes the mapping entry.
Mamba (`HybridReqToTokenPool`, `MambaSlotAllocator`): one state slot per request row
(slot 0 is the reserved dummy), plus the ping-pong track buffer when enabled; the
session slot takes them on save and returns them on close (`_free_slot_mamba`).
"""
from __future__ import annotations

import bisect

from kvcheck.spec import mamba_tree
from kvcheck.spec.pages import ceil_align, floor_align, row_pages
from kvcheck.spec.state import Req, Slot, State
from kvcheck.spec.violations import ModelError

EMPTY_TRACK = -1
"""The sentinel a lazily allocated ping-pong buffer holds in its unallocated entry."""


# ---------------------------------------------------------------------------
# SWA pool
# ---------------------------------------------------------------------------

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


def swa_tree_on(s: State) -> bool:
    """The wrapper era's SWA tree (`SWARadixCache`): SWA on, era "wrapper"."""
    return s.cfg.swa_window > 0 and s.cfg.era != "borrow"


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


def swa_evictable_size(s: State) -> int:
    """SWA tokens the tree can give back: those of the nodes outside every SWA lock (a
    tombstone gives none). Wrapper era `SWARadixCache.swa_evictable_size`: the keys of the
    live nodes; borrow era `UnifiedTreeCore.swa_evictable_size` (the SWA component's
    evictable ledger, `reclaimable_value_len` of each node whose SWA `lock_ref` is 0):
    their mapped pages. A full-locked node past its holder's SWA lock counts: the SWA
    walk can tombstone it."""
    locked = swa_locked_nodes(s)
    if swa_tree_on(s):
        return sum(len(n.key) for n in dict.values(s.nodes)
                   if n.id != 0 and n.id not in locked and not swa_tombstoned(s, n))
    return sum(swa_tokens(s, n) for n in dict.values(s.nodes) if n.id != 0 and n.id not in locked)


def swa_tokens(s: State, node) -> int:
    """The SWA tokens a node holds (`reclaimable_value_len`): its pages still mapped."""
    m = s.full_to_swa_index_mapping
    return s.cfg.page_size * sum(1 for p in node.pages if p in m)


def swa_lru_on(s: State) -> bool:
    """0.5.23's SWA component keeps its own LRU list (`lru_lists[SWA]`): SWA on, borrow era."""
    return s.cfg.swa_window > 0 and s.cfg.era == "borrow"


def swa_insert_mru(s: State, nid: int) -> None:
    """Borrow era `set_component_device_value` (an SWA value stored on a node: a fresh
    leaf's window published, a tombstone recovered by an insert): `insert_mru`."""
    if swa_lru_on(s):
        s.tick += 1
        s.nodes[nid].swa_tick = s.tick


def swa_refresh(s: State, nid: int) -> None:
    """Borrow era `SWAComponent.refresh_lru` at MATCH_END / INSERT_END (`swa.py` l.332-355,
    `reset_node_and_window_ancestors_mru`, `unified_tree_core.py` l.332-355): from the node
    up, while fewer than `window + P` tokens were walked, every node holding SWA KV moves
    to the MRU end, the node first (one stamp: the deeper, the more recent). Its
    ancestors past that stay where they are, unlike the FULL component's access times."""
    if not swa_lru_on(s):
        return
    s.tick += 1
    walked, limit = 0, s.cfg.swa_window + s.cfg.page_size
    while nid != 0 and walked < limit:
        n = dict.__getitem__(s.nodes, nid)
        if swa_tokens(s, n):
            s.nodes[nid].swa_tick = s.tick
        walked += len(n.key)
        nid = n.parent


def swa_evict_victim(s: State, order):
    """The next node of an SWA eviction walk: the least recent (by `order`) node holding SWA
    KV (not tombstoned) and not SWA-locked, or None. Wrapper era `SWARadixCache.evict`'s
    SWA loop orders by (tick, path); borrow era `SWAComponent._evict_device_next_node`
    (`swa.py` l.754-841) by the SWA component's own LRU. The caller deletes it whole when
    it is an unlocked leaf (`evict_device_leaf`), else frees only its SWA KV (an SWA
    tombstone)."""
    locked = swa_locked_nodes(s)
    cands = [n for n in dict.values(s.nodes)
             if n.id != 0 and n.id not in locked and swa_tokens(s, n)]
    return min(cands, key=order) if cands else None


def swa_admission_short(s: State, need: int) -> bool:
    """The admission budget on the SWA side (`PrefillAdder`'s SWA tokens): available
    plus what evicting unlocked nodes would return."""
    return swa_on(s) and need > swa_available_size(s) and \
        need > swa_available_size(s) + swa_evictable_size(s)


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


def note_swa_lock(s: State, req: Req) -> None:
    """`_req_inc_lock_ref` under SWA: `swa_uuid_for_lock` names the lock boundary the
    inc took: the node where the SWA lock, walking up from the locked node, first covers
    `sliding_window_size` tokens (None when it reaches the root first, or for the root and
    a virtual node). Both eras: 0.5.15 `SWARadixCache.inc_lock_ref`; 0.5.23
    `SWAComponent.acquire_component_lock` (tombstones counted, the boundary node stamped
    with the receipt's uuid)."""
    if not swa_on(s):
        return
    a = req.last_node
    nid = a[1] if a and a[0] == "node" and a[1] != 0 else None
    if nid is not None:
        nid = swa_window_node(s, nid)
    req.swa_uuid_for_lock = None if nid is None else ("node", nid)


def swa_window_node(s: State, nid: int):
    """The first node up from nid (inclusive) at which the keys walked cover the window;
    None when the root comes first."""
    size = 0
    while nid != 0:
        n = dict.__getitem__(s.nodes, nid)
        size += len(n.key)
        if size >= s.cfg.swa_window:
            return nid
        nid = n.parent
    return None


def move_swa_uuid(s: State, lower: int, upper: int) -> None:
    """`_split_node`: the new upper half inherits the lower one's `swa_uuid` (0.5.15
    `SWARadixCache._split_node`; 0.5.23 `SWAComponent.redistribute_on_node_split`), so every
    holder whose SWA lock ended at the split node now ends at the upper half."""
    if not swa_on(s):
        return
    old = ("node", lower)
    for m in (s.reqs, s.slots):
        for k, h in list(dict.items(m)):
            if h.swa_uuid_for_lock == old:
                m[k].swa_uuid_for_lock = ("node", upper)


def swa_locked_nodes(s: State) -> set:
    """Nodes with `swa_lock_ref > 0` (wrapper era): each tree lock holder (a locked
    request, a slot's first-turn node) SWA-locks from its node up to its
    `swa_uuid_for_lock` node inclusive, or to the root when that is None."""
    out = set()
    holders = [(r.last_node, r.swa_uuid_for_lock) for r in dict.values(s.reqs) if r.locked]
    holders += [(t.last_node, t.swa_uuid_for_lock) for t in dict.values(s.slots)]
    for a, stop in holders:
        nid = a[1] if a and a[0] == "node" else 0
        while nid != 0:
            out.add(nid)
            if stop == ("node", nid):
                break
            nid = dict.__getitem__(s.nodes, nid).parent
    return out


def swa_tombstoned(s: State, node) -> bool:
    """A node whose SWA KV is freed (upstream's per-node `swa_tombstone`): its pages map
    to no SWA page."""
    return bool(node.pages) and all(p not in s.full_to_swa_index_mapping for p in node.pages)


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


def swa_match_len(s: State, pages) -> int:
    """`SWARadixCache._match_prefix_helper`: the matched prefix is usable up to the last
    point where either no SWA tombstone lies behind it, or at least `sliding_window_size`
    tokens with SWA KV follow the last tombstone (here a tombstone is a page whose SWA KV
    is freed: the spec tracks it per page, upstream per node)."""
    if not swa_on(s):
        return len(pages) * s.cfg.page_size
    P, window = s.cfg.page_size, s.cfg.swa_window
    since, best = None, 0           # None: no tombstone yet (upstream's inf)
    for k, p in enumerate(pages):
        if s.full_to_swa_index_mapping.get(p, 0) == 0:
            if since is None or since >= window:
                best = k * P
            since = 0
        else:
            since = None if since is None else since + P
    return len(pages) * P if since is None or since >= window else best


def adopt_swa(s: State, node_pages, incoming) -> None:
    """`_recover_tombstone_keeping_locked_full`: each tree page takes the SWA page of the
    request's page at the same position (the request's entry becomes 0)."""
    m = s.full_to_swa_index_mapping
    for p, q in zip(node_pages, incoming):
        w = m.pop(q, 0)
        if w:
            m[p] = w


def swa_tombstone_cut(s: State, start: int, end: int, swa_evicted_seqlen: int) -> int:
    """Wrapper era `SWARadixCache._insert_helper` (0.5.15 l.1205-1236): of the new suffix
    `[start, end)` of an insert, `[start, swa_evicted_seqlen)` (whose SWA KV the window
    freed) becomes a tombstone node of its own above the live leaf. Returns the cut:
    start when nothing is tombstoned; end when all of it is (upstream then frees the
    suffix and adds no node: a leaf is never a tombstone). The borrow era and a non-SWA
    run: start."""
    if not swa_on(s) or s.cfg.era == "borrow":
        return start
    return min(max(start, swa_evicted_seqlen), end)


def insert_cursor(s: State, holder) -> int:
    """The `swa_evicted_seqlen` an unfinished request's insert carries: 0.5.23's
    `SWAComponent.prepare_for_caching_req` sets the request's (the wrapper era's
    `cache_unfinished_req` inserts with none)."""
    return holder.swa_evicted_seqlen if swa_on(s) and s.cfg.era == "borrow" else 0


def clip_to_window(s: State, start: int, end: int, swa_evicted_seqlen: int):
    """Borrow era (0.5.23 `SWAComponent._clip_to_window`, `swa.py` l.434-447, from
    `commit_insert_component_data` on a fresh leaf `[start, end)`): the live start
    `max(start, swa_evicted_seqlen)`; the leaf is split there, its part below the cursor
    staying an SWA tombstone node of its own. None when the whole leaf lies below the
    cursor (it stays one tombstone leaf: nothing is freed, unlike the wrapper era), and
    without SWA or in the wrapper era (nothing to commit); no split when it equals start.
    pre: 0 <= start < end
    post: __return__ is None or start <= __return__ < end
    """
    if not swa_on(s) or s.cfg.era != "borrow":
        return None
    live_start = max(start, swa_evicted_seqlen)
    return None if live_start >= end else live_start


def swa_branching_seqlen(s: State, full_hit: int, usable: int):
    """Borrow era (0.5.23 `SWAComponent.finalize_match_result_in_tree_core`, `swa.py`
    l.379-422): a match whose full-KV hit runs past its SWA boundary (the usable prefix)
    records the page-aligned full hit as the branching point; None otherwise, without SWA
    and in the wrapper era (a session slot's match, `try_match_prefix`, records None too).
    pre: 0 <= usable <= full_hit
    post: __return__ is None or usable < __return__ <= full_hit
    """
    if not swa_on(s) or s.cfg.era != "borrow":
        return None
    aligned = floor_align(full_hit, s.cfg.page_size)
    return aligned if aligned > usable else None


def swa_branch_cache_len(req: Req, token_ids_len: int):
    """Borrow era `SWAComponent.prepare_for_caching_req` (`swa.py` l.1017-1028): a pending
    `swa_branching_seqlen` past the protected prefix that the checkpoint's tokens reach caps
    the insert at it (the tree takes the branch first, recovering the tombstones of the
    full hit on its walk); None: no cap. (Its EAGLE bigram `+ 1` is not modelled: kvcheck's
    keys are plain tokens.)"""
    b = req.swa_branching_seqlen
    return None if b is None or b <= req.protected or b > token_ids_len else b


def cleanup_swa_branch(s: State, req: Req, branch, finished: bool) -> None:
    """Borrow era `SWAComponent.cleanup_after_caching_req` (`swa.py` l.1051-1069): once an
    insert capped at the branch took it (`swa_branch_inserted`: the key reaches it, always
    so when `swa_branch_cache_len` capped it), the request's `swa_branching_seqlen` is
    cleared and, unfinished, its out-of-window SWA is freed again up to its forward
    (`pre_len = len(get_fill_ids()) - 1`, the extend end), interval 1."""
    if branch is None:
        return
    req.swa_branching_seqlen = None
    if not finished:
        _free_swa_borrow(s, req, req.extend_end - 1, 1)


def swa_lock_split(leaf_len: int, window: int, p: int):
    """Borrow era (0.5.23 `SWAComponent._maybe_split_leaf_for_swa_lock`, `swa.py`
    l.593-624): a fresh live leaf longer than one page-aligned window
    (`ceil_align(window, P)`) is split so its lower part is exactly that window and the SWA
    lock pins only it; returns the split offset, or None when the leaf fits.
    pre: p >= 1
    pre: window >= 1
    pre: leaf_len % p == 0
    post: __return__ is None or (0 < __return__ < leaf_len and __return__ % p == 0)
    """
    tail = ceil_align(window, p)
    return leaf_len - tail if leaf_len > tail else None


def prompt_split_on(s: State) -> bool:
    """Borrow era `checkpoint_into_tree` (0.5.23 `unified_radix_cache.py` l.1266-1270): the
    second insert that splits the path at the prompt boundary runs only when the tree's one
    component is FULL, so not under an SWA (or a Mamba) component."""
    return s.cfg.era == "borrow" and not s.cfg.swa_window and not s.cfg.mamba_slots


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


# ---------------------------------------------------------------------------
# Mamba pool
# ---------------------------------------------------------------------------

def mamba_on(s: State) -> bool:
    return s.cfg.mamba_slots > 0


def track_buffer_size(s: State) -> int:
    """`mamba_ping_pong_track_buffer_size`: 2 under the overlap scheduler, else 1."""
    return 2 if s.cfg.overlap else 1


def mamba_needed(s: State, req: Req) -> int:
    """Slots `HybridReqToTokenPool.alloc` takes for req: its state unless it has one
    (a restored or continuing request), and the track buffer when enabled and absent."""
    if not mamba_on(s):
        return 0
    n = 1 if req.mamba_pool_idx is None else 0
    if s.cfg.mamba_extra_buffer != "off" and req.mamba_ping_pong_track_buffer is None:
        n += 1 if s.cfg.mamba_extra_buffer == "lazy" else track_buffer_size(s)
    return n


def mamba_short(s: State, req: Req) -> bool:
    """Admission is refused when the Mamba pool cannot give req its slots (under the
    Mamba tree: `mamba_tree.admission_short`, evictable states counted)."""
    if s.cfg.mamba_tree:
        return mamba_tree.admission_short(s, mamba_needed(s, req))
    return mamba_needed(s, req) > len(s.mamba_free_slots)


def _mamba_alloc(s: State, n: int) -> list:
    taken, s.mamba_free_slots = s.mamba_free_slots[:n], s.mamba_free_slots[n:]
    return taken


def alloc_mamba(s: State, req: Req) -> None:
    """`HybridReqToTokenPool.alloc` (+ `_alloc_ping_pong_buffer`)."""
    if not mamba_on(s):
        return
    if req.mamba_pool_idx is None:
        req.mamba_pool_idx = _mamba_alloc(s, 1)[0]
    mode = s.cfg.mamba_extra_buffer
    if mode != "off" and req.mamba_ping_pong_track_buffer is None:
        size = track_buffer_size(s)
        got = _mamba_alloc(s, 1 if mode == "lazy" else size)
        req.mamba_ping_pong_track_buffer = tuple(got) + (EMPTY_TRACK,) * (size - len(got))


def mamba_ping_pong_empty(holder) -> list:
    """0.5.23 `ReqKvInfo.mamba_ping_pong_empty`: per track-buffer entry, True where it holds
    no slot (the spec keeps 0.5.15's -1 in the entry and derives the flags)."""
    buf = holder.mamba_ping_pong_track_buffer
    return None if buf is None else [m == EMPTY_TRACK for m in buf]


def mamba_refs(holder) -> tuple:
    """The Mamba pool entries a request or slot holds: its state, then its track buffer."""
    out = () if holder.mamba_pool_idx is None else (holder.mamba_pool_idx,)
    return out + tuple(holder.mamba_ping_pong_track_buffer or ())


def move_mamba(dst, src, clear_src: bool) -> None:
    """`save_from_req` / `restore_to_req` / the ephemeral slot: the Mamba references go
    with the KV; on a save (and the ephemeral slot) the request's are nulled."""
    dst.mamba_pool_idx = src.mamba_pool_idx
    dst.mamba_ping_pong_track_buffer = src.mamba_ping_pong_track_buffer
    if clear_src:
        src.mamba_pool_idx = None
        src.mamba_ping_pong_track_buffer = None


def free_mamba(s: State, holder) -> None:
    """`free_mamba_cache` (a request) / `_free_slot_mamba` (a slot): the state and the
    allocated track entries return to the pool. FIX (0.5.23 `mamba_ping_pong_empty`):
    a lazy buffer's -1 entry is skipped; 0.5.15's `_free_slot_mamba` frees it too."""
    if holder.mamba_pool_idx is not None:
        s.mamba_free_slots.append(holder.mamba_pool_idx)
    buf = holder.mamba_ping_pong_track_buffer or ()
    for m, empty in zip(buf, mamba_ping_pong_empty(holder) or ()):
        if not empty:
            s.mamba_free_slots.append(m)
    holder.mamba_pool_idx = None
    holder.mamba_ping_pong_track_buffer = None


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
