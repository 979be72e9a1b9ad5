"""impl/ RadixCache: page-aligned keys, split copies lock_ref, lock accounting, LRU order."""
import torch

from kvcheck.impl.allocator import make_allocator
from kvcheck.impl.device import resolve_device
from kvcheck.impl.memory_pool import ReqToTokenPool
from kvcheck.impl.radix_cache import RadixCache

DEV = resolve_device()


def tree(P=4, pages=16):
    alloc = make_allocator(pages, P, DEV, need_sort=False)
    return RadixCache(ReqToTokenPool(2, 64, DEV), alloc, P, DEV), alloc


def idx(*xs):
    return torch.tensor(xs, dtype=torch.int64, device=DEV)


def test_insert_match_page_aligned_and_split_copies_lock_ref():
    rc, _ = tree()
    key = tuple(range(100, 112))
    assert rc.insert(key, torch.arange(4, 16, device=DEV)) == 0
    assert rc.evictable_size() == 12
    v, node = rc.match_prefix(key + (7,))
    assert v.tolist() == list(range(4, 16)) and node.path() == key
    rc.inc_lock_ref(node)
    assert (rc.evictable_size(), rc.protected_size()) == (0, 12)
    # a match that ends inside the node, and an unaligned key (9 -> 8 tokens)
    v, mid = rc.match_prefix(key[:9])
    assert v.tolist() == list(range(4, 12)) and mid.path() == key[:8]
    assert mid.lock_ref == 1 and node.parent is mid and node.lock_ref == 1
    assert (rc.evictable_size(), rc.protected_size()) == (0, 12)
    rc.dec_lock_ref(node)
    assert (mid.lock_ref, node.lock_ref) == (0, 0)
    assert (rc.evictable_size(), rc.protected_size()) == (12, 0)


def test_insert_returns_existing_prefix_and_branches():
    rc, _ = tree()
    a = (1, 2, 3, 4, 5, 6, 7, 8)
    b = (1, 2, 3, 4, 9, 9, 9, 9)
    rc.insert(a, idx(4, 5, 6, 7, 8, 9, 10, 11))
    assert rc.insert(b, idx(20, 21, 22, 23, 24, 25, 26, 27)) == 4
    paths = sorted(n.path() for n in rc.all_nodes())
    assert paths == [(1, 2, 3, 4), a, b]
    assert rc.evictable_size() == 12                           # existing part keeps its value
    v, _ = rc.match_prefix(b)
    assert v.tolist() == [4, 5, 6, 7, 24, 25, 26, 27]


def test_evict_unlocked_leaves_in_tick_then_path_order():
    rc, alloc = tree(P=1, pages=32)
    rc.insert((1, 2), idx(1, 2))          # tick 1
    rc.insert((3, 4), idx(3, 4))          # tick 2
    rc.insert((5,), idx(5))               # tick 3
    rc.match_prefix((1, 2))               # tick 4: (1, 2) is now the most recent
    _, n34 = rc.match_prefix((3, 4))      # tick 5
    rc.inc_lock_ref(n34)
    free_before = len(alloc.get_all_free_pages())
    assert rc.evict(1) == 1               # (5,) is the oldest unlocked leaf
    assert sorted(n.path() for n in rc.all_nodes()) == [(1, 2), (3, 4)]
    assert rc.evict(100) == 2             # (1, 2); (3, 4) is locked
    assert [n.path() for n in rc.all_nodes()] == [(3, 4)]
    assert len(alloc.get_all_free_pages()) == free_before + 3
    assert (rc.evictable_size(), rc.protected_size()) == (0, 2)


def test_evict_pushes_parent_that_becomes_a_leaf_and_ties_break_by_path():
    rc, alloc = tree(P=2, pages=16)
    assert alloc.alloc_extend(idx(0), idx(8), idx(-1), 8).tolist() == list(range(2, 10))  # pages 1..4
    rc.insert((1, 1, 2, 2), idx(2, 3, 4, 5))
    rc.insert((1, 1, 3, 3), idx(2, 3, 6, 7))   # splits: (1,1) parent, two leaves
    # leaves (1,1,2,2) and (1,1,3,3) share the tick of the second insert -> path order
    assert rc.evict(2) == 2
    assert sorted(n.path() for n in rc.all_nodes()) == [(1, 1), (1, 1, 3, 3)]
    assert rc.evict(4) == 4                    # the other leaf, then its parent
    assert rc.all_nodes() == [] and rc.evictable_size() == 0
    assert sorted((alloc.get_all_free_pages()).tolist()) == [1, 2, 3] + list(range(5, 17))
