"""Sliding-window (SWA) hybrid KV memory (upstream mem_cache/allocator/swa.py,
mem_cache/common.py `free_swa_out_of_window_slots`): the paired allocator, and what a
request's window frees from it.

`SWATokenToKVPoolAllocator` pairs a full-attention allocator with an SWA allocator of
its own size; `full_to_swa_index_mapping[full index]` is the SWA index (0 = none; the
extra last entry maps -1 to -1 for `alloc_extend`'s first `last_loc`). `free` releases
both sides, `free_swa` only the SWA side.
"""
from __future__ import annotations

from typing import Optional

import torch

from kvcheck.impl import faults
from kvcheck.impl.allocator import make_allocator

I64 = torch.int64


class SWATokenToKVPoolAllocator:
    def __init__(self, num_pages: int, swa_num_pages: int, page_size: int, device=None,
                 need_sort: bool = True, debug_mode=None):
        self.page_size = page_size
        self.full_attn_allocator = make_allocator(num_pages, page_size, device, need_sort, debug_mode)
        self.swa_attn_allocator = make_allocator(swa_num_pages, page_size, device, need_sort, debug_mode)
        self.device = self.full_attn_allocator.device
        self.size = num_pages * page_size
        self.full_to_swa_index_mapping = torch.cat([
            torch.zeros((num_pages + 1) * page_size, dtype=I64, device=self.device),
            torch.tensor([-1], dtype=I64, device=self.device)])

    # -- sizes -------------------------------------------------------------------------
    def available_size(self) -> int:
        return min(self.full_attn_allocator.available_size(), self.swa_attn_allocator.available_size())

    def full_available_size(self) -> int:
        return self.full_attn_allocator.available_size()

    def swa_available_size(self) -> int:
        return self.swa_attn_allocator.available_size()

    def get_all_free_pages(self) -> torch.Tensor:
        return self.full_attn_allocator.get_all_free_pages()

    def new_pages_available(self, num_full_pages: int, num_swa_pages: int) -> bool:
        P = self.page_size
        return (num_full_pages <= self.full_attn_allocator.available_size() // P
                and num_swa_pages <= self.swa_attn_allocator.available_size() // P)

    def translate_loc_from_full_to_swa(self, kv_indices: torch.Tensor) -> torch.Tensor:
        return self.full_to_swa_index_mapping[kv_indices.to(I64)]

    def set_full_to_swa_mapping(self, full_indices: torch.Tensor, swa_indices: torch.Tensor) -> None:
        if full_indices.numel():
            self.full_to_swa_index_mapping[full_indices.to(I64)] = swa_indices.to(I64)

    # -- alloc -------------------------------------------------------------------------
    def alloc(self, need_size: int) -> Optional[torch.Tensor]:
        """P == 1."""
        if not self.new_pages_available(need_size, need_size):
            return None
        full = self.full_attn_allocator.alloc(need_size)
        self.set_full_to_swa_mapping(full, self.swa_attn_allocator.alloc(need_size))
        return full

    def alloc_extend(self, prefix_lens: torch.Tensor, seq_lens: torch.Tensor,
                     last_loc: torch.Tensor, extend_num_tokens: int) -> Optional[torch.Tensor]:
        """P > 1: both sides continue their partial page (the SWA side from
        `translate_loc_from_full_to_swa(last_loc)`), then take new pages."""
        P = self.page_size
        new_pages = int(((seq_lens.to(I64) + P - 1) // P - (prefix_lens.to(I64) + P - 1) // P).sum())
        if not self.new_pages_available(new_pages, new_pages):
            return None
        swa_last_loc = self.translate_loc_from_full_to_swa(last_loc)
        full = self.full_attn_allocator.alloc_extend(prefix_lens, seq_lens, last_loc, extend_num_tokens)
        swa = self.swa_attn_allocator.alloc_extend(prefix_lens, seq_lens, swa_last_loc, extend_num_tokens)
        self.set_full_to_swa_mapping(full, swa)
        return full

    def alloc_decode(self, seq_lens: torch.Tensor, last_loc: torch.Tensor) -> Optional[torch.Tensor]:
        swa_last_loc = self.translate_loc_from_full_to_swa(last_loc)
        n = int((seq_lens.to(I64) % self.page_size == 1 % self.page_size).sum())
        if not self.new_pages_available(n, n):
            return None
        full = self.full_attn_allocator.alloc_decode(seq_lens, last_loc)
        swa = self.swa_attn_allocator.alloc_decode(seq_lens, swa_last_loc)
        self.set_full_to_swa_mapping(full, swa)
        return full

    # -- free --------------------------------------------------------------------------
    def free(self, free_index: torch.Tensor) -> None:
        """Not idempotent on the full side; the SWA side is (the mapping is zeroed)."""
        if free_index.numel() == 0:
            return
        self.full_attn_allocator.free(free_index)
        if "swa_free_skips_swa" not in faults.ACTIVE:
            self.free_swa(free_index)

    def free_swa(self, free_index: torch.Tensor) -> None:
        if free_index.numel() == 0:
            return
        P = self.page_size
        idx = free_index.to(I64)
        if P > 1:       # _expand_to_full_pages
            pages = torch.unique(idx // P)
            idx = (pages[:, None] * P + torch.arange(P, dtype=I64, device=idx.device)).reshape(-1)
        swa = self.full_to_swa_index_mapping[idx]
        self.swa_attn_allocator.free(swa[swa > 0])
        if "swa_mapping_kept" not in faults.ACTIVE:
            self.full_to_swa_index_mapping[idx] = 0

    # -- segment frees (0.5.22+, `free_kv_row` -> `free_kv_row_segments`) -------------
    def free_swa_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        assert start_pos % self.page_size == 0, f"segment start {start_pos} is not page-aligned"
        self.free_swa(free_index)

    def free_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        """Both sides, SWA first (it reads the mapping), as `free`."""
        if free_index.numel() == 0:
            return
        self.free_swa_segment(free_index, start_pos=start_pos)
        self.full_attn_allocator.free_segment(free_index, start_pos=start_pos)

    def free_segments(self, segments) -> None:
        """Both sides, SWA first (it reads the mapping)."""
        for free_index, start_pos in segments:
            self.free_swa_segment(free_index, start_pos=start_pos)
        self.full_attn_allocator.free_segments(segments)

    def free_full_segments(self, segments) -> None:
        """The full side alone, for row positions whose SWA KV the window already freed;
        upstream `expect`s their mapping 0 (`swa.peer_released`)."""
        for free_index, _ in segments:
            assert bool((self.full_to_swa_index_mapping[free_index.to(I64)] == 0).all()), \
                "free_full_segment: SWA peer not released (caller wants free_segment)"
        self.full_attn_allocator.free_segments(segments)

    def swa_page_of(self, page: int) -> int:
        """The SWA page mapped from full page `page` (0: none), read at its first index."""
        return int(self.full_to_swa_index_mapping[page * self.page_size].item()) // self.page_size

    def free_group_begin(self) -> None:
        self.full_attn_allocator.free_group_begin()

    def free_group_end(self) -> None:
        self.full_attn_allocator.free_group_end()


def swa_eviction_due(req, sliding_window_size: int, eviction_interval: int,
                     pre_len: Optional[int] = None) -> bool:
    """Borrow era (0.5.23 `ScheduleBatch._swa_eviction_trigger`, and the same test in
    `free_swa_out_of_window_slots`): `eviction_interval` tokens have slid out of the window
    past the cursor (pre_len: `req.seqlen - 1` unless given)."""
    pre_len = req.seqlen - 1 if pre_len is None else pre_len
    return pre_len - sliding_window_size >= req.swa_evicted_seqlen + eviction_interval


def set_swa_evict_floor(sched, req) -> None:
    """0.5.23 `Scheduler.get_new_batch_prefill`, after `prepare_for_extend`: under
    `model_runner.prefill_aware_swa`, `req.kv.swa_evict_floor = req.extend_end`."""
    if sched.prefill_aware_swa:
        req.swa_evict_floor = req.extend_end


def swa_dead_lo(req, page_size: int) -> int:
    """Borrow era `ReqKvInfo.swa_dead_lo`: max(cache_protected_len, swa_evict_floor),
    page-aligned upward when above the protected prefix (the floor is 0 unless
    `prefill_aware_swa`: `set_swa_evict_floor`)."""
    if "swa_dead_lo_ignores_floor" in faults.ACTIVE:
        return req.cache_protected_len
    lo = max(req.cache_protected_len, req.swa_evict_floor)
    if page_size > 1 and lo > req.cache_protected_len:
        lo = -(-lo // page_size) * page_size
    return lo


def free_swa_out_of_window_slots(req, pre_len: int, *, sliding_window_size: int, page_size: int,
                                 req_to_token_pool, token_to_kv_pool_allocator,
                                 era: str = "wrapper") -> None:
    """Radix cache: free the SWA KV of `[swa_evicted_seqlen, new)` where `new =
    max(cursor, pre_len - keep)`, page-floored; never below cache_protected_len. 0.5.15
    keeps `max(window, P)`; 0.5.23 keeps `ceil_align(max(window, P), P)` and starts at
    `swa_dead_lo` (the caller checked `swa_eviction_due`)."""
    assert req.cache_protected_len % page_size == 0, "cache_protected_len must be page aligned"
    if era == "borrow":
        lo = 0 if "swa_dead_lo_zero" in faults.ACTIVE else swa_dead_lo(req, page_size)
        req.swa_evicted_seqlen = max(req.swa_evicted_seqlen, lo)
    else:
        req.swa_evicted_seqlen = max(req.swa_evicted_seqlen, req.cache_protected_len)
    margin = sliding_window_size if "swa_window_no_page_margin" in faults.ACTIVE else \
        max(sliding_window_size, page_size)
    if era == "borrow" and "swa_keep_not_ceil_aligned" not in faults.ACTIVE:
        margin = -(-margin // page_size) * page_size
    new = max(req.swa_evicted_seqlen, pre_len - margin)
    if page_size > 1:
        new = (new // page_size) * page_size
    if new > req.swa_evicted_seqlen:
        token_to_kv_pool_allocator.free_swa(
            req_to_token_pool.req_to_token[req.req_pool_idx, req.swa_evicted_seqlen:new])
        req.swa_evicted_seqlen = new


def free_kv_row_segments(allocator, segments, *, swa_evicted_seqlen: int, swa_dead_lo: int = 0) -> None:
    """Borrow era (0.5.23 `mem_cache/common.py`): ascending disjoint `(kv_indices,
    start_pos)` segments of one row; `[swa_dead_lo, swa_evicted_seqlen)` goes back
    full-side only, the rest through `free_segments`; the cursor must be page-aligned
    when a row has both parts."""
    dead_lo, dead_hi = swa_dead_lo, max(swa_evicted_seqlen, swa_dead_lo)
    if "swa_dead_range_past_cursor" in faults.ACTIVE:
        dead_hi += allocator.page_size
    dead, alive = [], []
    for kv, start in segments:
        end = start + kv.numel()
        lo, hi = min(max(dead_lo, start), end), min(max(dead_hi, start), end)
        if hi <= lo:
            alive.append((kv, start))
            continue
        dead.append((kv[lo - start:hi - start], lo))
        if lo > start:
            alive.append((kv[:lo - start], start))
        if end > hi:
            alive.append((kv[hi - start:], hi))
    if dead and alive:
        assert swa_evicted_seqlen % allocator.page_size == 0, (
            f"SWA eviction cursor {swa_evicted_seqlen} splits a page (page_size {allocator.page_size})")
    if dead:
        allocator.free_full_segments(dead)
    if alive:
        allocator.free_segments(alive)
