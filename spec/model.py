"""The reference model: each operation is a guard (`enabled`) and an effect (`step`).

Follows DOMAIN.md section 2 and the seed (`streaming_session.py` of sglang 0.5.15) step
for step, with upstream's names; docs/semantics.md states the same in prose. The model
takes the fixed behaviour of the hazards H3, H4 and H5 (marked `FIX(Hn)`), so a system
that shows the upstream behaviour is reported as a violation.

`step(state, op)` clones the state and returns `(new_state, outcome)`; it never mutates
its argument. The helpers below mutate the clone they are given and are private to the
step that called them.
"""
from __future__ import annotations

import bisect
from typing import Optional

from kvcheck.spec import hybrid, mamba_tree
from kvcheck.spec.violations import ModelError  # noqa: F401  (kvcheck.spec.model.ModelError)
from kvcheck.spec import ops as O
from kvcheck.spec.pages import (ceil_align, ceil_div, chunk_end, floor_align, free_kv_aligned_pages,
                        pages_needed_extend, restore_prefix_len, row_pages)
from kvcheck.spec.state import ROOT, Node, Req, Session, Slot, State, initial_state

__all__ = ["initial_state", "enabled", "step", "ModelError", "SAMPLED_TOKEN"]

SAMPLED_TOKEN = 1
"""The token the prefill forward samples (the first output token)."""


# ---------------------------------------------------------------------------
# allocator (TokenToKVPoolAllocator / PagedTokenToKVPoolAllocator)
# ---------------------------------------------------------------------------

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
    return hybrid.available_size(s, len(s.free_pages) * s.cfg.page_size)


def _alloc_pages(s: State, n: int):
    """`alloc`: the n lowest free pages, or None (nothing changes) on shortage."""
    if n > len(s.free_pages) or not hybrid.swa_can_alloc(s, n):
        return None
    taken, s.free_pages = s.free_pages[:n], s.free_pages[n:]
    hybrid.map_swa_pages(s, taken)
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
    hybrid.free_swa(s, [p for p in pages if p not in full_only])


def _free_row_range(s: State, row: int, start: int, end: int, holder=None) -> None:
    """`free(req_to_token[row, start:end])`: frees every page the range touches. With the
    record `holder` (borrow era `free_kv_row`): its SWA-dead pages go back full-side only."""
    r = s.rows[row]
    dead = hybrid.swa_dead_pages(s, holder, start, end) if holder is not None else ()
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


def _alloc_extend(s: State, row: int, prefix: int, end: int, mamba_evict: bool = False,
                  evict: bool = True) -> bool:
    """`alloc_for_extend` for one request: evict first, then P=1 `alloc(n)` or P>1
    `alloc_extend` (continue the partial last page, then new pages); fill the row.
    `mamba_evict` (a 0.5.15 Mamba tree's next chunk): once the KV fits, `alloc_req_slots`
    evicts Mamba states before the allocation (`mamba_tree.alloc_req_slots_evict`)."""
    P = s.cfg.page_size
    n = end - prefix
    if P == 1:
        if evict:
            evict_from_tree_cache(s, n)
        if mamba_evict and len(s.free_pages) >= n:
            evict_mamba(s, mamba_tree.alloc_req_slots_evict(s))
        pages = _alloc_pages(s, n)
        if pages is None:
            return False
        s.rows[row][prefix:end] = pages
        return True
    if evict:
        evict_from_tree_cache(s, n + P)
    pages = _alloc_pages(s, pages_needed_extend(prefix, end, P))
    if pages is None:
        return False
    first_new = ceil_div(prefix, P)
    s.rows[row][first_new:first_new + len(pages)] = pages
    return True


def _alloc_decode(s: State, row: int, pos: int, evict: bool = True) -> bool:
    """`alloc_for_decode` for row position pos: a new page iff pos % P == 0."""
    P = s.cfg.page_size
    if evict:
        evict_from_tree_cache(s, P)
    if pos % P:
        return True                     # last_loc + 1, in the page already held
    pages = _alloc_pages(s, 1)
    if pages is None:
        return False
    s.rows[row][pos // P] = pages[0]
    return True


# ---------------------------------------------------------------------------
# radix tree (RadixCache)
# ---------------------------------------------------------------------------

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
    hybrid.move_swa_uuid(s, child_id, new.id)
    new.swa_tick = child.swa_tick       # 0.5.23: `lru.insert_after(child, new_node)`
    if mamba_tree.on(s):
        mamba_tree.split(new)
        mamba_tree.walk_touch(s, child)
    if hybrid.swa_on(s) or mamba_tree.on(s):
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
    (`hybrid.swa_tombstone_cut`)."""
    P = s.cfg.page_size
    nid, i, _ = _walk(s, key)
    if hybrid.swa_on(s):
        _recover_tombstones(s, key, pages, i, prev_prefix_len, swa_evicted_seqlen)
    cut = hybrid.swa_tombstone_cut(s, i, len(key), swa_evicted_seqlen)
    if i < cut == len(key):
        _free_pages(s, pages[i // P:len(key) // P])     # no all-tombstone leaf
        return i
    for lo, hi in ((i, cut), (cut, len(key))):
        if lo < hi:
            nid = _add_node(s, nid, key[:hi], lo, tuple(pages[lo // P:hi // P]))
    if i < len(key):
        _commit_swa_leaf(s, nid, i, len(key), swa_evicted_seqlen)
    hybrid.swa_refresh(s, nid)                  # 0.5.23: INSERT_END from the target node
    return i


def _commit_swa_leaf(s: State, leaf: int, start: int, end: int, swa_evicted_seqlen: int) -> None:
    """Borrow era `SWAComponent.commit_insert_component_data` on the fresh leaf
    `[start, end)`: split at the SWA cursor (`hybrid.clip_to_window`), then the live part
    capped at one page-aligned window (`hybrid.swa_lock_split`)."""
    live_start = hybrid.clip_to_window(s, start, end, swa_evicted_seqlen)
    if live_start is None:
        return
    if live_start > start:
        _split_node(s, leaf, live_start - start)
    cap = hybrid.swa_lock_split(end - live_start, s.cfg.swa_window, s.cfg.page_size)
    if cap is not None:
        hybrid.swa_insert_mru(s, _split_node(s, leaf, cap))     # older fragments publish first
    hybrid.swa_insert_mru(s, leaf)


def _recover_tombstones(s: State, key: tuple, pages: list, end: int, after: int,
                        swa_evicted_seqlen: int) -> None:
    """Wrapper era `SWARadixCache._insert_helper` (0.5.15 l.1125-1188): a tombstoned node
    the insert walks through that ends past `prev_prefix_len` takes the request's SWA KV
    for its part at or past `swa_evicted_seqlen` (split there when it starts below it).
    Upstream keeps whichever full pages (the node's when locked, else the request's) and
    frees the others; the spec keeps the node's and moves the request's SWA page onto them
    (`hybrid.adopt_swa`), the caller freeing the request's: the same state up to page
    renaming."""
    P, nid, start = s.cfg.page_size, ROOT, 0
    while start < end:
        nid = dict.__getitem__(s.nodes, nid).children[_page_key(s, key, start)]
        n = dict.__getitem__(s.nodes, nid)
        stop = start + len(n.key)
        if stop > after and hybrid.swa_tombstoned(s, n) and swa_evicted_seqlen < stop:
            lo = max(start, swa_evicted_seqlen)
            if lo > start:
                _split_node(s, nid, lo - start)
            hybrid.adopt_swa(s, s.nodes[nid].pages, pages[lo // P:stop // P])
            hybrid.swa_insert_mru(s, nid)       # the recovered node's SWA value is stored
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
        swa += 0 if hybrid.swa_tombstoned(s, leaf) else len(leaf.key)
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
    while (hybrid.swa_tree_on(s) and parent.id != ROOT and not parent.children and
           parent.lock_ref == 0 and hybrid.swa_tombstoned(s, parent)) or \
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
        x = hybrid.swa_evict_victim(s, lambda n: (n.tick, node_path(s, n.id)))
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
        hybrid.free_swa(s, x.pages)
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


def evict_from_tree_cache(s: State, n: int) -> None:
    """V1 `evict_from_tree_cache`: if available < n, evict(n) (0.5.14-0.5.16), or only the
    shortfall n - available (`config.evict_shortfall`: 0.5.17+; the borrow era)."""
    if s.cfg.era == "borrow":
        if hybrid.swa_on(s):
            evict_for_alloc_swa(s, n)
            return
        # 0.5.22+ `allocator.evict_to_free_tokens`: evict only the shortfall
        if available_size(s) < n:
            evict(s, n - available_size(s))
        return
    if hybrid.swa_tree_on(s):
        # 0.5.15 `common.py` l.297-316 with an SWATokenToKVPoolAllocator: each pool's
        # shortfall, `EvictParams(num_tokens=n - full_available, swa_num_tokens=n -
        # swa_available)`; the leaves the full loop evicts count on the SWA side too
        full_short = max(0, n - len(s.free_pages) * s.cfg.page_size)
        swa_short = max(0, n - hybrid.swa_available_size(s))
        if full_short or swa_short:
            _, swa = _evict_full(s, full_short)
            _evict_swa(s, swa_short - swa)
        return
    available = available_size(s)
    if available < n:
        evict(s, n - available if s.cfg.evict_shortfall else n)


def evict_for_alloc_swa(s: State, n: int) -> None:
    """0.5.23 `SWATokenToKVPoolAllocator.evict_to_free_tokens` (`allocator/swa.py`
    l.210-220) -> `UnifiedRadixCache.evict_for_alloc` with each pool's shortfall as an
    availability target (`unified_radix_cache.py` l.706-779, `_evict_components`
    l.952-1027): the FULL walk deletes unlocked leaves, least recent first, until the full
    pool has n free; then, while the SWA pool has fewer than n free and the SWA tokens
    freed so far (the FULL walk's leaves counted) are below its shortfall, the SWA walk
    over the SWA component's LRU (`hybrid.swa_evict_victim`, `_evict_swa_node`)."""
    P = s.cfg.page_size
    full_short = max(0, n - len(s.free_pages) * P)
    swa_short = max(0, n - hybrid.swa_available_size(s))
    swa_freed = 0
    while full_short and len(s.free_pages) * P < n:
        leaf = lru_leaf(s)
        if leaf is None:
            break
        swa_freed += hybrid.swa_tokens(s, leaf)
        _delete_node(s, leaf)
    while swa_short and swa_freed < swa_short and hybrid.swa_available_size(s) < n:
        x = hybrid.swa_evict_victim(s, lambda m: (m.swa_tick, node_path(s, m.id)))
        if x is None:
            return
        swa_freed += hybrid.swa_tokens(s, x)
        _evict_swa_node(s, x)


def cache_unfinished_req_inner(s: State, req: Req) -> None:
    """Inner `RadixCache.cache_unfinished_req` (DOMAIN.md 2.4): the page-aligned
    committed prefix moves into the tree and the lock moves with it. A disabled tree
    (`checkpoint_into_tree`: `if self.disable`) keeps nothing and moves no lock. In the
    wrapper era a request anchored on its session slot's virtual node reaches it only once
    detached from its session (after an accepted U2's second `finish_req`): 0.5.15's inner
    tree then unlocks the virtual node and raises."""
    if s.cfg.era == "wrapper" and req.last_node is not None and req.last_node[0] == "virtual":
        raise ModelError(f"RadixCache.dec_lock_ref: req {req.rid}, detached from its session, "
                         f"still anchored on session {req.last_node[1]}'s virtual node",
                         upstream=("'_VirtualNode' object has no attribute 'lock_ref'",))
    if s.cfg.disable_radix_cache:
        return
    if mamba_tree.on(s):
        _checkpoint_mamba_tree(s, req, finished=False)
        return
    P = s.cfg.page_size
    row = s.rows[req.row]
    branch = hybrid.swa_branch_cache_len(req, req.committed)
    cache_len = req.committed if branch is None else branch
    # the key is `get_fill_ids()` (0.5.15 radix_cache.py l.493-500; 0.5.23 `checkpoint`,
    # fill[:extend_end]) page-aligned: shorter than committed only when a later turn
    # rewrote the shared array in place (U1); cache_protected_len then becomes that
    # shorter length, as upstream's `len(new_indices)` does
    keys_len = floor_align(min(cache_len, len(req.fill)), P)
    key = req.fill[:keys_len]
    hybrid.free_out_of_window_slots(s, req, cache_len)
    new_prefix_len = insert(s, key, row[:keys_len // P], hybrid.insert_cursor(s, req),
                            prev_prefix_len=req.protected)
    if new_prefix_len > req.protected:
        _free_row_range(s, req.row, req.protected, new_prefix_len)
    if hybrid.prompt_split_on(s):
        _split_at_prompt(s, req, key)
    nid, pages = match_prefix(s, key)
    if len(pages) * P != keys_len:
        raise ModelError(f"cache_unfinished_req: re-match {len(pages) * P} != {keys_len}")
    row[req.protected // P:keys_len // P] = pages[req.protected // P:]
    req.protected = keys_len
    dec_lock_ref(s, req.last_node)
    req.last_node = ("node", nid)
    inc_lock_ref(s, req.last_node)
    req.locked = True
    hybrid.note_swa_lock(s, req)
    hybrid.cleanup_swa_branch(s, req, branch, finished=False)


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


def _checkpoint_mamba_tree(s: State, req: Req, finished: bool) -> None:
    """0.5.23 `checkpoint_into_tree` with a Mamba component (P = 1, no extra buffer): the
    state offered to the tree is a copy in a fresh slot (unfinished) or the request's own
    (finished: donated); the insert keys [0, committed), the duplicates of
    [protected, existing) are freed, the lock moves to the node the key ends on, and
    `cleanup_after_caching_req` frees what the node did not take."""
    if finished:
        value = req.mamba_pool_idx
        if value is None:
            raise ModelError(f"prepare_for_caching_req: finished req {req.rid} holds no "
                             "Mamba state to donate")
    else:
        value = alloc_mamba_slot(s, "prepare_for_caching_req")   # copy_from(req's state)
    # `full_untruncated_fill_ids[:up_to]`: shorter than committed only where a later turn
    # rewrote the shared array (U1); a finished request's row past it is then freed by
    # `release_kv_cache` ([cache_protected_len, owned_kv_len)), an unfinished one keeps it
    key = fill_key(s, req, finished)[:req.committed]
    keys_len = len(key)
    row = s.rows[req.row]
    nid, new_prefix_len, exist = insert_mamba(s, key, row[:keys_len], value)
    if new_prefix_len > req.protected:
        _free_row_range(s, req.row, req.protected, new_prefix_len)
    row[req.protected:keys_len] = _path_pages(s, nid)[req.protected:]
    if finished and keys_len < req.committed and s.cfg.era == "borrow":
        _free_row_range(s, req.row, keys_len, req.committed)
    dec_lock_ref(s, req.last_node)
    req.last_node = ("node", nid)
    inc_lock_ref(s, req.last_node)
    req.locked = True
    req.protected = keys_len
    if not finished:
        if exist:
            mamba_tree.free_slot(s, value)
    elif exist:
        hybrid.free_mamba(s, req)       # `free_mamba_cache`: the node kept its own
    else:
        req.mamba_pool_idx = None       # the node owns it now (upstream leaves the ref)


def _split_at_prompt(s: State, req: Req, key: tuple) -> None:
    """Borrow era (`checkpoint_into_tree`), a FULL-only tree (`hybrid.prompt_split_on`): a
    second insert of the page-aligned prompt, cut from the inserted `key`, splits the
    inserted path at the prompt boundary (so eviction can drop the output KV without the
    prompt); it adds and frees nothing."""
    P = s.cfg.page_size
    prompt_len = floor_align(len(req.origin), P)
    if 0 < prompt_len < len(key):
        insert(s, key[:prompt_len], s.rows[req.row][:prompt_len // P])


def cache_finished_req_inner(s: State, req: Req, is_insert: bool) -> None:
    """Inner `RadixCache.cache_finished_req` (DOMAIN.md 2.6, non-streaming)."""
    P = s.cfg.page_size
    committed = req.committed
    req.committed_freed = True                      # pop_committed_kv_cache
    if is_insert and mamba_tree.on(s):
        _checkpoint_mamba_tree(s, req, finished=True)
        if req.locked:
            dec_lock_ref(s, req.last_node)
            req.locked = False
        return
    branch = hybrid.swa_branch_cache_len(req, committed) if is_insert else None
    n, key_len = committed, branch
    if branch is None:
        # the key is the token array `fill_key` names cut at kv_committed_len: shorter than
        # committed only when a later turn rewrote the arrays in place (U1,
        # `aliases_token_arrays`). 0.5.22+ (`checkpoint_into_tree`, then `release_kv_cache`'s
        # free of [cache_protected_len, owned_kv_len)) frees the row past the page-aligned
        # key; 0.5.15 (radix_cache.py l.451-454) frees the row slice of its key only, and
        # row positions [key, committed) by nothing
        key_len = min(committed, len(fill_key(s, req, finished=True)))
        if s.cfg.era == "wrapper":
            n = key_len
    keys_len = floor_align(key_len, P)
    if is_insert and not s.cfg.disable_radix_cache:     # disabled: the row is freed
        key = fill_key(s, req, finished=True)[:keys_len]
        new_prefix_len = insert(s, key, s.rows[req.row][:keys_len // P],
                                req.swa_evicted_seqlen, req.protected)
        if new_prefix_len > req.protected:
            _free_row_range(s, req.row, req.protected, new_prefix_len)
        if hybrid.prompt_split_on(s):
            _split_at_prompt(s, req, key)
    elif keys_len > req.protected:
        _free_row_range(s, req.row, req.protected, keys_len)
    if n > keys_len:
        _free_row_range(s, req.row, keys_len, n)    # the unaligned tail page
    if req.locked:
        dec_lock_ref(s, req.last_node)
        req.locked = False
    hybrid.cleanup_swa_branch(s, req, branch, finished=True)


# ---------------------------------------------------------------------------
# session slots (StreamingSession, SessionSlot)
# ---------------------------------------------------------------------------

def _is_streaming(req: Req) -> bool:
    return req.session is not None


ACCEPTED_INVARIANTS = {
    "U1": ("I20", "I26 req"),   # two turns in flight; the live turn's prompt rewritten under it
    "U2": ("I20", "I26 req", "I28"),
    "U3": ("I20",),
    "U6": ("I20",),
    "U7": (),               # the release raises: the spec stops at the same assertion
    "U8": ("I1", "I2", "I4"),   # the stub's own row and KV leak
    "U9": (),               # the release raises: the spec stops at the same error
    "M2": ("I28",),         # the aborted turn's tokens become the checkpoint
}
"""The invariants an accepted finding's known behaviour breaks on the spec itself ("ID" on
any owner, "ID KIND" on owners of that kind only: `req`, `slot`, `session`, `node`). A spec
that breaks anything else under `Config.accept` has left what the model follows (e.g.
pages owned twice after U1, whose allocation order upstream does not share; a running
turn's rewritten tokens saved into its session's slot, I26 on the slot: every later turn
of the session builds on KV of other tokens, and releases differ in which of the
rewritten lengths they keep)."""


def within_accepted(accept, violations) -> bool:
    """Whether every violation (id, owner) is one the accepted findings' behaviour breaks."""
    allowed = {i for a in accept for i in ACCEPTED_INVARIANTS.get(a, ())}
    return all(v.id in allowed or f"{v.id} {(v.owner or '').split(' ', 1)[0]}" in allowed
               for v in violations)


def accepts(s: State, finding: str) -> bool:
    """`Config.accept`: the spec takes upstream's recorded behaviour for this finding
    (docs/upstream-findings.md) instead of the fix."""
    return finding in s.cfg.accept


def _aliases_arrays(s: State) -> bool:
    """`Config.aliases_token_arrays`: live requests share token arrays in place."""
    return s.cfg.aliases_token_arrays


def _free_kv_aligned(s: State, row: int, target: int, end: int, holder=None) -> None:
    """Free row[ceil_align(target):end): the partial page stays attached."""
    r = s.rows[row]
    pages = free_kv_aligned_pages(target, end, s.cfg.page_size)
    dead = hybrid.swa_dead_pages(s, holder, 0, end) if holder is not None else ()
    _free_pages(s, [r[k] for k in pages], full_only={r[k] for k in dead if k in pages})


def _free_tail(s: State, slot: Slot, req: Req, prefix_len: int) -> None:
    _free_kv_aligned(s, slot.row, prefix_len, slot.allocated, holder=slot)
    slot.allocated = prefix_len
    slot.committed = min(slot.committed, prefix_len)
    req.allocated = prefix_len
    req.committed = min(req.committed, prefix_len)
    hybrid.clamp_swa_evicted(slot, prefix_len)
    hybrid.clamp_swa_evicted(req, prefix_len)


def _trim_overshoot(s: State, req: Req, finished_len: int) -> None:
    target = hybrid.swa_aligned_rewind(s, req, len(req.origin) + finished_len)
    _free_kv_aligned(s, req.row, target, req.allocated, holder=req)
    req.allocated = min(req.allocated, target)
    req.committed = min(req.committed, target)
    hybrid.clamp_swa_evicted(req, target)
    del req.output[finished_len:]


def _save_from_req(slot: Slot, req: Req, is_first: bool) -> None:
    slot.row = req.row
    slot.committed = req.committed
    slot.allocated = req.allocated
    if is_first:
        slot.last_node = req.last_node
        slot.protected = req.protected
    hybrid.save_swa_fields(slot, req, is_first)
    hybrid.move_mamba(slot, req, clear_src=True)
    req.row = None
    req.locked = False          # the first turn's lock now belongs to slot.last_node


def _restore_to_req(slot: Slot, req: Req) -> None:
    """The slot is not cleared (restore must be idempotent across a rejected admission)."""
    req.row = slot.row
    req.committed = slot.committed
    req.allocated = slot.allocated
    hybrid.restore_swa_fields(slot, req)
    hybrid.move_mamba(req, slot, clear_src=False)


def _mark_kv_freed(req: Req) -> None:
    req.committed_freed = True
    req.overallocated_freed = True


def release_session(s: State, sid: int) -> None:
    """Drop the first-turn lock, free row[protected:allocated], return the row."""
    slot = s.slots.pop(sid, None)
    if slot is None:
        return
    dec_lock_ref(s, slot.last_node)
    if slot.row is not None:
        if slot.protected < slot.allocated:
            _free_row_range(s, slot.row, slot.protected, slot.allocated, holder=slot)
        s.free_rows.append(slot.row)
    hybrid.free_mamba(s, slot)          # `_free_slot_mamba` (H7, #23496)


def find_active_slot(s: State, req: Req):
    """A slot holding KV for this streaming request, or None; detaches a pre-aborted one."""
    if not _is_streaming(req):
        return None
    slot = s.slots.get(req.session)
    if slot is None or slot.row is None:
        return None
    if req.to_finish:
        sid = req.session
        _drop_parked_turn(s, sid, req)
        _abort_req(s, sid, req, unconditional=accepts(s, "U1"))
        req.session = None
        return None
    return slot


def _drop_parked_turn(s: State, sid: int, req: Req) -> None:
    """FIX(H4) follow-up: a retracted turn parked its partial KV in the slot without
    advancing the checkpoint; if that turn now ends unsuccessfully, the slot no longer
    matches the checkpoint the next turn is built from, so it is released."""
    sess = s.sessions.get(sid)
    if req.is_retracted and sid in s.slots and sess is not None and sess.inflight_rid == req.rid:
        release_session(s, sid)


def _abort_req(s: State, sid: int, req: Req, unconditional: bool = False) -> None:
    """`Session.abort_req`. FIX(H3): clears _inflight only for the in-flight request;
    `unconditional` is upstream's `self._inflight = False` (an accepted finding)."""
    sess = s.sessions.get(sid)
    if sess is not None and (unconditional or sess.inflight_rid == req.rid):
        sess.inflight_rid = None


def _finish_req(s: State, sid: int, req: Req) -> None:
    """`Session.finish_req`: the checkpoint advances to this request."""
    sess = s.sessions.get(sid)
    if sess is None:
        return
    if sess.inflight_rid == req.rid or accepts(s, "U1"):
        sess.inflight_rid = None        # FIX(H3); upstream: `self._inflight = False`
    sess.checkpoint = req.fill_ids
    prev = _req_nodes_request(s, sess) if accepts(s, "U2") else None
    if prev is not None:                # after an accepted U2: req_nodes' request still live
        prev.session = None             # `prev_node.req.session = None` (even req itself)
    sess.last_rid, sess.committed_origin = req.rid, req.origin
    sess.last_unfinished = req.finished_reason is None     # a retract under accepted U2
    if req.array_of is None:            # a turn built on no checkpoint has its own array
        req.array_of = req.rid
    sess.last_array = req.array_of      # req_nodes' request: the next turn extends its array
    req.req_nodes = True
    if req.fill_of is None:             # its fill array: the next turn's carry_fill
        req.fill_of = _new_fill_id(s, req.rid)
    sess.last_fill, sess.fill, sess.committed_fill_len = req.fill_of, req.fill, len(req.fill)


def _sync_checkpoints(s: State) -> None:
    """Upstream has no checkpoint copy: `create_req` reads req_nodes' request
    (`origin_input_ids[:committed_origin_len] + output_ids[:max_new_tokens]`). A request
    still live after its `finish_req` (a retract under accepted U2) moves it."""
    for sess in s.sessions.values():
        r = _req_nodes_request(s, sess)
        if r is not None:
            _sync_checkpoint(sess, r)


def _req_nodes_request(s: State, sess: Session) -> Optional[Req]:
    """req_nodes' request if it is still live (only after an accepted U2), else None. Not
    merely the live request with its rid: a client may reuse a finished request's rid
    (upstream refuses only a rid still in flight), and a new request under that rid is not
    the one `finish_req` recorded."""
    r = s.reqs.get(sess.last_rid) if sess.last_rid is not None else None
    return r if r is not None and r.req_nodes else None


def _sync_checkpoint(sess: Session, r: Req) -> None:
    """The checkpoint req_nodes' request `r` gives while its arrays are still its own."""
    if r.array_of == sess.last_array:
        sess.checkpoint = sess.committed_origin + tuple(r.output[:r.max_new_tokens])


def _close_waits(sess: Session) -> bool:
    """`SessionController._close` defers while `_inflight`, or while req_nodes' request
    has not finished (possible only after an accepted U2: a retract ran finish_req)."""
    return sess.inflight_rid is not None or sess.last_unfinished


def _maybe_close(s: State, sid: int) -> None:
    """A deferred close is carried out once the turn in flight has ended."""
    sess = dict.get(s.sessions, sid)    # a read (every step, every session): no copy-on-write
    if sess is not None and sess.close_pending and not _close_waits(sess):
        release_session(s, sid)
        del s.sessions[sid]


def try_cache_finished_req(s: State, req: Req, *, checkpoint: bool = True) -> None:
    """`StreamingSession.try_cache_finished_req` for an attached streaming request.
    checkpoint=False is the retract path: FIX(H4) parks the KV without `finish_req`."""
    sid = req.session
    slot = s.slots.get(sid)
    if req.finished_reason == "abort":
        if slot is not None and slot.row != req.row and \
                (s.cfg.era == "borrow" or not accepts(s, "U8")):
            # FIX(U8): an aborted turn that never ran on its session's slot (a rejected
            # stub matched in the round whose other turn then created the slot) leaves the
            # slot to that turn and is released like any request. 0.5.15 releases the
            # session's slot in its place and leaks the stub's own row and KV; 0.5.23
            # asserts "does not run on its slot" (`try_cache_finished_req`)
            _abort_req(s, sid, req, unconditional=accepts(s, "U1"))
            req.session = None
            _release_plain(s, req, is_insert=True)
            return
        if s.cfg.era == "borrow":
            if slot is not None:
                dec_lock_ref(s, slot.last_node)
                del s.slots[sid]
            _abort_req(s, sid, req, unconditional=accepts(s, "U1"))
            req.session = None
            _release_plain(s, req, is_insert=True)
            return
        if slot is None:                # first-turn mid-abort: ephemeral slot
            slot = Slot(row=req.row, allocated=req.allocated, last_node=req.last_node,
                        protected=req.protected, swa_uuid_for_lock=req.swa_uuid_for_lock)
            hybrid.move_mamba(slot, req, clear_src=True)
            s.slots[sid] = slot
        slot.allocated = max(slot.allocated, req.allocated)
        req.locked = False              # the lock goes with the slot
        release_session(s, sid)
        req.row = None
        _abort_req(s, sid, req, unconditional=accepts(s, "U1"))
        _mark_kv_freed(req)
        return
    is_first = slot is None
    if is_first:
        slot = Slot()
        s.slots[sid] = slot
    finished_len = req.finished_len if req.finished_len is not None else len(req.output)
    target = len(req.origin) + finished_len
    _trim_overshoot(s, req, finished_len)
    req.swa_branching_seqlen = None
    _save_from_req(slot, req, is_first)
    slot.committed = min(target, slot.allocated)
    if s.cfg.era == "borrow":
        slot.publishes = False          # the turn hands the record back (finish or retract)
    if checkpoint:
        _finish_req(s, sid, req)
    _mark_kv_freed(req)


def _release_plain(s: State, req: Req, is_insert: bool) -> None:
    """`release_kv_cache` for a request the streaming wrapper does not handle:
    cache_finished_req, then the overallocation [ceil_align(committed), allocated), then
    the row."""
    if s.cfg.era == "borrow" and req.finished_len is not None:
        # 0.5.22+ `owned_kv_len`: KV past the finished output (a speculative overshoot)
        # is never keyed; it falls into the overallocated range and is freed. Never below
        # the tree-owned prefix (a re-prefilled retracted request published past it).
        req.committed = min(req.committed, max(req.protected, len(req.origin) + req.finished_len))
    if s.cfg.era == "borrow" and is_insert:
        refresh_fill(s, req)            # "the fill-id array lags output_ids": refreshed first
    cache_finished_req_inner(s, req, is_insert)
    start = ceil_align(req.committed, s.cfg.page_size)
    if start < req.allocated:
        _free_row_range(s, req.row, start, req.allocated, holder=req)
    req.overallocated_freed = True
    hybrid.free_mamba(s, req)           # `free_mamba_cache`: the tree keeps no Mamba state
    s.free_rows.append(req.row)
    req.row = None


def release_kv_cache(s: State, req: Req, is_insert: bool = True) -> None:
    if _is_streaming(req):
        try_cache_finished_req(s, req)
    else:
        _release_plain(s, req, is_insert)


# ---------------------------------------------------------------------------
# the scheduler around them
# ---------------------------------------------------------------------------

def _key_limit(req: Req) -> int:
    """`_compute_max_prefix_len` (0.5.15 `schedule_batch.py` l.1225-1230, 0.5.23
    l.1768-1780): input_len - 1 (the one-token logit reserve), capped at the request's
    `logprob_start_len` when it returns logprobs from there."""
    limit = req.seqlen - 1
    if req.logprob_start >= 0:
        limit = min(limit, req.logprob_start)
    return max(limit, 0)


def resolve_logprob_start(logprob_start_len, prompt_len: int) -> int:
    """`handle_generate_request` (0.5.15 `scheduler.py` l.2213-2235, 0.5.23 l.3256-3279):
    no logprobs -> -1; logprobs with the default -1 -> the prompt length (output-token
    logprobs only); else the given start."""
    if logprob_start_len is None:
        return -1
    return prompt_len if logprob_start_len == -1 else logprob_start_len


def _match(s: State, req: Req) -> int:
    """`init_next_round_input` -> `match_prefix`: slot restore or radix match.
    Returns prefix_len."""
    refresh_fill(s, req)
    slot = find_active_slot(s, req)
    if slot is not None:
        _restore_to_req(slot, req)
        prefix_len = restore_prefix_len(req.committed, req.seqlen)
        if prefix_len < slot.protected:
            raise ModelError(f"streaming session prefix shrank: prefix_len={prefix_len} "
                             f"< slot.cache_protected_len={slot.protected}")
        prefix_len = hybrid.swa_aligned_rewind(s, req, prefix_len)
        _free_tail(s, slot, req, prefix_len)
        req.last_node = ("virtual", req.session)
        req.protected = slot.protected
        req.prefix_len = prefix_len
        req.swa_branching_seqlen = None     # `try_match_prefix`'s MatchResult carries none
        return prefix_len
    if mamba_tree.on(s):
        nid, pages = _match_mamba_tree(s, req)
        req.last_node = ("node", nid)
        req.protected = req.prefix_len = len(pages)
        req.prefix_pages = tuple(pages)
        return req.prefix_len
    swa_tree = hybrid.swa_on(s)
    nid, pages = match_prefix(s, req.fill[:_key_limit(req)], stamp=not swa_tree)
    usable = hybrid.swa_match_len(s, pages)
    req.swa_branching_seqlen = hybrid.swa_branching_seqlen(s, len(pages) * s.cfg.page_size, usable)
    if usable < len(pages) * s.cfg.page_size or swa_tree:
        # SWARadixCache `_match_post_processor` (0.5.23's too: it stamps `best_match_node`
        # and its ancestors, the SWA validator's last valid node): only the usable node
        # and its parents are touched (`reset_node_and_parents_mru`), after the walk's splits
        nid, pages = match_prefix(s, req.fill[:usable])
        hybrid.swa_refresh(s, nid)          # 0.5.23: MATCH_END from `best_match_node`
    req.last_node = ("node", nid)
    req.protected = len(pages) * s.cfg.page_size
    req.prefix_len = req.protected
    req.prefix_pages = tuple(pages)    # prefix_indices, written into the row at alloc
    return req.prefix_len


def _match_mamba_tree(s: State, req: Req) -> tuple[int, list]:
    """0.5.23 `_match_tree` with a Mamba component (P = 1): the walk splits but stamps
    nothing; the match ends at the deepest node with a state, which `_match_post_processor`
    stamps with its ancestors and moves to the Mamba MRU end; `finalize_match_result_in_cache`
    copies its state into a fresh slot for a request that holds none (evicting one state
    with the node locked when the pool is empty)."""
    last, _, pages = _walk(s, req.fill[:_key_limit(req)], stamp=False)
    best = mamba_tree.best_node(s, last)
    _match_post_stamp(s, best)
    if best == ROOT:
        return ROOT, []
    node = s.nodes[best]
    if req.mamba_pool_idx is None:
        if not s.mamba_free_slots:
            inc_lock_ref(s, ("node", best))
            evict_mamba(s, 1)
            dec_lock_ref(s, ("node", best))
        m = mamba_tree.alloc_slot(s)
        if m is None:
            raise ModelError("finalize_match_result_in_cache: Can not alloc mamba cache")
        req.mamba_pool_idx = m
    return best, pages[:len(node.path)]


def _match_post_stamp(s: State, best: int) -> None:
    """`_match_post_processor`'s touches: best and its ancestors get one access tick; the
    Mamba LRU takes best's state to the MRU end (0.5.23 `refresh_lru` MATCH_END), every
    state on its path (0.5.15 `reset_node_and_parents_mru`)."""
    s.tick += 1
    nid = best
    while nid != ROOT:
        n = s.nodes[nid]
        n.tick = s.tick
        nid = n.parent
    if best == ROOT:
        return
    if mamba_tree.wrapper_rules(s):
        mamba_tree.touch_path(s, best)
    else:
        mamba_tree.touch(s, s.nodes[best])


def _mamba_revert_cow(s: State, req: Req) -> None:
    """A request the round does not add: `get_new_batch_prefill` frees the copy-on-write
    slot of a request without a session ("revert matched mamba idx")."""
    if mamba_tree.on(s) and req.session is None and req.mamba_pool_idx is not None:
        hybrid.free_mamba(s, req)


def _new_tokens_needed(s: State, prefix: int, end: int) -> int:
    P = s.cfg.page_size
    return pages_needed_extend(prefix, end, P) * P


def _schedule(s: State, req: Req, admit: bool) -> str:
    """`schedule(rid, admit)`: the prefill round of one request."""
    return _schedule_round(s, [req], None if admit else 0)


def _schedule_round(s: State, reqs: list, limit) -> str:
    """`Scheduler._get_new_batch_prefill_raw` (0.5.15 `scheduler.py` l.2753, 0.5.23
    l.4079-4330): the PrefillAdder loop admits a
    batch, one `prepare_for_extend` allocates it, then the result is processed request by
    request. "ok" when every request named was admitted, else "rejected"."""
    batch = _admit_round(s, reqs, limit)
    if batch:
        _prepare_for_extend(s, batch)
        _process_prefill_result(s, batch)
    return "ok" if len(batch) == len(reqs) else "rejected"


class _Budget:
    """What one PrefillAdder has left while it admits a round: rows, KV tokens (beyond
    what the live `available + evictable` shows: the admitted requests' page-ceiled
    extends) and the chunk (`rem_chunk_tokens`, None: no chunked prefill). Under priority
    scheduling also `memory_budget.total_offset`, which preemption reads: the running
    batch's remaining output, then each admitted request's charge."""

    def __init__(self, s: State):
        self.rows = len(s.free_rows)
        self.reserved = 0
        self.chunk = s.cfg.chunk_size
        self.offset = sum(s.unfiltered) + sum(running_offset(r) for r in dict.values(s.reqs)
                                              if r.phase == "decode") \
            if s.cfg.enable_priority_scheduling else 0
        self.preempted: list = []

    def spent(self) -> bool:
        """`budget_state() == OTHER` for the chunk: the next request is not considered."""
        return self.chunk is not None and self.chunk <= 0

    def charge(self, s: State, req: Req, prefix: int, end: int) -> None:
        """`_update_prefill_budget`: the page-ceiled extend from the chunk and KV budgets."""
        need = _new_tokens_needed(s, prefix, end)
        self.reserved += need
        if req.row is None:
            self.rows -= 1
        if self.chunk is not None:
            self.chunk -= ceil_align(end - prefix, s.cfg.page_size)
        if s.cfg.enable_priority_scheduling:   # PrefillBudget.reserve: the page-ceiled
            P = s.cfg.page_size                 # extend, a page, and max_new_tokens
            self.offset += ceil_align(end - prefix, P) + P + \
                (min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS) if end == req.seqlen else 0)


def _admit_round(s: State, reqs: list, limit) -> list:
    """The PrefillAdder loop: the chunked request first (`add_chunked_req`), then each
    waiting request matched and admitted in order (`add_one_req`) until one is refused
    or the chunk budget is spent. Returns the batch: (req, prefix_len, extend end)."""
    if s.cfg.filter_before_prefill:
        update_running_batch(s)
    budget = _Budget(s)
    batch = []
    for i, req in enumerate(reqs):
        if budget.spent():
            break
        if req.phase == "prefill":
            item = _add_chunked_req(s, req, budget, refused=limit is not None and i >= limit)
        else:
            if s.cfg.enable_priority_scheduling and budget.rows <= 0 and \
                    not preempt_to_schedule(s, req, budget):
                break           # batch_is_full, and nothing to preempt for it
            item = _add_one_req(s, req, budget, refused=limit is not None and i >= limit)
            if item is None:
                break
        if item is not None:
            batch.append(item)
            budget.charge(s, *item)
            if item[2] < item[0].seqlen and req.phase != "prefill":
                break           # the new chunked request: rem_chunk_tokens is spent
    for victim in budget.preempted:     # the preempted re-enter the waiting queue
        enter_waiting_queue(s, victim)
    return batch


# -- priority scheduling: preemption (0.5.23 schedule_policy.py l.1707-1777) -----------

CLIP_MAX_NEW_TOKENS = 4096
"""`SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION`'s default: the scheduler's estimates clip
max_new_tokens there."""


def running_batch(s: State) -> list:
    """The running batch's live requests: those decoding (a finished request still in the
    batch until `update_running_batch` filters it is in `s.unfiltered` alone)."""
    return [s.reqs[rid] for rid in s.reqs if dict.__getitem__(s.reqs, rid).phase == "decode"]


def running_offset(r: Req) -> int:
    """`PrefillAdder._get_running_request_total_token_offset`: the output a running
    request may still produce (the estimate's `new_token_ratio` taken as 1)."""
    return min(r.max_new_tokens - len(r.output), CLIP_MAX_NEW_TOKENS)


def preemption_order(reqs: list) -> list:
    """`preempt_to_schedule`'s sort: the lowest priority first, then the latest to have
    entered the waiting queue."""
    return sorted(reqs, key=lambda r: (r.priority, -r.entered))


def preempt_to_schedule(s: State, req: Req, budget: _Budget) -> bool:
    """`PrefillAdder.preempt_to_schedule`, when the round's rows are spent: running
    requests whose priority is lower by more than the threshold, in `preemption_order`, until their remaining output
    covers what `req` needs beyond `rem_total_tokens` (its fill as last built, less its
    last match, plus max_new_tokens). Finished requests still in the batch are skipped
    (the two-phase finish: their KV is already released). True when that many were
    found: each is released as a retraction (`release_req`) and re-enters the waiting
    queue after the round; their rows count for the rest of the round."""
    short = len(req.fill) - req.prefix_len + min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS) \
        - (available_size(s) + s.evictable_size - budget.offset)
    victims = []
    for r in preemption_order(running_batch(s)):
        if req.priority - r.priority <= s.cfg.priority_scheduling_preemption_threshold:
            break
        victims.append(r)
        short -= running_offset(r)
        if short <= 0:
            break
    if not victims or short > 0:
        return False
    rows = len(s.free_rows)
    for r in victims:
        budget.offset -= running_offset(r)
        _retract(s, r)
    budget.rows += len(s.free_rows) - rows
    budget.preempted += victims
    return True


def preempted_by(s: State, op: O.Op) -> list:
    """The running requests that `op`, a prefill round (or `schedule`) enabled in s,
    preempts (none when the step stops at an assertion)."""
    if not (s.cfg.enable_priority_scheduling and isinstance(op, (O.Schedule, O.ScheduleRound))):
        return []
    running = [rid for rid, r in dict.items(s.reqs) if r.phase == "decode"]
    if not running or not enabled(s, op):
        return []
    try:
        after, _ = step(s, op)
    except ModelError:      # the step itself reports it
        return []
    return [rid for rid in running
            if rid in after.reqs and dict.__getitem__(after.reqs, rid).phase == "queued"]


def _entered(s: State, req: Req, priority: int) -> None:
    """A new request reaches `_add_request_to_queue`: its priority, then its entry."""
    req.priority = priority
    enter_waiting_queue(s, req)


def enter_waiting_queue(s: State, req: Req) -> None:
    """`_add_request_to_queue`'s `set_wait_queue_entry_time` (a new request, a retracted
    or preempted one re-entering): the latest entry. Kept as a dense rank among the live
    requests, so that two states differing only in their clocks are one state."""
    if not s.cfg.enable_priority_scheduling:
        return
    req.entered = len(s.reqs) + 1
    order = sorted((rid for rid in s.reqs if dict.__getitem__(s.reqs, rid).entered),
                   key=lambda rid: dict.__getitem__(s.reqs, rid).entered)
    for rank, rid in enumerate(order, 1):
        if dict.__getitem__(s.reqs, rid).entered != rank:
            s.reqs[rid].entered = rank


def _add_one_req(s: State, req: Req, budget: _Budget, refused: bool):
    """`init_next_round_input` (the match) and `add_one_req`: the admission lock, then the
    row, Mamba, KV (available + evictable less the round's reservations), SWA and chunk
    budgets; a refused request gives its lock back. None when it is refused."""
    prefix = _match(s, req)
    end = chunk_end(prefix, req.seqlen, budget.chunk, s.cfg.page_size)
    if refused or end <= prefix < req.seqlen:
        _mamba_revert_cow(s, req)
        return None
    inc_lock_ref(s, req.last_node)
    was_locked, req.locked = req.locked, True   # the budget is read under the lock
    hybrid.note_swa_lock(s, req)                # (its SWA part too: `_lock_node`)
    need = _new_tokens_needed(s, prefix, end)
    if req.row is None and budget.rows < 1 and budget.preempted and accepts(s, "U9"):
        raise ModelError(f"{NO_ROW}: req {req.rid} is admitted after preempting "
                         f"{[r.rid for r in budget.preempted]}, whose rows their session slots "
                         f"keep", upstream=(NO_ROW,))
    # FIX(U9): the rows are checked again after a preemption (a preempted streaming
    # turn's row stays with its session's slot)
    if (req.row is None and budget.rows < 1) or hybrid.mamba_short(s, req) or \
            need + budget.reserved > available_size(s) + s.evictable_size or \
            hybrid.swa_admission_short(s, need + budget.reserved):
        dec_lock_ref(s, req.last_node)
        req.locked = was_locked
        _mamba_revert_cow(s, req)
        return None
    if s.cfg.era == "borrow" and req.last_node == ("virtual", req.session):
        req.locked = False              # cache.lock(virtual node) is None: nothing held
    return req, prefix, end


def _add_chunked_req(s: State, req: Req, budget: _Budget, refused: bool):
    """The chunked request's next round: its last chunk is checkpointed
    (`cache_unfinished_req(chunked=True)`), `init_next_round_input()` refreshes its fill
    without a match, and `add_chunked_req` sizes the chunk by what the round has left.
    None when the KV budget does not take it (it stays the chunked request)."""
    _checkpoint_chunk(s, req)
    prefix = req.extend_end
    end = chunk_end(prefix, req.seqlen, budget.chunk, s.cfg.page_size)
    if refused or end <= prefix or \
            _new_tokens_needed(s, prefix, end) + budget.reserved > available_size(s) + s.evictable_size:
        return None
    return req, prefix, end


def _checkpoint_chunk(s: State, req: Req) -> None:
    """Before a chunked request's next chunk: `cache_unfinished_req(chunked=True)`
    (borrow era: `checkpoint_kv_cache`), then `init_next_round_input()` (no re-match)."""
    if s.cfg.era == "borrow":
        _checkpoint_borrow(s, req)
    elif not _is_streaming(req):
        cache_unfinished_req_inner(s, req)      # cache_unfinished_req(chunked=True)
    refresh_fill(s, req)


def _prepare_for_extend(s: State, batch: list) -> None:
    """`ScheduleBatch.init_new(can_run_list).prepare_for_extend()` -> `alloc_for_extend`
    for the whole batch: `alloc_req_slots` (rows; a held row is reused), one eviction for
    the batch's extend tokens (+ a page a request when P > 1), one allocation taking each
    request's pages in batch order, `write_cache_indices`; then per request the forward's
    KV, committed = allocated = the extend end, and the session hook
    (`maybe_hand_to_session`, borrow era)."""
    for req, prefix, _ in batch:
        req.is_retracted = False
        if req.row is None:
            req.row = s.free_rows.pop(0)
            s.rows[req.row][:prefix // s.cfg.page_size] = req.prefix_pages
        elif not (req.committed > 0):
            raise ModelError(f"ReqToTokenPool.alloc: req {req.rid} reuses row {req.row} "
                             f"with kv_committed_len=0 and no chunk in flight",
                             upstream=(REUSED_ROW_014, REUSED_ROW_019))
        if mamba_tree.on(s):            # `allocation.ensure_mamba_capacity` (0.5.23),
            short = mamba_tree.alloc_req_slots_evict(s) if mamba_tree.wrapper_rules(s) else \
                hybrid.mamba_needed(s, req) - len(s.mamba_free_slots)   # `alloc_req_slots`
            if short > 0:
                evict_mamba(s, short)
        hybrid.alloc_mamba(s, req)
    P = s.cfg.page_size
    evict_from_tree_cache(s, sum(end - prefix for _, prefix, end in batch)
                          + (len(batch) * P if P > 1 else 0))
    for req, prefix, end in batch:
        if not _alloc_extend(s, req.row, prefix, end, evict=False):
            raise ModelError(f"alloc_for_extend failed after admission for req {req.rid}")
    for req, prefix, end in batch:
        _write_kv(s, req.row, prefix, end, req.fill)     # the forward's input: get_fill_ids()
        req.committed = req.allocated = req.extend_end = end
        hybrid.set_swa_evict_floor(s, req)
        if s.cfg.era == "borrow":
            _take(s, req)


def _process_prefill_result(s: State, batch: list) -> None:
    """`process_batch_result_prefill`, in batch order: a request whose prompt is done
    samples its first token (or finishes); the chunked request waits for its next round."""
    for req, _, end in batch:
        req.phase = "prefill"
        if end == req.seqlen:
            _prefill_done(s, req)


def _take(s: State, req: Req) -> None:
    """Borrow era `StreamingSession.take` (alloc_for_extend's maybe_hand_to_session): a
    streaming turn's first row allocation hands its record and admission lock to a new
    slot that publishes the prompt; the turn borrows the record from then on."""
    if not _is_streaming(req):
        return
    slot = s.slots.get(req.session)
    if slot is not None:
        if slot.row != req.row and accepts(s, "U7"):
            raise ModelError(f"StreamingSession.take: session_id={str(req.session)!r} already "
                             f"has a slot (req {req.rid} matched before its session's turn "
                             f"took it in this round)", upstream=("already has a slot",))
        return          # FIX(U7): a request not on its session's slot leaves it alone
    s.slots[req.session] = Slot(row=req.row, committed=req.committed, allocated=req.allocated,
                                protected=req.protected,
                                last_node=req.last_node if req.locked else None, publishes=True,
                                swa_uuid_for_lock=req.swa_uuid_for_lock if req.locked else None)
    hybrid.move_mamba(s.slots[req.session], req, clear_src=False)  # one record: Mamba refs too
    req.locked = False
    req.last_node = ("virtual", req.session)


def _checkpoint_borrow(s: State, req: Req) -> None:
    """Borrow era `checkpoint_kv_cache` (after a chunk and after the prefill): a plain
    request publishes into the tree; a turn publishes only while its slot publishes the
    prompt (`try_checkpoint`: the slot's lock goes to the insert and comes back moved)."""
    slot = s.slots.get(req.session) if _is_streaming(req) else None
    if slot is None:
        cache_unfinished_req_inner(s, req)
        return
    if not slot.publishes:
        return
    req.last_node, req.locked = slot.last_node, slot.last_node is not None
    slot.last_node = None
    cache_unfinished_req_inner(s, req)
    slot.last_node, req.locked = req.last_node, False
    slot.swa_uuid_for_lock = req.swa_uuid_for_lock      # the SWA boundary moves with the lock
    req.last_node = ("virtual", req.session)
    slot.protected = req.protected


def _sync_borrowed(s: State, acting=()) -> None:
    """Borrow era: a turn runs on its slot's record (`req.kv is slot.kv`), so the slot's
    lengths are the turn's while it borrows it. Two turns on one slot (only after an
    accepted U1) share that one record: the operation's own turns (`acting`: their rids)
    wrote it last, or, if that turn no longer borrows it (finished, retracted), the slot
    holds what it wrote. A
    turn detached from its session after it borrowed (a second `finish_req` under
    accepted U2) still holds the record: its virtual anchor names the slot."""
    borrowers = []
    for rid, r in list(dict.items(s.reqs)):     # read first: only borrowers are copied
        sid = r.last_node[1] if r.last_node and r.last_node[0] == "virtual" else None
        slot = dict.get(s.slots, sid)
        if slot is not None and r.row is not None and r.row == slot.row:
            r, slot = s.reqs[rid], s.slots[sid]
            if r.rid in acting:
                slot.committed, slot.allocated, slot.protected = r.committed, r.allocated, r.protected
                hybrid.sync_borrowed(slot, r, acting=True)
            borrowers.append((r, slot))
    for r, slot in borrowers:
        r.committed, r.allocated, r.protected = slot.committed, slot.allocated, slot.protected
        hybrid.sync_borrowed(slot, r, acting=False)


def _prefill_done(s: State, req: Req) -> None:
    """The last chunk's result: a pre-aborted request finishes; otherwise a token is
    sampled. If that token reaches max_new_tokens, `check_finished` finishes the
    request right here, before any `cache_unfinished_req`: a first turn then hands the
    slot its admission lock and match length (DOMAIN.md 4.3). Otherwise
    `cache_unfinished_req(req)` publishes the prompt."""
    if req.to_finish:
        _finished(s, req, "abort")
        release_kv_cache(s, req)
        del s.reqs[req.rid]
        return
    req.output.append(SAMPLED_TOKEN)
    if len(req.output) >= req.max_new_tokens:
        _check_finished(s, req)
        return
    if s.cfg.era == "borrow":
        _checkpoint_borrow(s, req)
    elif not (_is_streaming(req) and req.session in s.slots):
        cache_unfinished_req_inner(s, req)
    req.phase = "decode"


def _prefill_chunk(s: State, req: Req) -> str:
    _checkpoint_chunk(s, req)
    prefix = req.extend_end
    end = chunk_end(prefix, req.seqlen, s.cfg.chunk_size, s.cfg.page_size)
    if not _alloc_extend(s, req.row, prefix, end, mamba_evict=mamba_tree.wrapper_rules(s)):
        return "oom"
    _write_kv(s, req.row, prefix, end, req.fill)     # the forward's input: get_fill_ids()
    req.committed = req.allocated = req.extend_end = end
    hybrid.set_swa_evict_floor(s, req)
    if end == req.seqlen:
        _prefill_done(s, req)
    return "ok"


def _decode(s: State, req: Req, token: int) -> str:
    pos = req.committed
    if not _alloc_decode(s, req.row, pos):
        return "oom"
    update_running_batch(s)
    hybrid.free_swa_out_of_window_slots(s, req)
    hybrid.decode_batch_done(req)
    _write_kv(s, req.row, pos, pos + 1, req.fill_ids)
    req.committed += 1
    req.allocated = max(req.allocated, req.committed)
    req.output.append(token)
    _check_finished(s, req)
    return "ok"


def _decode_round(s: State, reqs: list) -> str:
    """`update_running_batch` then the decode step over the batch (`reqs`, batch order):
    `check_decode_mem` (it evicts what the step needs), on a shortfall `retract_decode`;
    `prepare_for_decode` (`alloc_for_decode` of the whole batch: one eviction, then a
    page for each request whose next token starts one); the forward writes each last
    token's KV; `process_batch_result_decode` appends the sampled token and finishes the
    requests at max_new_tokens, in batch order. "ok", or "oom" when a request had to be
    retracted or aborted."""
    update_running_batch(s)
    out = "ok"
    if not _check_decode_mem(s, reqs):
        reqs = _retract_decode(s, reqs)
        out = "oom"
    P = s.cfg.page_size
    evict_from_tree_cache(s, len(reqs) * P)
    for req in reqs:
        if not _alloc_decode(s, req.row, req.committed, evict=False):
            raise ModelError(f"alloc_for_decode failed after check_decode_mem for req {req.rid}")
    for req in reqs:
        pos = req.committed
        _write_kv(s, req.row, pos, pos + 1, req.fill_ids)
        req.committed += 1
        req.allocated = max(req.allocated, req.committed)
        req.output.append(SAMPLED_TOKEN)
    for req in reqs:
        _check_finished(s, req)
    return out


def new_tokens_required_next_decode(s: State, reqs: list) -> int:
    """`ScheduleBatch.new_tokens_required_next_decode` (no speculative decoding): a page
    for each request whose next token starts one."""
    P = s.cfg.page_size
    return sum(P for r in reqs if r.committed % P == 0)


def _check_decode_mem(s: State, reqs: list) -> bool:
    """`check_decode_mem` (`check_decode_capacity`): evict what the step needs, then
    whether it fits."""
    need = new_tokens_required_next_decode(s, reqs)
    evict_from_tree_cache(s, need)
    return available_size(s) >= need


def retraction_order(reqs: list) -> list:
    """`_get_decode_retraction_order`: most-preferred to keep first (most output tokens,
    then the shortest prompt; a stable sort, reversed); `retract_decode` pops from the
    end."""
    return sorted(reqs, key=lambda r: (len(r.output), -len(r.origin)), reverse=True)


def _retract_decode(s: State, reqs: list) -> list:
    """`retract_decode` (0.5.15 `schedule_batch.py` l.2470-2530, 0.5.23 l.3451-3540): at
    least one victim, then more until the rest fits; the last request is kept, and
    aborted when even it does not fit. Returns the batch left, in batch order."""
    kept = retraction_order(reqs)
    first = True
    while first or not _check_decode_mem(s, kept):
        if len(kept) == 1:
            break
        first = False
        victim = kept.pop()
        _retract(s, victim)
        enter_waiting_queue(s, victim)
    if len(kept) <= 1 and not _check_decode_mem(s, kept):
        last = kept.pop()               # FINISH_ABORT, released as a retraction (release_req),
        _retract(s, last)               # never re-queued: it leaves as a queued abort does
        _abort_queued(s, last)
    left = {r.rid for r in kept}
    return [r for r in reqs if r.rid in left]


def _check_finished(s: State, req: Req) -> None:
    """`check_finished` in the step's result processing: a request whose output reaches
    max_new_tokens finishes in that same step (a stop token is the explicit `finish`)."""
    if len(req.output) >= req.max_new_tokens:
        _finish(s, req)


def _spec_decode(s: State, req: Req, drafts: int, accepted: int, token: int) -> str:
    need = req.committed + 2 * (drafts + 1)
    if need > req.allocated:
        if not _alloc_extend(s, req.row, req.allocated, need):
            return "oom"
        req.allocated = need
    update_running_batch(s)
    hybrid.free_swa_out_of_window_slots(s, req)
    hybrid.decode_batch_done(req)
    req.output.extend([token] * (accepted + 1))
    start = req.committed
    req.committed += accepted + 1
    _write_kv(s, req.row, start, req.committed, req.fill_ids)
    _check_finished(s, req)
    return "ok"


def _lookahead(s: State, req: Req) -> None:
    """Overlap (and speculative verify in flight): the step after the last one has
    already computed the last token's KV, so committed == seqlen at finish/retract."""
    if not (s.cfg.overlap or s.cfg.spec_enabled) or req.committed >= req.seqlen:
        return
    pos = req.committed
    if pos >= req.allocated:
        if not _alloc_decode(s, req.row, pos):
            return                      # memory short: the step was not prepared
        req.allocated = pos + 1
        if hybrid.swa_on(s):            # a prepared decode batch: `maybe_evict_swa` too
            hybrid.free_swa_out_of_window_slots(s, req)
            hybrid.decode_batch_done(req)
    _write_kv(s, req.row, pos, pos + 1, req.fill_ids)
    req.committed = pos + 1


def _finish(s: State, req: Req) -> None:
    _lookahead(s, req)
    _stays_in_batch(s, req)
    _finished(s, req, "length")
    req.finished_len = min(len(req.output), req.max_new_tokens)
    release_kv_cache(s, req)
    del s.reqs[req.rid]


def _stays_in_batch(s: State, req: Req) -> None:
    """The two-phase finish: a decoding request that finishes is released at once
    (`process_batch_result`) but stays in the running batch, its remaining output still
    counted by the next PrefillAdder, until `update_running_batch` filters it."""
    if s.cfg.enable_priority_scheduling and req.phase == "decode":
        s.unfiltered = tuple(sorted(s.unfiltered + (running_offset(req),)))


def update_running_batch(s: State) -> None:
    """A decode step begins: `filter_batch` drops the finished requests."""
    s.unfiltered = ()


def _finished(s: State, req: Req, reason: str) -> None:
    """`finished_reason` is set; a session whose req_nodes' request it is (still live only
    after an accepted U2) no longer waits for it to close, and keeps the checkpoint the
    request's last output gives (a turn detached by a second `finish_req` finishes as a
    plain request, but req_nodes still reads its arrays)."""
    req.finished_reason = reason
    for sess in s.sessions.values():
        if req.req_nodes and sess.last_rid == req.rid:
            sess.last_unfinished = False
            if accepts(s, "U2"):        # req_nodes' request is live only after a U2 retract
                _sync_checkpoint(sess, req)


def _abort_running(s: State, req: Req) -> None:
    _stays_in_batch(s, req)
    _finished(s, req, "abort")
    release_kv_cache(s, req)
    del s.reqs[req.rid]


def _abort_queued(s: State, req: Req) -> None:
    """FIX(H5): a queued streaming turn clears the in-flight mark; a retracted one
    also drops the partial turn parked in its slot (FIX(H4) follow-up)."""
    if _is_streaming(req):
        sid = req.session
        if not (s.cfg.era == "wrapper" and accepts(s, "U3")):  # U3: 0.5.15 makes no session call
            _drop_parked_turn(s, sid, req)
            _abort_req(s, sid, req, unconditional=s.cfg.era == "borrow" and accepts(s, "U6"))
        if accepts(s, "M2") and queued_borrow_holds_mamba(s, req):
            try_cache_finished_req(s, req)      # M2: release_kv_cache -> finish_req
            del s.reqs[req.rid]
            return
    if mamba_tree.on(s) and req.row is None and req.mamba_pool_idx is not None:
        hybrid.free_mamba(s, req)       # `abort_request`: release_kv_cache(checkpoint=False)
    del s.reqs[req.rid]


def queued_borrow_holds_mamba(s: State, req: Req) -> bool:
    """Finding M2's trigger (docs/upstream-findings.md): a queued streaming turn runs on
    its slot's record (matched: it holds the slot's row) and that record holds a Mamba
    state, so `abort_request`'s "For mamba radix cache" branch calls `release_kv_cache`
    (0.5.23 scheduler.py l.5716-5721, `checkpoint=False`, whose `claim_kv_row` reaches
    `try_cache_finished_req`; 0.5.15 l.3905-3910, `is_insert=False`, the wrapper's
    `cache_finished_req`) with no FINISH_ABORT set: the finish path."""
    return _is_streaming(req) and req.row is not None and req.mamba_pool_idx is not None


ABORT_STUB_ORIGIN = (0,)
"""`Req.set_finish_with_abort` rebinds origin_input_ids to `array("q", [0])`."""


def _pre_abort(req: Req) -> None:
    """FINISH_ABORT on a queued request that has not been matched. A fresh request
    (never run) is aborted by upstream only through `Req.set_finish_with_abort`
    (validation in `handle_generate_request`, the grammar queue), which rebinds
    origin_input_ids to a private one-token array; a retracted turn aborted by the
    client in the iteration that retracted it (abort method 3: `to_finish` only, then
    `retract_decode`) keeps its arrays."""
    req.to_finish = True
    if not req.is_retracted:
        req.origin = ABORT_STUB_ORIGIN
        req.array_of = None


def _retract(s: State, req: Req) -> None:
    """`release_req` + `reset_for_retract`."""
    _lookahead(s, req)
    if _is_streaming(req):
        req.finished_len = len(req.output)
        try_cache_finished_req(s, req, checkpoint=accepts(s, "U2"))
        req.finished_len = None
    else:
        _release_plain(s, req, is_insert=False)
    req.committed = req.allocated = req.protected = req.prefix_len = req.extend_end = 0
    req.last_node = None
    req.locked = False
    req.committed_freed = req.overallocated_freed = False
    hybrid.reset_for_retract(req)
    req.is_retracted = True
    req.phase = "queued"


def _submit_turn(s: State, op: O.SubmitTurn) -> str:
    sess = s.sessions.get(op.sid)
    # handle_generate_request: a session not open ("session id ... does not exist") or
    # closing ("close was requested") gets a plain aborted request
    if sess is None or sess.close_pending:
        s.reqs[op.rid] = Req(op.rid, None, False, True, (0,), [], op.max_new_tokens, to_finish=True)
        return "stub"
    if sess.inflight_rid is not None:
        s.reqs[op.rid] = Req(op.rid, op.sid, True, True, (0,), [], op.max_new_tokens,
                             to_finish=True)
        return "stub"
    origin = sess.checkpoint + tuple(op.new_tokens)
    array = sess.last_array if sess.checkpoint else None
    fill, fill_of = _carry_fill(s, sess, tuple(op.new_tokens)) if sess.checkpoint else ((), None)
    if array is not None and _aliases_arrays(s):
        _share_token_arrays(s, array, origin)
    s.reqs[op.rid] = Req(op.rid, op.sid, True, False, origin, [], op.max_new_tokens,
                         array_of=array, fill=fill, fill_of=fill_of)
    sess.inflight_rid = op.rid
    return "ok"


def _share_token_arrays(s: State, array: int, origin: tuple) -> None:
    """Upstream `Session._share_token_arrays`: the new turn's origin_input_ids is the
    checkpoint request's (req_nodes') array, trimmed to the committed length and
    extended in place, so every live request still on that array now reads the new
    turn's prompt. A turn built on an earlier checkpoint is on an earlier request's
    array and keeps its prompt: one session can hold several arrays."""
    for r in s.reqs.values():
        if r.array_of == array:
            r.origin = origin


# full_untruncated_fill_ids (divergences O1/O2, docs/upstream-findings.md): a third
# token array per request, `create_req` carries req_nodes' request's onto the new turn
# (`carry_fill`) and `refresh_fill_ids` extends by a length rule only. The match, the
# extend's forward and an unfinished insert read it (0.5.23: a finished insert too);
# under accepted U1/U2 a later turn's create_req rewrites a live turn's prompt in place
# but not its fill array, so the two may part. Without U1/U2 no other live request holds
# a request's arrays, so the fill always reads as origin + output.

def carried_fill(fill: tuple, committed_fill_len: int, committed_origin_len: int,
                 out_tail: tuple, new_tokens: tuple) -> tuple:
    """`Session._share_token_arrays`' `carry_fill` (0.5.15 and 0.5.23 alike): req_nodes'
    request's fill array is trimmed to `committed_fill_len` in place; if what it holds
    past the committed origin (`baked`) is a prefix's length of the last output, it is
    extended in place by the rest of that output and the new input and becomes the new
    turn's fill. Returns (the array's tokens after, carried?)."""
    kept = fill[:committed_fill_len]
    baked = len(kept) - committed_origin_len
    if 0 <= baked <= len(out_tail):
        return kept + out_tail[baked:] + new_tokens, True
    return kept, False


def refreshed_fill(fill: tuple, origin: tuple, output) -> Optional[tuple]:
    """`Req.refresh_fill_ids` (0.5.15 `_refresh_fill_ids`): the outputs already in the
    fill are inferred from lengths alone; if that count is possible the array is
    extended in place by the rest (the tokens after, returned), else None: upstream
    rebuilds a private `origin + output`. (Its aliasing branch, fill *is* origin, needs
    pipeline parallelism: not driven.)"""
    have = len(fill) - len(origin)
    if 0 <= have <= len(output):
        return fill + tuple(output[have:])
    return None


def _write_fill(s: State, fid: Optional[int], tokens: tuple, own: Optional[Req] = None) -> None:
    """An in-place change of fill array `fid` (`own`: the request acting on it): every
    session whose req_nodes' request holds it reads the change; under accepted U1/U2
    (`_aliases_arrays`) every other live request on it too."""
    if own is not None:
        own.fill = tokens
    if fid is None:
        return
    for sid, x in list(dict.items(s.sessions)):        # read first: copy only holders
        if x.last_fill == fid:
            s.sessions[sid].fill = tokens
    if _aliases_arrays(s):
        for rid, r in list(dict.items(s.reqs)):
            if r.fill_of == fid and r is not own:
                s.reqs[rid].fill = tokens


def _new_fill_id(s: State, rid: int) -> int:
    """An id for a request's private fill array once a session holds it: the rid, or past
    every id in use if that is taken (an array the request left behind, still shared)."""
    used = {r.fill_of for r in dict.values(s.reqs)} | \
        {x.last_fill for x in dict.values(s.sessions)}
    used.discard(None)
    return rid if rid not in used else max(used | {rid}) + 1


def refresh_fill(s: State, req: Req) -> None:
    """`refresh_fill_ids` (`init_next_round_input`, the chunked request's next round;
    0.5.23's `release_kv_cache` before a finished insert). A rebuild leaves the shared
    array; a session whose req_nodes' request this is follows it to the new one
    (`last_req.full_untruncated_fill_ids`)."""
    tokens = refreshed_fill(req.fill, req.origin, req.output)
    if tokens is not None:
        if tokens != req.fill:
            _write_fill(s, req.fill_of, tokens, req)
        return
    req.fill, req.fill_of = req.fill_ids, None
    for sid, x in list(dict.items(s.sessions)):
        if req.req_nodes and x.last_rid == req.rid:
            if req.fill_of is None:
                req.fill_of = _new_fill_id(s, req.rid)
            x = s.sessions[sid]
            x.last_fill, x.fill = req.fill_of, req.fill


def _carry_fill(s: State, sess: Session, new_tokens: tuple) -> tuple:
    """create_req's carry_fill: (the new turn's fill, its array id); an empty private
    array (None) when it is not carried. Requires a checkpoint (`committed_origin_len`
    set by a finish_req)."""
    out_tail = sess.checkpoint[len(sess.committed_origin):]
    tokens, carried = carried_fill(sess.fill, sess.committed_fill_len,
                                   len(sess.committed_origin), out_tail, new_tokens)
    _write_fill(s, sess.last_fill, tokens)
    return (tokens, sess.last_fill) if carried else ((), None)


def fill_key(s: State, req: Req, finished: bool) -> tuple:
    """The tokens a tree insert keys req's KV by: `full_untruncated_fill_ids`, except
    0.5.15's `cache_finished_req`, which keys by `origin_input_ids + output_ids`
    (radix_cache.py l.451; 0.5.23's release refreshes the fill and checkpoints it)."""
    return req.fill_ids if finished and s.cfg.era == "wrapper" else req.fill


def _close_session(s: State, sid: int) -> str:
    sess = s.sessions[sid]
    if _close_waits(sess):
        sess.close_pending = True
        return "deferred"
    release_session(s, sid)
    del s.sessions[sid]
    return "ok"


# ---------------------------------------------------------------------------
# guards and the step function
# ---------------------------------------------------------------------------

def _sid_in_use(s: State, sid: int) -> bool:
    return sid in s.sessions or sid in s.slots or any(r.session == sid for r in dict.values(s.reqs))


def _fits_context(s: State, input_len: int, max_new: int) -> bool:
    return input_len + max_new + 2 * (s.cfg.max_drafts + 1) + 1 <= s.cfg.max_context_len


CLIENT_ABORTS = (O.AbortQueued, O.PreAbort, O.AbortRunning)
"""The three phases of upstream's one client abort (`Scheduler.abort_request`)."""


def refused(s: State, op: O.Op) -> Optional[str]:
    """Upstream's answer to a client request it receives but turns down, changing no
    state: the outcome "refused", or None when op is not one of these. Opening a session
    id already open (`SessionController.open`: "already exist, cannot open", success
    False); closing one that is not open (`close`: "does not exist, cannot delete");
    aborting a request that is not live (`abort_request` finds no such rid: it finished
    or never came). A turn for a session that is not open is answered with an aborted
    stub instead (`_submit_turn`)."""
    kind = _REFUSABLE.get(type(op))
    if kind is None:
        return None
    if kind == "open":
        return "refused" if op.sid in s.sessions else None
    if kind == "close":
        return "refused" if op.sid not in s.sessions else None
    return "refused" if op.rid not in s.reqs else None


_REFUSABLE = {O.OpenSession: "open", O.CloseSession: "close",
              **{t: "abort" for t in CLIENT_ABORTS}}
"""The operations `refused` can answer, by exact type (the operations are final classes)."""


def refusal(s: State, op: O.Op) -> Optional[str]:
    """The guard of each operation (when upstream's scheduler could issue it, or a client
    send it: `refused`): None when op is enabled in s, else the reason the guard refuses
    it, naming the part that fails. One guard per operation (`_GUARDS`, by type: the
    explorer asks about twenty a state); an operation on a request first needs it live."""
    if refused(s, op):
        return None
    guard = _GUARDS.get(type(op))
    if guard is not None and not guard[1]:
        return guard[0](s, op)
    rid = getattr(op, "rid", None)
    req = dict.get(s.reqs, rid) if rid is not None else None      # reads: no copy-on-write
    if req is None:
        return f"request {rid} does not exist (never submitted, or already finished)"
    if guard is None:
        return f"unknown operation {op.name!r}"
    return guard[0](s, op, req)


def _open_refusal(s: State, op: O.OpenSession) -> Optional[str]:
    return f"session {op.sid} is already in use" if _sid_in_use(s, op.sid) else None


def _turn_refusal(s: State, op: O.SubmitTurn) -> Optional[str]:
    sess = dict.get(s.sessions, op.sid)
    return (_new_request_refusal(s, op.rid, op.new_tokens, op.max_new_tokens, op.priority)
            or _context_refusal(s, len(sess.checkpoint if sess else ()) + len(op.new_tokens),
                                op.max_new_tokens))


def _request_refusal(s: State, op: O.SubmitRequest) -> Optional[str]:
    return (_new_request_refusal(s, op.rid, op.tokens, op.max_new_tokens, op.priority)
            or _context_refusal(s, len(op.tokens), op.max_new_tokens))


def _close_refusal(s: State, op: O.CloseSession) -> Optional[str]:
    return None                 # a closing session's close is deferred again (`_close`)


def _evict_refusal(s: State, op: O.Evict) -> Optional[str]:
    return None if op.num_tokens >= 1 else "evict needs num_tokens >= 1"


def _schedule_refusal(s: State, op: O.Schedule, req: Req) -> Optional[str]:
    return _phase_refusal(req, ("queued",)) or mamba_tree.cow_refusal(s, req)


def _abort_queued_refusal(s: State, op: O.AbortQueued, req: Req) -> Optional[str]:
    return _phase_refusal(req, ("queued",))


def _queue_reject_refusal(s: State, op: O.QueueReject, req: Req) -> Optional[str]:
    # at the queue door: not matched since it (re-)entered the queue (over-approximated:
    # any time before its next schedule, not only at the door)
    return (_phase_refusal(req, ("queued",))
            or (f"request {op.rid} has matched a prefix since it entered the queue"
                if req.last_node is not None else None))


def _pre_abort_refusal(s: State, op: O.PreAbort, req: Req) -> Optional[str]:
    # before matching: to_finish is set when a request is created or re-queued,
    # never on one that already matched (a restored request holds the slot's row)
    return (_phase_refusal(req, ("queued",))
            or (f"request {op.rid} is already marked to finish" if req.to_finish else None)
            or (f"request {op.rid} has already matched a prefix" if req.last_node is not None
                else None))


def _prefill_chunk_refusal(s: State, op: O.PrefillChunk, req: Req) -> Optional[str]:
    return _phase_refusal(req, ("prefill",)) or mamba_tree.chunk_refusal(s, req)


def _abort_running_refusal(s: State, op: O.AbortRunning, req: Req) -> Optional[str]:
    return _phase_refusal(req, ("prefill", "decode"))


def _decode_refusal(s: State, op: O.Decode, req: Req) -> Optional[str]:
    return (_phase_refusal(req, ("decode",))
            or ("config.spec_enabled is true: decode steps are spec_decode"
                if s.cfg.spec_enabled else None)
            or _output_refusal(req))


def _spec_decode_refusal(s: State, op: O.SpecDecode, req: Req) -> Optional[str]:
    cfg = s.cfg
    return (_phase_refusal(req, ("decode",))
            or (None if cfg.spec_enabled else "config.spec_enabled is false")
            or (None if 1 <= op.drafts <= cfg.max_drafts else
                f"drafts must be in [1, config.max_drafts={cfg.max_drafts}], got {op.drafts}")
            or (None if 0 <= op.accepted <= op.drafts else
                f"accepted must be in [0, drafts={op.drafts}], got {op.accepted}")
            or _output_refusal(req)
            or (None if req.committed + 2 * (op.drafts + 1) <= cfg.max_context_len else
                f"request {op.rid}'s drafts would pass config.max_context_len"))


def _schedule_round_refusal(s: State, op: O.ScheduleRound) -> Optional[str]:
    """Every request named is live and waiting, except that a round with a chunked
    request in flight continues it first (`add_chunked_req` before the waiting queue).
    With SWA or Mamba pools a round is one waiting request (their shared round budgets
    and the chunk's Mamba copy are not modelled in a round)."""
    if len(op.rids) > 1 and s.cfg.hybrid:
        return "a round of several requests is modelled without SWA and Mamba pools"
    chunked = [r.rid for r in dict.values(s.reqs) if r.phase == "prefill"]
    if chunked and s.cfg.hybrid:
        return "with SWA or Mamba pools the chunked request continues by prefill_chunk"
    for i, rid in enumerate(op.rids):
        req = dict.get(s.reqs, rid)
        if req is None:
            return f"request {rid} does not exist (never submitted, or already finished)"
        if i == 0 and chunked:
            if rid not in chunked:
                return (f"request {chunked[0]} is the chunked request in flight: the round "
                        f"continues it first")
            why = mamba_tree.chunk_refusal(s, req)
        else:
            why = _phase_refusal(req, ("queued",)) or mamba_tree.cow_refusal(s, req)
        if why:
            return why
    return None


def _decode_round_refusal(s: State, op: O.DecodeRound) -> Optional[str]:
    """Every request named is live and decoding, below its max_new_tokens; without
    speculative decoding and hybrid pools (the round's steps for those are not modelled)."""
    if s.cfg.spec_enabled:
        return "config.spec_enabled is true: decode steps are spec_decode"
    if s.cfg.hybrid:
        return "decode_round is modelled without SWA and Mamba pools"
    for rid in op.rids:
        req = dict.get(s.reqs, rid)
        if req is None:
            return f"request {rid} does not exist (never submitted, or already finished)"
        why = _phase_refusal(req, ("decode",)) or _output_refusal(req)
        if why:
            return why
    return None


def _decoding_refusal(s: State, op, req: Req) -> Optional[str]:
    return _phase_refusal(req, ("decode",))


_GUARDS = {
    # operation -> (guard, whether it acts on a live request: then guard(s, op, req))
    O.OpenSession: (_open_refusal, False), O.SubmitTurn: (_turn_refusal, False),
    O.SubmitRequest: (_request_refusal, False), O.CloseSession: (_close_refusal, False),
    O.Evict: (_evict_refusal, False),
    O.ScheduleRound: (_schedule_round_refusal, False),
    O.DecodeRound: (_decode_round_refusal, False),
    O.Schedule: (_schedule_refusal, True), O.AbortQueued: (_abort_queued_refusal, True),
    O.QueueReject: (_queue_reject_refusal, True), O.PreAbort: (_pre_abort_refusal, True),
    O.PrefillChunk: (_prefill_chunk_refusal, True),
    O.AbortRunning: (_abort_running_refusal, True), O.Decode: (_decode_refusal, True),
    O.SpecDecode: (_spec_decode_refusal, True), O.Finish: (_decoding_refusal, True),
    O.Retract: (_decoding_refusal, True),
}


def _new_request_refusal(s: State, rid: int, tokens, max_new: int, priority: int) -> Optional[str]:
    if rid in s.reqs:
        return f"request {rid} already exists"
    if priority and not s.cfg.enable_priority_scheduling:
        return ("a priority needs config.enable_priority_scheduling (without it upstream "
                "aborts the request as it enters the queue: queue_reject)")
    if len(tokens) < 1:
        return "a request needs at least one token"
    return None if max_new >= 1 else "max_new_tokens must be >= 1"


def _context_refusal(s: State, input_len: int, max_new: int) -> Optional[str]:
    if _fits_context(s, input_len, max_new):
        return None
    return (f"{input_len} input + {max_new} new tokens (+ draft room) do not fit "
            f"config.max_context_len={s.cfg.max_context_len}")


def _phase_refusal(req, phases: tuple) -> Optional[str]:
    if req.phase in phases:
        return None
    return f"request {req.rid} is {req.phase}, this operation needs it {' or '.join(phases)}"


def _output_refusal(req) -> Optional[str]:
    if len(req.output) < req.max_new_tokens:
        return None
    return f"request {req.rid} already has max_new_tokens={req.max_new_tokens} output tokens"


def enabled(s: State, op: O.Op) -> bool:
    """Whether the guard lets op run in s (see `refusal` for why not)."""
    return refusal(s, op) is None


def step(s: State, op: O.Op, checked: bool = False) -> tuple[State, str]:
    """Apply an enabled op to a copy of s; returns (new state, outcome). checked: the
    caller has just asked `enabled(s, op)` (the explorer), so the guard is not re-run."""
    if not checked and not enabled(s, op):
        raise ValueError(f"{op} is not enabled in this state")
    answer = refused(s, op)
    if answer:                          # turned down by upstream: nothing changes
        return s.clone(), answer
    s = s.clone()
    req = s.reqs.get(getattr(op, "rid", None))
    if isinstance(op, O.OpenSession):
        s.sessions[op.sid] = Session(op.sid)
        out = "ok"
    elif isinstance(op, O.SubmitTurn):
        out = _submit_turn(s, op)
        _entered(s, s.reqs[op.rid], op.priority)
    elif isinstance(op, O.SubmitRequest):
        s.reqs[op.rid] = Req(op.rid, None, False, False, tuple(op.tokens), [], op.max_new_tokens,
                             logprob_start=resolve_logprob_start(op.logprob_start_len, len(op.tokens)))
        _entered(s, s.reqs[op.rid], op.priority)
        out = "ok"
    elif isinstance(op, O.Schedule):
        out = _schedule(s, req, op.admit)
    elif isinstance(op, O.ScheduleRound):
        out = _schedule_round(s, [s.reqs[r] for r in op.rids], op.limit)
    elif isinstance(op, O.DecodeRound):
        out = _decode_round(s, [s.reqs[r] for r in op.rids])
    elif isinstance(op, O.PrefillChunk):
        out = _prefill_chunk(s, req)
    elif isinstance(op, O.Decode):
        out = _decode(s, req, op.token)
    elif isinstance(op, O.SpecDecode):
        out = _spec_decode(s, req, op.drafts, op.accepted, op.token)
    elif isinstance(op, O.Finish):
        _finish(s, req)
        out = "ok"
    elif isinstance(op, (O.AbortQueued, O.QueueReject)):
        _abort_queued(s, req)
        out = "ok"
    elif isinstance(op, O.PreAbort):
        _pre_abort(req)
        out = "ok"
    elif isinstance(op, O.AbortRunning):
        _abort_running(s, req)
        out = "ok"
    elif isinstance(op, O.Retract):
        _retract(s, req)
        enter_waiting_queue(s, req)
        out = "ok"
    elif isinstance(op, O.CloseSession):
        out = _close_session(s, op.sid)
    elif isinstance(op, O.Evict):
        evict(s, op.num_tokens)
        out = "ok"
    else:  # pragma: no cover - enabled() refuses unknown ops
        raise ValueError(f"unknown op {op!r}")
    for sid in list(s.sessions):        # the scheduler loop's maybe_reap, after the round:
        _maybe_close(s, sid)            # a deferred close whose turn has ended is carried out
    if s.cfg.era == "borrow":
        _sync_borrowed(s, op.rids if hasattr(op, "rids") else (getattr(op, "rid", None),))
    if s.cfg.accept:
        _sync_checkpoints(s)
    return s, out
