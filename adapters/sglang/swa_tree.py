"""The SWA tree on a real release (0.5.15, wrapper era): `SWARadixCache` wrapped by
`StreamingSession`, over the real `SWATokenToKVPoolAllocator` (`hybrid.swa_allocator`).

Production pairs them so (`mem_cache/registry.py` `default_radix_cache_factory` with a
sliding-window model and `--enable-streaming-session`). The backend (backend.py) builds
them here and reads them back here; every call into them is upstream's own code: match
(`_match_prefix_helper`'s window rule), insert (tombstone nodes below
`swa_evicted_seqlen`, tombstone recovery), `inc_lock_ref` / `dec_lock_ref` (the full and
the SWA lock counts, `swa_uuid_for_lock`), `evict` (the full LRU, then the SWA LRU that
tombstones internal nodes), `mem_cache.common.evict_from_tree_cache` (each pool's
shortfall) and `ScheduleBatch.maybe_evict_swa` (the out-of-window free of decode). The
release's environment defaults are kept: `SGLANG_OPT_SWA_RADIX_CACHE_COMPACT`,
`SGLANG_OPT_SWA_SPLIT_LEAF_ON_INSERT` and `SGLANG_OPT_SWA_RELEASE_LEAF_LOCK_AFTER_WINDOW`
off, `SGLANG_SWA_EVICTION_INTERVAL` set to `config.swa_eviction_interval`.

Read back into kvcheck's abstract state: a node's pages and `full_lock_ref` (NodeView's
lock_ref), its rank in the full LRU list among unlocked leaves (`get_leaf_lru_no_lock`
order), `full_evictable_size()` / `full_protected_size()` (the tree's `evictable_size()`
raises there), the SWA free pages and the full-to-SWA mapping (a node's tombstoned pages
are its pages without a mapping entry: the spec tracks tombstones per page), a holder's
`swa_evicted_seqlen`, and `swa_uuid_for_lock` as the path of the node that carries that
uuid. What the abstract state has no field for is checked here on the concrete tree
(`tree_violations`): a tombstoned node's pages hold no SWA page, a live node's all do,
`swa_lock_ref` never exceeds `full_lock_ref`, the SWA sizes add up.
"""
from __future__ import annotations

import os

from kvcheck.spec.violations import Violation


def configure_env(cfg) -> None:
    """The release's SWA knobs: the maintenance interval from the config, the
    optimisations at their (off) defaults."""
    os.environ["SGLANG_SWA_EVICTION_INTERVAL"] = str(cfg.swa_eviction_interval)
    for name in ("SGLANG_OPT_SWA_RADIX_CACHE_COMPACT", "SGLANG_OPT_SWA_SPLIT_LEAF_ON_INSERT",
                 "SGLANG_OPT_SWA_RELEASE_LEAF_LOCK_AFTER_WINDOW"):
        os.environ.pop(name, None)


def build(cfg, pool, alloc):
    """(the StreamingSession over an SWARadixCache, the SWARadixCache)."""
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.swa_radix_cache import SWARadixCache
    from sglang.srt.session.streaming_session import StreamingSession
    configure_env(cfg)
    params = CacheInitParams(disable=False, req_to_token_pool=pool,
                             token_to_kv_pool_allocator=alloc, page_size=cfg.page_size,
                             sliding_window_size=cfg.swa_window)
    tree = SWARadixCache(params)
    return StreamingSession(tree), tree


def full_allocator(alloc):
    """The allocator whose free list is the full pool (the census and the shadow read it)."""
    return getattr(alloc, "full_attn_allocator", alloc)


def tree_sizes(cache) -> tuple:
    """(evictable, protected) full tokens: `full_evictable_size()` where the tree splits
    its sizes (0.5.15's SWARadixCache and MambaRadixCache, whose `evictable_size()`
    raises NotImplementedError)."""
    if hasattr(cache, "full_evictable_size") and (cache.supports_swa() or
                                                  hasattr(cache, "mamba_lru_list")):
        return int(cache.full_evictable_size()), int(cache.full_protected_size())
    return int(cache.evictable_size()), int(cache.protected_size())


def swa_budget(cache, alloc) -> int:
    """PrefillAdder's `rem_swa_tokens` before any offset: SWA available + evictable."""
    return int(alloc.swa_available_size()) + int(cache.swa_evictable_size())


def lock_ref(node) -> int:
    """The full lock count (the spec's lock_ref)."""
    return int(node.full_lock_ref)


def eviction_order(tree) -> tuple:
    """(the unlocked leaves, priority) in the order `evict` pops them: from the LRU end of
    `full_lru_list`, `get_leaf_lru_no_lock` / `get_prev_leaf_no_lock` (rank 0 first)."""
    lru, out, rank = tree.full_lru_list, [], {}
    x = lru.tail.prev
    while x is not None and x is not lru.head:
        if x.full_lock_ref == 0 and not x.children:
            rank[id(x)] = len(out)
            out.append(x)
        x = x.prev
    return out, lambda n: rank[id(n)]


def _page_census(a) -> list:
    import torch
    parts = [a.free_pages]
    rel = getattr(a, "release_pages", None)
    if rel is not None and len(rel):
        parts.append(rel)
    return [int(x) for x in torch.cat(parts).tolist()]


def swa_view(cfg, alloc) -> dict:
    """The AbstractState's SWA fields: the SWA allocator's free pages and, per full page,
    the SWA page its first index maps to (0: none)."""
    P = cfg.page_size
    m = alloc.full_to_swa_index_mapping.tolist()
    return dict(swa_window=cfg.swa_window, swa_num_pages=cfg.swa_pages,
                swa_free_pages=tuple(sorted(_page_census(alloc.swa_attn_allocator))),
                swa_map=tuple((p, m[p * P] // P) for p in range(1, cfg.num_pages + 1)
                              if m[p * P] // P != 0))


def swa_fields(holder) -> dict:
    """A request's or slot's SWA cursor for its ReqView / SlotView."""
    return dict(swa_evicted_seqlen=int(getattr(holder, "swa_evicted_seqlen", 0) or 0))


def uuid_node(tree, uuid):
    """The tree node that carries `swa_uuid == uuid` (the SWA lock's upper end), or None."""
    if uuid is None:
        return None
    stack = [tree.root_node]
    while stack:
        n = stack.pop()
        if n is not tree.root_node and n.swa_uuid == uuid:
            return n
        stack.extend(n.children.values())
    return None


def nodes(tree) -> list:
    out, stack = [], list(tree.root_node.children.values())
    while stack:
        n = stack.pop()
        out.append(n)
        stack.extend(n.children.values())
    return out


def tree_violations(cfg, tree, alloc) -> list:
    """What the abstract state cannot show of the SWA tree: per node, the tombstone flag
    against its SWA pages, `swa_lock_ref <= full_lock_ref` (the SWA lock is a suffix of
    the full one), a tombstone never SWA-locked, no tombstoned leaf without a full lock;
    the tree's SWA sizes against its nodes (C6)."""
    P, m = cfg.page_size, alloc.full_to_swa_index_mapping
    out, evictable, protected = [], 0, 0
    for n in nodes(tree):
        vals = n.value.tolist()
        mapped = [int(m[v]) != 0 for v in vals]
        who = f"SWA tree node (key {len(n.key)} tokens, first KV index {vals[0] if vals else None})"
        if n.swa_tombstone and any(mapped):
            out.append(Violation("C6", "SWA tombstone holds SWA KV", f"{sum(mapped)} of its "
                                 f"{len(vals)} indices still map to SWA", owner=who))
        if not n.swa_tombstone and not all(mapped):
            out.append(Violation("C6", "live SWA node lost its SWA KV", f"{len(vals) - sum(mapped)}"
                                 f" of its {len(vals)} indices map to no SWA index", owner=who))
        if n.swa_lock_ref > n.full_lock_ref or (n.swa_tombstone and n.swa_lock_ref):
            out.append(Violation("C6", "SWA lock outside the full lock", f"swa_lock_ref "
                                 f"{n.swa_lock_ref}, full_lock_ref {n.full_lock_ref}, tombstone "
                                 f"{n.swa_tombstone}", owner=who))
        if not n.swa_tombstone:
            if n.swa_lock_ref:
                protected += len(vals)
            else:
                evictable += len(vals)
    got = (int(tree.swa_evictable_size()), int(tree.swa_protected_size()))
    if got != (evictable, protected):
        out.append(Violation("C6", "SWA tree sizes", f"swa_evictable_size, swa_protected_size "
                             f"= {got}, its live nodes give {(evictable, protected)}",
                             owner="SWARadixCache"))
    return out
