"""The radix tree (RadixCache): match, insert and split, the lock references, and eviction
(full, SWA and Mamba), with the Mamba component's insert and state slots.
"""
from __future__ import annotations

from typing import Optional

from kvcheck.spec import mamba_tree, swa_pool, swa_tree
from kvcheck.spec.allocator import _free_pages
from kvcheck.spec.pages import floor_align
from kvcheck.spec.state import ROOT, Node, State
from kvcheck.spec.violations import ModelError


def node_path(s: State, nid: int) -> tuple:
    """The node's full key from the root: its identity across splits."""
    return dict.__getitem__(s.nodes, nid).path     # kept on the node (a read: no copy)


def _page_key(s: State, key: tuple, i: int) -> tuple:
    P = s.cfg.page_size
    return key[i:i + P]


def _match_len(s: State, a: tuple, b: tuple) -> int:
    """`_key_match_paged`: length of the common prefix, in whole pages."""
    P = s.cfg.page_size
    n = 0
    while n + P <= min(len(a), len(b)) and a[n:n + P] == b[n:n + P]:
        n += P
    return n


def _split_node(s: State, child_id: int, split: int) -> int:
    """`_split_node`: a new parent takes child.key[:split]; it copies child.lock_ref."""
    P = s.cfg.page_size
    child = s.nodes[child_id]
    new = Node(s.next_node_id, child.key[:split], child.pages[:split // P], child.parent,
               {}, child.lock_ref, _creation_tick(s),
               path=child.path[:len(child.path) - len(child.key) + split])
    s.next_node_id += 1
    s.nodes[new.id] = new
    parent = s.nodes[child.parent]
    parent.children[_page_key(s, child.key, 0)] = new.id
    child.key = child.key[split:]
    child.pages = child.pages[split // P:]
    child.parent = new.id
    new.children[_page_key(s, child.key, 0)] = child_id
    swa_tree.move_swa_uuid(s, child_id, new.id)
    new.swa_tick = child.swa_tick       # 0.5.23: `lru.insert_after(child, new_node)`
    if mamba_tree.on(s):
        mamba_tree.split(new)
        mamba_tree.walk_touch(s, child)
    if swa_pool.swa_on(s) or mamba_tree.on(s):
        # SWARadixCache, and 0.5.23's `_split_node` with an SWA or a Mamba component (whose
        # match stamps only the node it ends on): the lower half is re-stamped, after the upper
        child.tick = _creation_tick(s)
    return new.id


def _creation_tick(s: State) -> int:
    """The tick of a node created by a walk (a split's upper half, a new leaf): newer than
    every node the walk stamped, in creation order. 0.5.15: `TreeNode()` reads
    `time.monotonic()` after the walk's `access_time` (S4). 0.5.23: `UnifiedTreeNode()`
    takes `get_and_increase_time_counter()` after the walk's touches, and `_split_node`
    re-stamps the lower half after creating the upper one, so an insert that splits a
    node and adds a leaf orders them lower half < new leaf, as here (S7)."""
    s.tick += 1
    return s.tick


def _walk(s: State, key: tuple, stamp: bool = True) -> tuple[int, int, list]:
    """The walk `match_prefix` and `insert` share: one access tick for the call, every
    node on the path stamped with it (before a split too, so the lower half carries it), a
    node the key ends inside split (the new upper half: `_creation_tick`). Returns (last
    node id, matched length, its pages)."""
    s.tick += 1
    access = s.tick
    touch_states = stamp and mamba_tree.wrapper_rules(s)
    nid, pages, i = ROOT, [], 0
    while i < len(key):
        # a read (the root is never stamped: a walk that matches nothing copies no node)
        cid = dict.__getitem__(s.nodes, nid).children.get(_page_key(s, key, i))
        if cid is None:
            break
        child = s.nodes[cid]
        if stamp:
            child.tick = access
        if touch_states:
            mamba_tree.walk_touch(s, child)
        m = _match_len(s, child.key, key[i:])
        if m < len(child.key):
            cid = _split_node(s, cid, m)
            child = s.nodes[cid]
        pages.extend(child.pages)
        i += m
        nid = cid
    return nid, i, pages


def match_prefix(s: State, key: tuple, stamp: bool = True) -> tuple[int, list]:
    """`RadixCache.match_prefix`: page-aligned key; splits a node the match ends inside;
    returns (last node id, matched page ids). Takes no lock. `stamp=False`: the walk
    splits but touches no access time. A disabled tree matches nothing (`_match_tree`:
    `empty_match_result`)."""
    if s.cfg.disable_radix_cache:
        return ROOT, []
    nid, _, pages = _walk(s, key[:floor_align(len(key), s.cfg.page_size)], stamp)
    return nid, pages


def insert(s: State, key: tuple, pages: list, swa_evicted_seqlen: int = 0,
           prev_prefix_len: int = 0) -> int:
    """`RadixCache.insert`: returns how much already existed; the new suffix becomes a
    fresh leaf (evictable). The caller frees its duplicates of the existing part. Under
    SWA (wrapper era) the suffix's part below `swa_evicted_seqlen` is a node of its own
    (`swa_tree.swa_tombstone_cut`)."""
    P = s.cfg.page_size
    nid, i, _ = _walk(s, key)
    if swa_pool.swa_on(s):
        _recover_tombstones(s, key, pages, i, prev_prefix_len, swa_evicted_seqlen)
    cut = swa_tree.swa_tombstone_cut(s, i, len(key), swa_evicted_seqlen)
    if i < cut == len(key):
        _free_pages(s, pages[i // P:len(key) // P])     # no all-tombstone leaf
        return i
    for lo, hi in ((i, cut), (cut, len(key))):
        if lo < hi:
            nid = _add_node(s, nid, key[:hi], lo, tuple(pages[lo // P:hi // P]))
    if i < len(key):
        _commit_swa_leaf(s, nid, i, len(key), swa_evicted_seqlen)
    swa_tree.swa_refresh(s, nid)                  # 0.5.23: INSERT_END from the target node
    return i


def _commit_swa_leaf(s: State, leaf: int, start: int, end: int, swa_evicted_seqlen: int) -> None:
    """Borrow era `SWAComponent.commit_insert_component_data` on the fresh leaf
    `[start, end)`: split at the SWA cursor (`swa_tree.clip_to_window`), then the live part
    capped at one page-aligned window (`swa_tree.swa_lock_split`)."""
    live_start = swa_tree.clip_to_window(s, start, end, swa_evicted_seqlen)
    if live_start is None:
        return
    if live_start > start:
        _split_node(s, leaf, live_start - start)
    cap = swa_tree.swa_lock_split(end - live_start, s.cfg.swa_window, s.cfg.page_size)
    if cap is not None:
        swa_tree.swa_insert_mru(s, _split_node(s, leaf, cap))     # older fragments publish first
    swa_tree.swa_insert_mru(s, leaf)


def _recover_tombstones(s: State, key: tuple, pages: list, end: int, after: int,
                        swa_evicted_seqlen: int) -> None:
    """Wrapper era `SWARadixCache._insert_helper` (0.5.15 l.1125-1188): a tombstoned node
    the insert walks through that ends past `prev_prefix_len` takes the request's SWA KV
    for its part at or past `swa_evicted_seqlen` (split there when it starts below it).
    Upstream keeps whichever full pages (the node's when locked, else the request's) and
    frees the others; the spec keeps the node's and moves the request's SWA page onto them
    (`swa_tree.adopt_swa`), the caller freeing the request's: the same state up to page
    renaming."""
    P, nid, start = s.cfg.page_size, ROOT, 0
    while start < end:
        nid = dict.__getitem__(s.nodes, nid).children[_page_key(s, key, start)]
        n = dict.__getitem__(s.nodes, nid)
        stop = start + len(n.key)
        if stop > after and swa_tree.swa_tombstoned(s, n) and swa_evicted_seqlen < stop:
            lo = max(start, swa_evicted_seqlen)
            if lo > start:
                _split_node(s, nid, lo - start)
            swa_tree.adopt_swa(s, s.nodes[nid].pages, pages[lo // P:stop // P])
            swa_tree.swa_insert_mru(s, nid)       # the recovered node's SWA value is stored
        start = stop


def _add_node(s: State, parent: int, path: tuple, start: int, pages: tuple) -> int:
    """`_add_new_node`: a fresh unlocked node for path[start:] under parent."""
    n = Node(s.next_node_id, path[start:], pages, parent, {}, 0, _creation_tick(s), path=path)
    s.next_node_id += 1
    s.nodes[n.id] = n
    s.nodes[parent].children[_page_key(s, n.key, 0)] = n.id
    s.evictable_size += len(n.key)
    return n.id


def inc_lock_ref(s: State, anchor) -> None:
    """`inc_lock_ref`: no-op for the root and a virtual node; else up the path."""
    if anchor is None or anchor[0] != "node":
        return
    nid = anchor[1]
    if mamba_tree.on(s) and nid != ROOT:
        s.nodes[nid].mamba_lock_ref += 1    # MAMBA `acquire_component_lock`: this node only
    while nid != ROOT:
        n = s.nodes[nid]
        if n.lock_ref == 0:
            s.evictable_size -= len(n.key)
            s.protected_size += len(n.key)
        n.lock_ref += 1
        nid = n.parent


def dec_lock_ref(s: State, anchor) -> None:
    if anchor is None or anchor[0] != "node":
        return
    nid = anchor[1]
    if mamba_tree.on(s) and nid != ROOT:
        s.nodes[nid].mamba_lock_ref -= 1
    while nid != ROOT:
        n = s.nodes[nid]
        if n.lock_ref == 1:
            s.protected_size -= len(n.key)
            s.evictable_size += len(n.key)
        n.lock_ref -= 1
        nid = n.parent


def evictable_leaves(s: State) -> list:
    """Unlocked childless nodes: what `evict` may pop (in (tick, path) order)."""
    return [n for n in dict.values(s.nodes)        # a read: no copy-on-write
            if n.id != ROOT and not n.children and n.lock_ref == 0]


def lru_leaf(s: State) -> Optional[Node]:
    """The leaf `evict` pops next: the least recent evictable leaf by (tick, path), or None."""
    leaves = evictable_leaves(s)
    return min(leaves, key=lambda n: (n.tick, node_path(s, n.id))) if leaves else None


def evict(s: State, num_tokens: int) -> int:
    """`RadixCache.evict`: unlocked childless leaves in (tick, path) order."""
    return _evict_full(s, num_tokens)[0]


def _evict_full(s: State, num_tokens: int) -> tuple:
    """`evict`'s leaf loop; returns (full tokens, SWA tokens) evicted. Under SWA (wrapper
    era, `SWARadixCache.evict`) a tombstoned parent left childless and unlocked goes with
    the leaf (`_iteratively_delete_tombstone_leaf`), counted as full tokens only."""
    evicted = swa = 0
    while evicted < num_tokens:
        leaf = lru_leaf(s)
        if leaf is None:
            break
        swa += 0 if swa_tree.swa_tombstoned(s, leaf) else len(leaf.key)
        evicted += _delete_node(s, leaf)
        evicted += _delete_tombstone_parents(s, leaf)
    return evicted, swa


def _delete_tombstone_parents(s: State, leaf: Node) -> int:
    """`_iteratively_delete_tombstone_leaf` after a deleted leaf: its parents left
    childless and unlocked go too while they are tombstones (wrapper era: an SWA-
    tombstoned node under SWA, a stateless node under the Mamba tree); returns their
    tokens."""
    evicted = 0
    parent = s.nodes[leaf.parent]
    while (swa_tree.swa_tree_on(s) and parent.id != ROOT and not parent.children and
           parent.lock_ref == 0 and swa_tree.swa_tombstoned(s, parent)) or \
            mamba_tree.tombstone_leaf(s, parent):
        evicted += _delete_node(s, parent)
        parent = s.nodes[parent.parent]
    return evicted


def _delete_node(s: State, leaf: Node) -> int:
    """`_delete_leaf`: an unlocked childless node's pages go back (and its Mamba state:
    `_release_all_component_layers`); it leaves the tree."""
    _free_pages(s, leaf.pages)
    if leaf.mamba_value is not None:    # leaf may be a shared read: free, do not mutate it
        mamba_tree.free_slot(s, leaf.mamba_value)
    parent = s.nodes[leaf.parent]
    del parent.children[_page_key(s, leaf.key, 0)]
    del s.nodes[leaf.id]
    s.evictable_size -= len(leaf.key)
    return len(leaf.key)


def _evict_swa(s: State, num_tokens: int) -> None:
    """`SWARadixCache.evict`'s SWA loop (wrapper era): over every node not tombstoned and
    not SWA-locked, least recent first ((tick, path): a parent before its child), an
    internal node or a full-locked leaf is tombstoned (`free_swa`: its SWA KV goes, its
    full KV stays), an unlocked leaf is deleted, with the tombstoned parents it leaves
    childless."""
    evicted = 0
    while evicted < num_tokens:
        x = swa_tree.swa_evict_victim(s, lambda n: (n.tick, node_path(s, n.id)))
        if x is None:
            return
        evicted += len(x.key)
        _evict_swa_node(s, x)


def _evict_swa_node(s: State, x: Node) -> None:
    """One step of an SWA eviction walk (both eras): an internal node or a full-locked
    leaf is tombstoned (`free_swa`: its SWA KV goes, its full KV stays), an unlocked leaf
    is deleted, with the tombstoned parents it leaves childless (wrapper era; 0.5.23 keeps
    them: only the FULL value decides, `_delete_tombstone_parents` takes none there)."""
    if x.children or x.lock_ref > 0:
        swa_pool.free_swa(s, x.pages)
    else:
        _delete_node(s, x)
        _delete_tombstone_parents(s, x)


def evict_mamba(s: State, num: int) -> None:
    """0.5.23 `evict_for_alloc(EvictParams(mamba_num=num))` with a Mamba component
    (`MambaComponent._evict_device_next_node`): from the least recent state without a
    Mamba lock, an unlocked device leaf is deleted whole (`evict_device_leaf`), any other
    node loses only its state; one state each, until num are freed or none is left."""
    freed = 0
    while freed < num:
        cands = mamba_tree.evictable(s)
        if not cands:
            return
        x = s.nodes[min(cands, key=lambda n: n.mamba_tick).id]
        if not x.children and x.lock_ref == 0:
            _delete_node(s, x)
            _delete_tombstone_parents(s, x)
        else:
            mamba_tree.drop_state(s, x)
        freed += 1


def alloc_mamba_slot(s: State, where: str) -> int:
    """`MambaComponent._alloc_mamba_slot`: one slot, evicting one state when the pool is
    empty; upstream asserts "Can not alloc mamba cache" when that finds none."""
    if not s.mamba_free_slots:
        evict_mamba(s, 1)
    m = mamba_tree.alloc_slot(s)
    if m is None:
        raise ModelError(f"{where}: Can not alloc mamba cache")
    return m


def evict_for_alloc_swa(s: State, n: int) -> None:
    """0.5.23 `SWATokenToKVPoolAllocator.evict_to_free_tokens` (`allocator/swa.py`
    l.210-220) -> `UnifiedRadixCache.evict_for_alloc` with each pool's shortfall as an
    availability target (`unified_radix_cache.py` l.706-779, `_evict_components`
    l.952-1027): the FULL walk deletes unlocked leaves, least recent first, until the full
    pool has n free; then, while the SWA pool has fewer than n free and the SWA tokens
    freed so far (the FULL walk's leaves counted) are below its shortfall, the SWA walk
    over the SWA component's LRU (`swa_tree.swa_evict_victim`, `_evict_swa_node`)."""
    P = s.cfg.page_size
    full_short = max(0, n - len(s.free_pages) * P)
    swa_short = max(0, n - swa_pool.swa_available_size(s))
    swa_freed = 0
    while full_short and len(s.free_pages) * P < n:
        leaf = lru_leaf(s)
        if leaf is None:
            break
        swa_freed += swa_tree.swa_tokens(s, leaf)
        _delete_node(s, leaf)
    while swa_short and swa_freed < swa_short and swa_pool.swa_available_size(s) < n:
        x = swa_tree.swa_evict_victim(s, lambda m: (m.swa_tick, node_path(s, m.id)))
        if x is None:
            return
        swa_freed += swa_tree.swa_tokens(s, x)
        _evict_swa_node(s, x)


def insert_mamba(s: State, key: tuple, pages: list, value: int) -> tuple[int, int, bool]:
    """`UnifiedRadixCache.insert` with a Mamba component (P = 1): the walk, a new leaf
    for the suffix, then `commit_insert_component_data` on the node the key ends on (an
    existing one is re-stamped). Returns (that node, the length that existed,
    mamba_exist)."""
    if not key:                         # `begin_insert`: an empty key commits nothing
        return ROOT, 0, True
    nid, i, _ = _walk(s, key)
    new_leaf = i < len(key)
    if new_leaf:
        nid = _add_node(s, nid, key, i, tuple(pages[i:len(key)]))
    node = s.nodes[nid]
    if not new_leaf:
        node.tick = _creation_tick(s)
    return nid, i, mamba_tree.commit_insert(s, node, new_leaf, value)


def _path_pages(s: State, nid: int) -> list:
    """`path_device_indices`: the pages from the root down to nid."""
    out = []
    while nid != ROOT:
        n = dict.__getitem__(s.nodes, nid)
        out[:0] = n.pages
        nid = n.parent
    return out
