"""The KV pool's allocator (TokenToKVPoolAllocator / PagedTokenToKVPoolAllocator) and the
request rows (ReqToTokenPool): free pages, their contents, and the row ranges freed.
"""
from __future__ import annotations

import bisect

from kvcheck.spec import swa_pool
from kvcheck.spec.pages import row_pages
from kvcheck.spec.state import State
from kvcheck.spec.violations import ModelError


REUSED_ROW_014 = "reusing request must be chunked or have committed KV"
"""`ReqToTokenPool.alloc`'s assertion on a reused row, 0.5.14-0.5.18 (`inflight_middle_chunks
> 0 or kv_committed_len > 0`)."""
NO_ROW = "alloc_req_slots runs out of memory"
"""`alloc_for_extend`'s error when `ReqToTokenPool.alloc` finds too few free rows (every
release)."""
REUSED_ROW_019 = "a reused row must carry allocated KV"
"""The same assertion from 0.5.19 on (`kv.kv_allocated_len > 0`; a reused row is a
session slot's or a chunked request's, whose allocated and committed lengths are both 0 or
both not)."""


def available_size(s: State) -> int:
    return swa_pool.available_size(s, len(s.free_pages) * s.cfg.page_size)


def _alloc_pages(s: State, n: int):
    """`alloc`: the n lowest free pages, or None (nothing changes) on shortage."""
    if n > len(s.free_pages) or not swa_pool.swa_can_alloc(s, n):
        return None
    taken, s.free_pages = s.free_pages[:n], s.free_pages[n:]
    swa_pool.map_swa_pages(s, taken)
    for p in taken:
        s.content[p] = (None,) * s.cfg.page_size
    return taken


def _free_pages(s: State, pages, full_only=()) -> None:
    """`free`: unique pages of one call return to the free list (a second call on the
    same page frees it again: the multiset shows it). `full_only`: pages whose SWA side
    is not freed (0.5.23 `free_full_segments`)."""
    if any(p is None for p in pages):
        raise ModelError("free of a row position that holds no KV index")
    for p in sorted(set(pages)):
        bisect.insort(s.free_pages, p)
        s.content.pop(p, None)
    swa_pool.free_swa(s, [p for p in pages if p not in full_only])


def _free_row_range(s: State, row: int, start: int, end: int, holder=None) -> None:
    """`free(req_to_token[row, start:end])`: frees every page the range touches. With the
    record `holder` (borrow era `free_kv_row`): its SWA-dead pages go back full-side only."""
    r = s.rows[row]
    dead = swa_pool.swa_dead_pages(s, holder, start, end) if holder is not None else ()
    _free_pages(s, [r[k] for k in row_pages(start, end, s.cfg.page_size)],
                full_only={r[k] for k in dead})


def _write_kv(s: State, row: int, start: int, end: int, tokens: tuple) -> None:
    """The forward writes the KV of tokens[i] at row position i, for i in [start, end)."""
    P = s.cfg.page_size
    r = s.rows[row]
    for i in range(start, end):
        p = r[i // P]
        c = list(s.content[p])
        c[i % P] = tokens[i] if i < len(tokens) else -1   # arrays rewritten under it
        s.content[p] = tuple(c)
