"""Scheduler glue (upstream mem_cache/common.py and ScheduleBatch helpers), each for one
request (a round's batch evicts once and calls them with `evict=False`):
evict_from_tree_cache, alloc_for_extend, alloc_for_decode, check_decode_mem,
release_kv_cache, release_req."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Optional

import torch

from kvcheck.impl import faults
from kvcheck.impl.schedule_batch import Req

I64 = torch.int64


def ceil_align(x: int, p: int) -> int:
    return -(-x // p) * p


def ceil_div(x: int, p: int) -> int:
    return -(-x // p)


def evict_from_tree_cache(tree_cache, allocator, num_tokens: int) -> None:
    """V1: if available_size() < n: evict(n), or only the shortfall n - available_size()
    (`evict_shortfall`: 0.5.17+). Borrow era (0.5.22+ evict_to_free_tokens): the shortfall."""
    if getattr(tree_cache, "era", "wrapper") == "borrow":
        inner = getattr(tree_cache, "inner", tree_cache)
        if hasattr(inner, "evict_for_alloc"):
            # 0.5.23 SWATokenToKVPoolAllocator.evict_to_free_tokens: each pool's shortfall
            inner.evict_for_alloc(num_tokens)
            return
        shortfall = num_tokens - allocator.available_size()
        if shortfall > 0:
            tree_cache.evict(shortfall)
        return
    if hasattr(allocator, "swa_available_size"):
        # 0.5.15 with an SWATokenToKVPoolAllocator: each pool's shortfall
        full = max(0, num_tokens - allocator.full_available_size())
        swa = max(0, num_tokens - allocator.swa_available_size())
        if full or swa:
            getattr(tree_cache, "inner", tree_cache).evict_hybrid(full, swa)
        return
    available = allocator.available_size()
    if available < num_tokens:
        tree_cache.evict(num_tokens - available if tree_cache.evict_shortfall else num_tokens)


@contextmanager
def free_group(allocator):
    """The scheduler's result processing (process_batch_result_prefill/_decode): the
    frees of one batch's releases are held and returned at once by free_group_end."""
    allocator.free_group_begin()
    try:
        yield
    finally:
        allocator.free_group_end()


def free_kv_row(req_to_token_pool, allocator, pool_idx: int, ranges, kv=None) -> None:
    """Borrow era (0.5.22+ `BasePrefixCache.free_kv_row`): give back ascending, disjoint,
    half-open row-position ranges of one row in one `allocator.free_segments` call, each
    range from a page-aligned start (every caller here passes one range, as upstream's).
    Under SWA, the record `kv` (request or slot) splits them (impl/swa.py
    `free_kv_row_segments`)."""
    row = req_to_token_pool.req_to_token[pool_idx]
    segments = [(row[start:end], start) for start, end in ranges]
    if kv is not None and hasattr(allocator, "free_full_segments"):
        from kvcheck.impl.swa import free_kv_row_segments, swa_dead_lo
        free_kv_row_segments(allocator, segments, swa_evicted_seqlen=kv.swa_evicted_seqlen,
                             swa_dead_lo=swa_dead_lo(kv, allocator.page_size))
        return
    allocator.free_segments(segments)


def alloc_token_range(sched, row: int, start: int, end: int,
                      before_alloc=None, evict: bool = True) -> Optional[torch.Tensor]:
    """KV indices for row positions [start, end), continuing the partial page at start
    (P > 1 evicts extend + P tokens first, P == 1 evicts extend; `evict=False`: the
    batch's caller evicted for it). None on shortage.
    `before_alloc` (P == 1): called once the KV fits, before the allocation."""
    alloc = sched.token_to_kv_pool_allocator
    P = sched.page_size
    n = end - start
    if n <= 0:
        return torch.empty(0, dtype=I64, device=sched.device)
    if P == 1:
        if evict:
            evict_from_tree_cache(sched.tree_cache, alloc, n)
        if before_alloc is not None and alloc.available_size() >= n:
            before_alloc()
        out = alloc.alloc(n)
        if out is not None:
            _mark_fresh(sched, out)
        return out
    if evict:
        evict_from_tree_cache(sched.tree_cache, alloc, n + P)
    last_loc = int(sched.req_to_token_pool.req_to_token[row, start - 1].item()) if start > 0 else -1
    dev = sched.device
    out = alloc.alloc_extend(torch.tensor([start], dtype=I64, device=dev),
                             torch.tensor([end], dtype=I64, device=dev),
                             torch.tensor([last_loc], dtype=I64, device=dev), n)
    if out is not None:
        _mark_fresh(sched, out[max(0, ceil_align(start, P) - start):])
    return out


def _mark_fresh(sched, new_loc: torch.Tensor) -> None:
    """Pages just taken from the free list hold no valid KV yet (forget stale tokens)."""
    if new_loc.numel() == 0:
        return
    P = sched.page_size
    pages = torch.unique(new_loc.to(I64) // P)
    idx = (pages[:, None] * P + torch.arange(P, dtype=I64, device=new_loc.device)).reshape(-1)
    sched.kv_buffer.token_of[idx] = -1


def alloc_for_extend(sched, req: Req, prefix_len: int, end: int, before_alloc=None,
                     evict: bool = True) -> bool:
    """Row (kept when held), then KV for [prefix_len, end); write_cache_indices; the
    forward writes the KV of fill_ids[prefix_len:end]; committed = allocated = end.
    False when KV is short after eviction (the row, if newly taken, is returned)."""
    pool = sched.req_to_token_pool
    had_row = req.req_pool_idx is not None
    if pool.alloc([req]) is None:
        raise RuntimeError(f"req {req.rid}: no row in req_to_token_pool")
    row = req.req_pool_idx
    out = alloc_token_range(sched, row, prefix_len, end, before_alloc, evict)
    if out is None:
        if not had_row:
            pool.free_slots.insert(0, row)
            req.req_pool_idx = None
        return False
    if prefix_len > 0 and req.prefix_indices is not None:
        pool.write(row, 0, req.prefix_indices[:prefix_len])
    pool.write(row, prefix_len, out)
    sched.kv_buffer.set_kv_buffer(out, req.fill_ids[prefix_len:end])
    req.kv_committed_len = end
    req.kv_allocated_len = end
    req.extend_end = end
    return True


def decode_needs_alloc(sched, req: Req) -> bool:
    return req.kv_committed_len >= req.kv_allocated_len


def check_decode_mem(sched, req: Req) -> bool:
    """Tokens the next decode step needs (P if a new page starts), after eviction."""
    P = sched.page_size
    needed = P if (decode_needs_alloc(sched, req) and req.kv_committed_len % P == 0) else 0
    evict_from_tree_cache(sched.tree_cache, sched.token_to_kv_pool_allocator, needed)
    return sched.token_to_kv_pool_allocator.available_size() >= needed


def alloc_for_decode(sched, req: Req, evict: bool = True) -> Optional[int]:
    """One KV index for row position committed (a new page iff committed % P == 0);
    written into the row (`evict=False`: the batch's caller evicted for it). None on
    shortage (nothing changes)."""
    alloc = sched.token_to_kv_pool_allocator
    P = sched.page_size
    pos = req.kv_committed_len
    row = req.req_pool_idx
    if evict:
        evict_from_tree_cache(sched.tree_cache, alloc, P)
    if P == 1:
        out = alloc.alloc(1)
    else:
        last_loc = int(sched.req_to_token_pool.req_to_token[row, pos - 1].item()) if pos > 0 else -1
        dev = sched.device
        out = alloc.alloc_decode(torch.tensor([pos + 1], dtype=I64, device=dev),
                                 torch.tensor([last_loc], dtype=I64, device=dev))
    if out is None:
        return None
    if pos % P == 0:
        _mark_fresh(sched, out)
    sched.req_to_token_pool.write(row, pos, out)
    return int(out[0].item())


def release_kv_cache(sched, req: Req, is_insert: bool = True, retract: bool = False) -> None:
    """tree_cache.cache_finished_req, then (if the request still holds its row) the
    overallocation free from ceil_align(committed) and the row."""
    if sched.era == "borrow" and req.finished_len is not None and \
            not (req.session is not None and req.session.streaming):
        # 0.5.22+ owned_kv_len: KV past the finished output is not keyed, it is freed
        # with the overallocation
        req.kv_committed_len = min(req.kv_committed_len, max(
            req.cache_protected_len, len(req.origin_input_ids) + req.finished_len))
    sched.tree_cache.cache_finished_req(req, is_insert=is_insert, retract=retract)
    if req.req_pool_idx is None:
        return
    start_p, end_p = req.pop_overallocated_kv_cache()
    if "overalloc_free_from_committed" not in faults.ACTIVE:
        start_p = ceil_align(start_p, sched.page_size)
    if start_p < end_p and sched.era == "borrow":       # _release_overallocated_kv_indices
        free_kv_row(sched.req_to_token_pool, sched.token_to_kv_pool_allocator,
                    req.req_pool_idx, [(start_p, end_p)], kv=req)
    elif start_p < end_p:
        sched.token_to_kv_pool_allocator.free(
            sched.req_to_token_pool.req_to_token[req.req_pool_idx, start_p:end_p])
    if getattr(req, "mamba_pool_idx", None) is not None:
        sched.req_to_token_pool.free_mamba_cache(req)   # the tree keeps no Mamba state
    sched.req_to_token_pool.free(req)
    req.lock_held = False


def release_req(sched, req: Req) -> None:
    """Retract: release_kv_cache(is_insert=False) then reset_for_retract."""
    release_kv_cache(sched, req, is_insert=False, retract=True)
    req.reset_for_retract()
