"""The concrete checks of impl/checks.py fire on a corrupted impl/ state. No sequence of
the vocabulary reaches their finding bodies on a correct impl/ (docs/coverage.md lists
those branches as uncovered); these corruptions show each body is live and names the
right check."""
import pytest
import torch

from kvcheck.impl import checks
from kvcheck.impl.device import resolve_device
from kvcheck.impl.scheduler import Scheduler

P = 4


def running_scheduler():
    """A plain request of 10 tokens, scheduled and decoded once: it holds a row and 3 pages."""
    s = Scheduler(page_size=P, num_pages=16, num_rows=3, max_context_len=64, device=resolve_device())
    assert s.submit_request(1, tuple(range(10, 20)), 4) == "ok"
    assert s.schedule(1) == "ok" and s.decode(1, 7) == "ok"
    return s, s.reqs[1]


def page0_free(s, r):
    alloc = s.token_to_kv_pool_allocator
    alloc.free_pages = torch.cat((alloc.free_pages, torch.tensor([0], dtype=alloc.free_pages.dtype,
                                                                device=alloc.free_pages.device)))


def swap_offsets(s, r):                         # position 0 holds an index at offset 1
    row = s.req_to_token_pool.req_to_token[r.req_pool_idx]
    row[0], row[1] = row[1].clone(), row[0].clone()


def two_pages_in_one_row_page(s, r):            # position 1 from the next page, same offset
    row = s.req_to_token_pool.req_to_token[r.req_pool_idx]
    row[1] = row[5].clone()


def page0_owned(s, r):
    s.req_to_token_pool.req_to_token[r.req_pool_idx, :P] = torch.arange(P, device=s.req_to_token_pool.req_to_token.device)


def held_row_free(s, r):
    s.req_to_token_pool.free_slots.append(r.req_pool_idx)


def free_row_twice(s, r):
    pool = s.req_to_token_pool
    pool.free_slots.append(pool.free_slots[0])


def freed_flags_differ(s, r):
    r.kv_overallocated_freed = True


def protected_unaligned(s, r):
    r.cache_protected_len = 1


CORRUPTIONS = {
    page0_free: ("C4", "reserved page 0 is in the free lists"),
    swap_offsets: ("C3", "(mod 4)"),
    two_pages_in_one_row_page: ("C3", "row-page 0 maps to pages"),
    page0_owned: ("C4", "reserved page 0 is owned by req 1"),
    held_row_free: ("C5", "is in free_slots and held by req 1"),
    free_row_twice: ("C5", "appears 2 times in free_slots"),
}
POOL_CORRUPTIONS = {
    freed_flags_differ: ("L1", "busy freed flags"),
    protected_unaligned: ("L1", "busy protected alignment"),
}


def test_the_uncorrupted_state_has_no_findings():
    s, _ = running_scheduler()
    assert checks.concrete_findings(s) == [] and checks.check_pool_invariant(s) == []


@pytest.mark.parametrize("corrupt", list(CORRUPTIONS), ids=lambda f: f.__name__)
def test_a_corruption_fires_its_concrete_check(corrupt):
    s, r = running_scheduler()
    corrupt(s, r)
    cid, text = CORRUPTIONS[corrupt]
    assert any(f.id == cid and text in f.message for f in checks.concrete_findings(s)), \
        checks.concrete_findings(s)


@pytest.mark.parametrize("corrupt", list(POOL_CORRUPTIONS), ids=lambda f: f.__name__)
def test_a_corruption_fires_the_pool_invariant(corrupt):
    s, r = running_scheduler()
    corrupt(s, r)
    cid, name = POOL_CORRUPTIONS[corrupt]
    assert any(f.id == cid and f.name == name for f in checks.check_pool_invariant(s)), \
        checks.check_pool_invariant(s)
