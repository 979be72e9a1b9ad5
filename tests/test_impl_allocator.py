"""impl/ allocators and request pool: exact page and index numbers, P = 1 and P = 4."""
import pytest
import torch

from kvcheck.impl.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator, make_allocator
from kvcheck.impl.device import resolve_device
from kvcheck.impl.memory_pool import ReqToTokenPool

DEV = resolve_device()


def t(*xs):
    return torch.tensor(xs, dtype=torch.int64, device=DEV)


def L(x):
    return x.tolist()


def fresh(a, n):
    """n tokens on fresh pages: `alloc` at P == 1, a row's first extend at P > 1 (the
    paged allocator has no `alloc`, as no modelled upstream path calls it)."""
    return a.alloc(n) if a.page_size == 1 else a.alloc_extend(t(0), t(n), t(-1), n)


def test_device_resolution(monkeypatch):
    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setenv("KVCHECK_DEVICE", "cpu")
    assert resolve_device() == torch.device("cpu")
    assert make_allocator(4, 4, device="cpu").free_pages.device == torch.device("cpu")


def test_token_allocator_clear_alloc_free():
    a = TokenToKVPoolAllocator(8, DEV, need_sort=False)
    assert L(a.free_pages) == [1, 2, 3, 4, 5, 6, 7, 8]          # token 0 reserved
    assert L(a.alloc(3)) == [1, 2, 3]
    assert a.available_size() == 5
    assert a.alloc(6) is None and a.available_size() == 5       # shortage changes nothing
    a.free(t(2, 2, 3))                                           # one call dedups
    assert sorted(L(a.free_pages)) == [2, 3, 4, 5, 6, 7, 8]
    a.free(t(2))                                                 # second call: double free
    assert L(a.get_all_free_pages()).count(2) == 2


def test_paged_extend_from_zero_takes_whole_pages():
    a = PagedTokenToKVPoolAllocator(16, 4, DEV, need_sort=False)
    assert L(a.free_pages) == [1, 2, 3, 4]                       # page 0 reserved
    assert not hasattr(a, "alloc")
    assert L(fresh(a, 8)) == [4, 5, 6, 7, 8, 9, 10, 11]
    assert a.available_size() == 8
    a.free(t(4, 5, 9))                                           # pages 1 and 2, whole
    assert L(a.free_pages) == [1, 2, 3, 4]


def test_alloc_extend_continues_partial_page_then_new_pages():
    a = PagedTokenToKVPoolAllocator(32, 4, DEV, need_sort=False)
    out = a.alloc_extend(t(0), t(10), t(-1), 10)                 # 3 pages: 1, 2, 3
    assert L(out) == [4, 5, 6, 7, 8, 9, 10, 11, 12, 13]
    assert L(a.free_pages) == [4, 5, 6, 7, 8]
    out = a.alloc_extend(t(10), t(18), t(13), 8)                 # 14, 15 in page 3, then 4, 5
    assert L(out) == [14, 15, 16, 17, 18, 19, 20, 21]
    assert L(a.free_pages) == [6, 7, 8]


def test_alloc_extend_batch_and_exact_page_boundaries():
    a = PagedTokenToKVPoolAllocator(40, 4, DEV, need_sort=False)
    # req0: 3 -> 4 fills its partial page only (no new page); req1: 4 -> 9 takes 2 pages
    out = a.alloc_extend(t(3, 4), t(4, 9), t(22, 31), 6)
    assert L(out) == [23, 4, 5, 6, 7, 8]
    assert L(a.free_pages) == [3, 4, 5, 6, 7, 8, 9, 10]


def test_alloc_extend_shortage_changes_nothing():
    a = PagedTokenToKVPoolAllocator(8, 4, DEV, need_sort=False)
    assert a.alloc_extend(t(0), t(9), t(-1), 9) is None          # needs 3 pages, 2 free
    assert L(a.free_pages) == [1, 2]


def test_alloc_decode_new_page_iff_first_of_page():
    a = PagedTokenToKVPoolAllocator(16, 4, DEV, need_sort=False)
    # seq 9 (position 8 = first of a page) -> new page 1; seq 10 -> last_loc + 1
    out = a.alloc_decode(t(9, 10, 4), t(35, 36, 58))
    assert L(out) == [4, 37, 59]
    assert L(a.free_pages) == [2, 3, 4]


def test_need_sort_release_pages_and_merge():
    a = PagedTokenToKVPoolAllocator(12, 4, DEV, need_sort=True)
    x = fresh(a, 12)
    assert L(x) == list(range(4, 16)) and a.available_size() == 0
    a.free(t(13, 4))                                             # pages 3 and 1, parked
    assert L(a.release_pages) == [1, 3] and len(a.free_pages) == 0
    assert a.available_size() == 8
    assert L(fresh(a, 4)) == [4, 5, 6, 7]                        # merge_and_sort_free
    assert L(a.free_pages) == [3] and len(a.release_pages) == 0


def test_free_group_dedups_across_the_group():
    a = TokenToKVPoolAllocator(8, DEV, need_sort=False)
    a.alloc(8)
    a.free_group_begin()
    a.free(t(3))
    a.free(t(3, 4))
    assert len(a.free_pages) == 0
    a.free_group_end()
    assert sorted(L(a.free_pages)) == [3, 4]


def test_free_segments_boundary_page_once():
    a = PagedTokenToKVPoolAllocator(16, 4, DEV, need_sort=False)
    row = fresh(a, 12)                                           # pages 1, 2, 3: indices 4..15
    a.free_segments([(row[0:6], 0), (row[6:12], 6)])             # second starts in page 2
    assert sorted(L(a.free_pages)) == [1, 2, 3, 4]
    with pytest.raises(AssertionError):
        a.free_segment(row[1:4], start_pos=1)


def test_debug_mode_asserts_no_duplicate():
    a = PagedTokenToKVPoolAllocator(8, 4, DEV, need_sort=True, debug_mode=True)
    x = fresh(a, 8)
    a.free(x[:4])
    with pytest.raises(AssertionError, match="double free"):
        a.free(x[:1])


def test_page_zero_never_handed_out():
    for P in (1, 4):
        a = make_allocator(5, P, DEV)
        got = fresh(a, 5 * P)
        assert 0 not in L(got // P) and fresh(a, P) is None


class _R:
    def __init__(self, rid, row=None, chunks=0, committed=0):
        self.rid, self.req_pool_idx = rid, row
        self.inflight_middle_chunks, self.kv_committed_len = chunks, committed


def test_req_to_token_pool_alloc_keeps_row_and_checks_legality():
    pool = ReqToTokenPool(3, 16, DEV)
    assert pool.req_to_token.dtype == torch.int32 and tuple(pool.req_to_token.shape) == (3, 16)
    a, b = _R(1), _R(2)
    assert pool.alloc([a, b]) == [0, 1] and pool.free_slots == [2]
    a.kv_committed_len = 5
    assert pool.alloc([a]) == [0] and pool.free_slots == [2]     # restored: keeps its row
    with pytest.raises(AssertionError):
        pool.alloc([_R(3, row=1)])                               # neither chunked nor committed
    assert pool.alloc([_R(4), _R(5)]) is None and pool.free_slots == [2]
    pool.free(b)
    assert pool.free_slots == [2, 1] and b.req_pool_idx is None
