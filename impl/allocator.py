"""Token-to-KV pool allocators (upstream mem_cache/allocator/{base,token,paged}.py).

`free_pages` holds page ids (token ids when P == 1); page 0 is reserved and never handed
out. `free` frees whole pages, `unique(index // P)`: duplicates are removed within one
call only, so two calls that touch one page free it twice (visible as a duplicate in
the free lists; debug mode asserts against it).
"""
from __future__ import annotations

import os
from typing import Optional, Sequence

import torch

from kvcheck.impl import faults
from kvcheck.impl.device import resolve_device

I64 = torch.int64


def _debug_default() -> bool:
    return os.environ.get("SGLANG_DEBUG_MEMORY_POOL", "") not in ("", "0", "false", "False")


class BaseTokenToKVPoolAllocator:
    def __init__(self, size: int, page_size: int, device=None, need_sort: bool = True,
                 debug_mode: Optional[bool] = None):
        self.size = size                      # tokens
        self.page_size = page_size
        self.num_pages = size // page_size
        self.device = resolve_device(device)
        self.need_sort = need_sort
        self.debug_mode = _debug_default() if debug_mode is None else debug_mode
        self.free_pages: torch.Tensor = torch.empty(0, dtype=I64, device=self.device)
        self.release_pages: torch.Tensor = torch.empty(0, dtype=I64, device=self.device)
        self.free_group: Optional[list] = None
        self.clear()

    # -- state ---------------------------------------------------------------
    def clear(self) -> None:
        first = 0 if "free_list_has_page_0" in faults.ACTIVE else 1
        self.free_pages = torch.arange(first, self.num_pages + first, dtype=I64, device=self.device)
        self.release_pages = torch.empty(0, dtype=I64, device=self.device)
        self.free_group = None

    def available_size(self) -> int:
        # shape[0] is len() without Tensor.__len__'s Python wrapper (called every step)
        return (self.free_pages.shape[0] + self.release_pages.shape[0]) * self.page_size

    def get_all_free_pages(self) -> torch.Tensor:
        if len(self.release_pages) == 0:
            return self.free_pages
        return torch.cat((self.free_pages, self.release_pages))

    def merge_and_sort_free(self) -> None:
        if len(self.release_pages) > 0:
            self.free_pages, _ = torch.sort(torch.cat((self.free_pages, self.release_pages)))
            self.release_pages = torch.empty(0, dtype=I64, device=self.device)

    # -- groups ----------------------------------------------------------------
    def free_group_begin(self) -> None:
        assert self.free_group is None, "free groups cannot be nested"
        self.free_group = []

    def free_group_end(self) -> None:
        pending, self.free_group = self.free_group, None
        if pending:
            self.free(torch.cat(pending))

    # -- free ----------------------------------------------------------------------
    def _pages_of(self, free_index: torch.Tensor) -> torch.Tensor:
        pages = free_index.to(I64) // self.page_size
        if "free_no_page_dedup" in faults.ACTIVE:
            return pages
        return torch.unique(pages)

    def free(self, free_index: torch.Tensor) -> None:
        if free_index.numel() == 0:
            return
        if self.free_group is not None:
            self.free_group.append(free_index.clone())
            return
        self._release(self._pages_of(free_index))

    def _release(self, pages: torch.Tensor) -> None:
        if self.need_sort:
            self.release_pages = torch.cat((self.release_pages, pages))
        else:
            self.free_pages = torch.cat((pages, self.free_pages))
        if self.debug_mode:
            self.assert_no_duplicates()

    def free_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        """Free `row[start_pos : start_pos + n]`: page representatives `free_index[::P]`,
        no unique (each page must be freed by exactly one segment)."""
        if free_index.numel() == 0:
            return
        P = self.page_size
        assert start_pos % P == 0, f"free_segment start_pos {start_pos} is not page-aligned (P={P})"
        if self.free_group is not None:
            self.free_group.append(free_index.clone())
            return
        self._release(free_index[::P].to(I64) // P)

    def free_segments(self, segments: Sequence) -> None:
        """Disjoint ascending `(free_index, start_pos)` segments of one row; a boundary page
        shared with the previous segment is emitted once (the later head is trimmed)."""
        P = self.page_size
        prev_end = None
        for free_index, start_pos in segments:
            n = free_index.numel()
            if n == 0:
                continue
            seg_end = start_pos + n
            if prev_end is not None and start_pos // P == (prev_end - 1) // P:
                boundary = (start_pos // P + 1) * P
                free_index = free_index[boundary - start_pos:]
                start_pos = boundary
            assert prev_end is None or free_index.numel() == 0 or start_pos // P > (prev_end - 1) // P
            prev_end = seg_end
            if free_index.numel() > 0:
                self.free_segment(free_index, start_pos=start_pos)

    def assert_no_duplicates(self) -> None:
        allp = self.get_all_free_pages()
        assert len(torch.unique(allp)) == len(allp), "duplicate page ids in the free lists (double free)"

    # -- alloc -----------------------------------------------------------------------
    def _take_pages(self, n: int) -> Optional[torch.Tensor]:
        if self.need_sort and n > len(self.free_pages):
            self.merge_and_sort_free()
        if n > len(self.free_pages):
            return None
        out = self.free_pages[:n]
        self.free_pages = self.free_pages[n:]
        return out


class TokenToKVPoolAllocator(BaseTokenToKVPoolAllocator):
    """P == 1: page ids are token ids."""

    def __init__(self, size: int, device=None, need_sort: bool = True, debug_mode=None):
        super().__init__(size, 1, device, need_sort, debug_mode)

    def alloc(self, need_size: int) -> Optional[torch.Tensor]:
        return self._take_pages(need_size)


class PagedTokenToKVPoolAllocator(BaseTokenToKVPoolAllocator):
    """P > 1: allocation through `alloc_extend` and `alloc_decode` only, as every upstream
    caller on a modelled path does (`alloc_token_slots` calls `alloc` only at P == 1;
    upstream's paged `alloc` serves disaggregation, HiCache and other unmodelled paths)."""

    def alloc_extend(self, prefix_lens: torch.Tensor, seq_lens: torch.Tensor,
                     last_loc: torch.Tensor, extend_num_tokens: int) -> Optional[torch.Tensor]:
        """Positions [prefix, seq) of each request: continue the partial last page
        (`last_loc + 1, ...`), then new pages. Vectorised over requests and tokens."""
        P = self.page_size
        dev = self.device
        prefix_lens = prefix_lens.to(I64)
        seq_lens = seq_lens.to(I64)
        last_loc = last_loc.to(I64)
        if self.debug_mode:
            partial = prefix_lens % P != 0
            assert bool(torch.all(((last_loc + 1) % P == prefix_lens % P) | ~partial)), \
                "alloc_extend: last_loc is not congruent to prefix_lens"
        pages_before = (prefix_lens + P - 1) // P
        new_pages_per_req = (seq_lens + P - 1) // P - pages_before
        num_new_pages = int(new_pages_per_req.sum().item())
        if self.need_sort and num_new_pages > len(self.free_pages):
            self.merge_and_sort_free()
        if num_new_pages > len(self.free_pages):
            return None
        new_pages = self.free_pages[:num_new_pages]
        extend_lens = seq_lens - prefix_lens
        total = int(extend_lens.sum().item())
        assert total == extend_num_tokens, f"extend_num_tokens {extend_num_tokens} != {total}"
        bs = len(prefix_lens)
        req_of = torch.repeat_interleave(torch.arange(bs, device=dev), extend_lens)
        tok_start = torch.cumsum(extend_lens, 0) - extend_lens
        page_start = torch.cumsum(new_pages_per_req, 0) - new_pages_per_req
        pos = prefix_lens[req_of] + torch.arange(total, dtype=I64, device=dev) - tok_start[req_of]
        aligned = pages_before[req_of] * P
        in_partial = pos < aligned
        partial_idx = last_loc[req_of] + 1 + (pos - prefix_lens[req_of])
        page_k = torch.clamp((pos - aligned) // P, min=0) + page_start[req_of]
        page_k = torch.clamp(page_k, max=max(num_new_pages - 1, 0))
        if num_new_pages > 0:
            fresh_idx = new_pages[page_k] * P + pos % P
        else:
            fresh_idx = torch.zeros_like(pos)
        out = torch.where(in_partial, partial_idx, fresh_idx)
        self.free_pages = self.free_pages[num_new_pages:]
        return out

    def alloc_decode(self, seq_lens: torch.Tensor, last_loc: torch.Tensor) -> Optional[torch.Tensor]:
        """One index per request for position seq_len - 1 (seq_lens = lengths after the
        new token): a new page iff seq_len % P == 1, else last_loc + 1."""
        P = self.page_size
        seq_lens = seq_lens.to(I64)
        last_loc = last_loc.to(I64)
        if self.debug_mode:
            assert bool(torch.all((last_loc + 2) % P == seq_lens % P)), \
                "alloc_decode: last_loc is not congruent to seq_lens"
        need_new = (seq_lens % P) == (0 if "decode_new_page_off_by_one" in faults.ACTIVE else 1 % P)
        n = int(need_new.sum().item())
        if self.need_sort and n > len(self.free_pages):
            self.merge_and_sort_free()
        if n > len(self.free_pages):
            return None
        new_pages = self.free_pages[:n]
        rank = torch.cumsum(need_new.to(I64), 0) - 1
        if n > 0:
            fresh = new_pages[torch.clamp(rank, min=0, max=n - 1)] * P
        else:
            fresh = torch.zeros_like(last_loc)
        out = torch.where(need_new, fresh, last_loc + 1)
        self.free_pages = self.free_pages[n:]
        return out


def make_allocator(num_pages: int, page_size: int, device=None, need_sort: bool = True,
                   debug_mode=None) -> BaseTokenToKVPoolAllocator:
    if page_size == 1:
        return TokenToKVPoolAllocator(num_pages, device, need_sort, debug_mode)
    return PagedTokenToKVPoolAllocator(num_pages * page_size, page_size, device, need_sort, debug_mode)
