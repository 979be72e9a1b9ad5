"""Hybrid SWA models in the radix tree: SWA locks and tombstones, the SWA LRU, and how a match
and an insert meet the window (0.5.15 `SWARadixCache`; "borrow era" marks 0.5.23's SWA
component, by `config.era`)."""
from __future__ import annotations

from kvcheck.spec.pages import ceil_align, floor_align
from kvcheck.spec.state import Req, State
from kvcheck.spec.swa_pool import _free_swa_borrow, swa_available_size, swa_on


def swa_tree_on(s: State) -> bool:
    """The wrapper era's SWA tree (`SWARadixCache`): SWA on, era "wrapper"."""
    return s.cfg.swa_window > 0 and s.cfg.era != "borrow"


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
