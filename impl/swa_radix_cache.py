"""The SWA tree (upstream mem_cache/swa_radix_cache.py): `SWARadixCache` is impl's RadixCache
with SWARadixCache's window-aware match (a prefix is usable up to the last point with no
SWA tombstone behind it, or `sliding_window_size` tokens of SWA KV after the last one).
"""
from __future__ import annotations

import torch

from kvcheck.impl.radix_cache import RadixCache
from kvcheck.impl.swa import free_swa_out_of_window_slots, swa_eviction_due

I64 = torch.int64


class SWARadixCache(RadixCache):
    """RadixCache whose match stops where the window has no SWA KV behind it
    (`_match_prefix_helper`), counted per page here (upstream per node)."""

    def __init__(self, req_to_token_pool, token_to_kv_pool_allocator, page_size: int, device,
                 sliding_window_size: int):
        super().__init__(req_to_token_pool, token_to_kv_pool_allocator, page_size, device)
        self.sliding_window_size = sliding_window_size
        self.lock_holders = lambda: ()      # the scheduler's requests and session slots
        self._insert_ctx = (0, 0)           # (prev_prefix_len, swa_evicted_seqlen) of an insert
        self.full_kv_hit_length = 0         # the last match's full-KV hit (borrow era)

    def supports_swa(self) -> bool:
        return True

    def match_prefix(self, key) -> tuple:
        """`_match_post_processor` (both eras): the walk splits, and only the usable node
        and its parents are touched (`reset_node_and_parents_mru`; 0.5.23 stamps
        `best_match_node` and its ancestors), after the splits."""
        idx = self._split_walk(key)
        self.full_kv_hit_length = len(idx)
        idx, node = super().match_prefix(tuple(key)[:self._swa_usable_len(idx)])
        self.refresh_lru(node)                  # 0.5.23: MATCH_END from `best_match_node`
        return idx, node

    def _swa_lru(self) -> bool:
        return not self._wrapper()

    def insert_mru(self, node) -> None:
        """Borrow era `set_component_device_value`: a node given SWA KV goes to the SWA
        LRU's MRU end."""
        if self._swa_lru():
            self.tick += 1
            node.swa_tick = self.tick

    def refresh_lru(self, node) -> None:
        """Borrow era `reset_node_and_window_ancestors_mru` (MATCH_END / INSERT_END): the
        node and its ancestors within `window + P` tokens that hold SWA KV move to the MRU
        end, the node the most recent."""
        if not self._swa_lru():
            return
        self.tick += 1
        walked = 0
        while node is not self.root_node and walked < self.sliding_window_size + self.page_size:
            if self._swa_tokens(node):
                node.swa_tick = self.tick
            walked += len(node.key)
            node = node.parent

    def finalize_match_result_in_tree_core(self, req, device_prefix_len: int) -> None:
        """Borrow era (0.5.23 `SWAComponent.finalize_match_result_in_tree_core`): the
        page-aligned full-KV hit of the last match becomes `req.swa_branching_seqlen` when
        it runs past the SWA-usable prefix; None otherwise (and in the wrapper era)."""
        aligned = self.page_align_len(self.full_kv_hit_length)
        req.swa_branching_seqlen = aligned if not self._wrapper() and \
            aligned > device_prefix_len else None

    def prepare_for_caching_req(self, req, n: int):
        """Borrow era `SWAComponent.prepare_for_caching_req`: a pending branch past the
        protected prefix that the checkpoint reaches caps the insert at it."""
        b = getattr(req, "swa_branching_seqlen", None)
        if self._wrapper() or b is None or b <= req.cache_protected_len or b > n:
            return None
        return b

    def cleanup_after_caching_req(self, req, cap, finished: bool) -> None:
        """Borrow era `SWAComponent.cleanup_after_caching_req`: the branch inserted, it is
        cleared and, unfinished, out-of-window SWA is freed again up to the extend end."""
        if cap is None:
            return
        req.swa_branching_seqlen = None
        if not finished:
            self.free_out_of_window_slots(req, req.extend_end - 1)

    def update_component_on_insert_overlap(self, key: tuple, value: torch.Tensor, end: int) -> None:
        """Borrow era (0.5.23 `SWAComponent.update_component_on_insert_overlap`): the walk's
        SWA-tombstoned nodes past prev_prefix_len take the request's SWA KV for their part
        at or past the insert's `swa_evicted_seqlen` (`_recover_from_incoming`)."""
        if not self._wrapper() and end:
            self._recover_tombstones(key, value, end)

    def rematch_inserted(self, keys) -> tuple:
        """Borrow era: the whole inserted path, tombstoned pages included (0.5.23
        `checkpoint_into_tree` takes `path_device_indices(result.last_device_node)`, no
        window cut; the spec's plain re-match). The wrapper era re-matches through the
        window-aware match, after the insert recovered the tombstones it walked."""
        if self._wrapper():
            return self.match_prefix(keys)
        return RadixCache.match_prefix(self, keys)

    def _split_walk(self, key) -> torch.Tensor:
        """`match_prefix`'s walk and split without its access stamps."""
        key = tuple(key)[: self.page_align_len(len(key))]
        node, values = self.root_node, []
        while len(key) > 0 and self._child_key(key) in node.children:
            child = node.children[self._child_key(key)]
            plen = self._key_match(child.key, key)
            if plen < len(child.key):
                values.append(self._split_node(child, plen).value)
                break
            values.append(child.value)
            node, key = child, key[plen:]
        return torch.cat(values) if values else torch.empty(0, dtype=I64, device=self.device)

    def _swa_usable_len(self, idx: torch.Tensor) -> int:
        P, window = self.page_size, self.sliding_window_size
        alloc = self.token_to_kv_pool_allocator
        since, best = None, 0
        for k in range(len(idx) // P):
            if alloc.swa_page_of(int(idx[k * P].item()) // P) == 0:
                if since is None or since >= window:
                    best = k * P
                since = 0
            else:
                since = None if since is None else since + P
        return len(idx) if since is None or since >= window else best

    def evict(self, num_tokens: int) -> int:
        return self.evict_hybrid(num_tokens, 0)[0] if self._wrapper() else super().evict(num_tokens)

    def _delete(self, x) -> int:
        """`_delete_leaf`: the node's KV goes back, the node leaves the tree."""
        self.token_to_kv_pool_allocator.free(x.value)
        x.evicted_path = x.path()
        del x.parent.children[self._child_key(x.key)]
        self.evictable_size_ -= len(x.key)
        x.parent = None
        return len(x.key)

    def _delete_tombstone_chain(self, parent) -> int:
        """`_iteratively_delete_tombstone_leaf`: tombstoned parents left childless."""
        n = 0
        while parent is not self.root_node and not parent.children and parent.lock_ref == 0 \
                and self.tombstoned(parent):
            up = parent.parent
            n += self._delete(parent)
            parent = up
        return n

    def _lru(self, nodes):
        return min(nodes, key=lambda n: (n.last_access_tick, n.path()))

    def evict_hybrid(self, num_tokens: int, swa_num_tokens: int) -> tuple:
        """0.5.15 `SWARadixCache.evict(EvictParams(num_tokens, swa_num_tokens))`: unlocked
        leaves least recent first (with the tombstoned parents they leave childless)
        until num_tokens full tokens; then, for the SWA tokens still short, every node
        neither tombstoned nor SWA-locked, least recent first: an internal node or a
        full-locked leaf is tombstoned (`free_swa`), an unlocked leaf deleted."""
        full = swa = 0
        while full < num_tokens:
            leaves = [n for n in self.all_nodes() if self._is_candidate(n)]
            if not leaves:
                break
            x = self._lru(leaves)
            swa += 0 if self.tombstoned(x) else len(x.key)
            parent = x.parent
            full += self._delete(x)
            full += self._delete_tombstone_chain(parent)
        while swa < swa_num_tokens:
            locked = self.swa_locked()
            cands = [n for n in self.all_nodes() if n.id not in locked and not self.tombstoned(n)]
            if not cands:
                break
            x = self._lru(cands)
            swa += len(x.key)
            if x.children or x.lock_ref > 0:
                self.token_to_kv_pool_allocator.free_swa(x.value)
                continue
            parent = x.parent
            full += self._delete(x)
            full += self._delete_tombstone_chain(parent)
        return full, swa

    def _swa_tokens(self, n) -> int:
        """SWA tokens a node holds (`reclaimable_value_len`): its pages still mapped."""
        P, alloc = self.page_size, self.token_to_kv_pool_allocator
        return P * sum(1 for k in range(len(n.key) // P)
                       if alloc.swa_page_of(int(n.value[k * P].item()) // P) != 0)

    def evict_for_alloc(self, n: int) -> None:
        """Borrow era (0.5.23 `SWATokenToKVPoolAllocator.evict_to_free_tokens` ->
        `UnifiedRadixCache.evict_for_alloc(EvictParams(num_tokens=full_shortfall,
        swa_num_tokens=swa_shortfall))`, each an availability target): unlocked leaves,
        least recent first, until the full pool has n free; then, while the SWA pool has
        fewer than n free and the SWA tokens freed so far are below its shortfall, the SWA
        walk (`SWAComponent._evict_device_next_node`): the least recent node holding SWA
        KV outside every SWA lock is deleted when it is an unlocked leaf, else loses its
        SWA KV only (`free_swa_segment`)."""
        alloc = self.token_to_kv_pool_allocator
        full_short = max(0, n - alloc.full_available_size())
        swa_short = max(0, n - alloc.swa_available_size())
        swa = 0
        while full_short and alloc.full_available_size() < n:
            leaves = [x for x in self.all_nodes() if self._is_candidate(x)]
            if not leaves:
                break
            x = self._lru(leaves)
            swa += self._swa_tokens(x)
            self.delete_leaf(x)
        while swa_short and swa < swa_short and alloc.swa_available_size() < n:
            locked = self.swa_locked()
            cands = [x for x in self.all_nodes() if x.id not in locked and self._swa_tokens(x)]
            if not cands:
                return
            x = min(cands, key=lambda m: (m.swa_tick, m.path()))
            swa += self._swa_tokens(x)
            if self._is_candidate(x):
                self.delete_leaf(x)
            else:
                alloc.free_swa_segment(x.value.to(I64), start_pos=0)

    def swa_evictable_size(self) -> int:
        """SWA tokens of the nodes outside every SWA lock (a tombstone has none). Wrapper
        era (`SWARadixCache.swa_evictable_size_`): their keys; borrow era (the SWA
        component's evictable ledger): their mapped pages."""
        locked = self.swa_locked()
        if self._wrapper():
            return sum(len(n.key) for n in self.all_nodes()
                       if n.id not in locked and not self.tombstoned(n))
        return sum(self._swa_tokens(n) for n in self.all_nodes() if n.id not in locked)

    def cache_unfinished_req(self, req, chunked: bool = False) -> None:
        if not self._wrapper() and not self.disable:
            cap = self.prepare_for_caching_req(req, req.kv_committed_len)
            self.free_out_of_window_slots(req, (req.kv_committed_len if cap is None else cap) - 1)
        # borrow era: `prepare_for_caching_req` gives the insert the request's cursor
        self._insert_ctx = (req.cache_protected_len,
                            0 if self._wrapper() else req.swa_evicted_seqlen)
        try:
            super().cache_unfinished_req(req, chunked=chunked)
        finally:
            self._insert_ctx = (0, 0)
        req.swa_uuid_for_lock = swa_lock_boundary(self, req.last_node)

    def cache_finished_req(self, req, is_insert: bool = True, **kw) -> None:
        """`cache_finished_req` inserts with `swa_evicted_seqlen=req.swa_evicted_seqlen`."""
        self._insert_ctx = (req.cache_protected_len, req.swa_evicted_seqlen)
        try:
            super().cache_finished_req(req, is_insert=is_insert, **kw)
        finally:
            self._insert_ctx = (0, 0)

    def free_out_of_window_slots(self, req, pre_len: int) -> None:
        """Borrow era (0.5.23 `checkpoint_into_tree` l.1211-1222 ->
        `SWAComponent.free_out_of_window_slots`): before an unfinished request's insert,
        `free_swa_out_of_window_slots(req, len(radix_key) - 1)` with the default eviction
        interval 1."""
        if not swa_eviction_due(req, self.sliding_window_size, 1, pre_len):
            return
        free_swa_out_of_window_slots(
            req, pre_len, sliding_window_size=self.sliding_window_size, page_size=self.page_size,
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool_allocator=self.token_to_kv_pool_allocator, era="borrow")

    # -- the wrapper era's SWA tree (0.5.15 SWARadixCache) -------------------------------
    def _wrapper(self) -> bool:
        return not self.split_at_prompt

    def tombstoned(self, n) -> bool:
        """`swa_tombstone`: none of the node's indices maps to an SWA index."""
        m = self.token_to_kv_pool_allocator.full_to_swa_index_mapping
        return len(n.key) > 0 and bool((m[n.value.to(I64)] == 0).all())

    def _split_node(self, child, split_len: int):
        """The new upper half inherits the child's `swa_uuid` (both eras: 0.5.23's
        `redistribute_on_node_split` moves the uuid too): a holder whose SWA lock ended at
        the child now ends at the upper half."""
        new = super()._split_node(child, split_len)
        child.last_access_tick = self._creation_tick()  # the lower half: after the upper
        new.swa_tick = child.swa_tick           # `lru.insert_after(child, new_node)`
        for h in self.lock_holders():
            if getattr(h, "swa_uuid_for_lock", None) is child:
                h.swa_uuid_for_lock = new
        return new

    def swa_locked(self) -> set:
        """Ids of the nodes with `swa_lock_ref > 0`: from each lock holder's node up to
        its `swa_uuid_for_lock` node inclusive (to the root when None)."""
        from kvcheck.impl.radix_cache import TreeNode
        out = set()
        for h in self.lock_holders():
            node = h.last_node
            if not getattr(h, "lock_held", True) or not isinstance(node, TreeNode):
                continue
            while node is not self.root_node and node is not None:
                out.add(node.id)
                if node is h.swa_uuid_for_lock:
                    break
                node = node.parent
        return out

    def _recover_tombstones(self, key: tuple, value: torch.Tensor, end: int) -> None:
        """`_insert_helper`'s tombstone recovery: a tombstoned node on the walk that ends
        past prev_prefix_len takes the incoming SWA KV for its part at or past
        swa_evicted_seqlen (split there). The node keeps its full indices; the caller
        frees the incoming ones (their SWA entries now 0)."""
        after, sev = self._insert_ctx
        m = self.token_to_kv_pool_allocator.full_to_swa_index_mapping
        node, start = self.root_node, 0
        while start < end:
            node = node.children[self._child_key(key[start:])]
            stop = start + len(node.key)
            if stop > after and sev < stop and self.tombstoned(node):
                lo = max(start, sev)
                if lo > start:
                    self._split_node(node, lo - start)
                inc = value[lo:stop].to(I64)
                m[node.value.to(I64)] = m[inc]
                m[inc] = 0
                self.insert_mru(node)
            start = stop

    def insert(self, key, value: torch.Tensor) -> int:
        """Wrapper era `_insert_helper`: one walk (its stamps and split as upstream's, so a
        split's lower half stays newer than the path above it), tombstone recovery on it;
        the new suffix's part below `swa_evicted_seqlen` (SWA KV freed by the window) is a
        tombstone node of its own above the live leaf; a suffix that is all below it is
        freed, not added (no tombstone leaf)."""
        key, sev = tuple(key), self._insert_ctx[1]
        if self.split_at_prompt:
            i = super().insert(key, value)
            if i < len(key):
                self.commit_insert_component_data(key, i)
            self.refresh_lru(self._end_node(key))   # 0.5.23: INSERT_END from the target
            return i
        i, node = self._insert_helper_walk(key)
        self._recover_tombstones(key, value, i)
        cut = min(max(i, sev), len(key))
        if i < cut == len(key):
            self.token_to_kv_pool_allocator.free(value[i:].to(I64))
            return i
        if i < cut:
            node = self._add_new_node(node, key[i:cut], value[i:cut])
        if cut < len(key):
            self._add_new_node(node, key[cut:], value[cut:])
        return i

    def commit_insert_component_data(self, key: tuple, start: int) -> None:
        """Borrow era (0.5.23 `SWAComponent.commit_insert_component_data` on the fresh leaf
        `[start, len(key))`): `_clip_to_window` splits it at the insert's
        `swa_evicted_seqlen`, the part below staying an SWA tombstone node; a leaf wholly
        below the cursor stays one tombstone leaf. The live fragments publish their SWA
        KV, the older first (`insert_mru`)."""
        node = self._end_node(key)
        live_start = max(start, self._insert_ctx[1])
        if live_start >= len(key):
            return
        if live_start > start:
            self._split_node(node, live_start - start)
        upper = self._maybe_split_leaf_for_swa_lock(node)
        if upper is not None:
            self.insert_mru(upper)
        self.insert_mru(node)

    def _end_node(self, key: tuple):
        """The node an inserted key ends on."""
        node, n = self.root_node, 0
        while n < len(key):
            node = node.children[self._child_key(key[n:])]
            n += len(node.key)
        return node

    def _maybe_split_leaf_for_swa_lock(self, leaf):
        """Borrow era (0.5.23 `SWAComponent._maybe_split_leaf_for_swa_lock`): a fresh live
        leaf longer than one page-aligned window is split so its lower part is that window;
        returns the new upper part, or None."""
        P = self.page_size
        tail_size = (self.sliding_window_size + P - 1) // P * P
        if len(leaf.key) > tail_size:
            return self._split_node(leaf, len(leaf.key) - tail_size)
        return None


def swa_lock_boundary(tree, node):
    """`inc_lock_ref(...).swa_uuid_for_lock` (0.5.15) / the receipt's SWA uuid (0.5.23
    `acquire_component_lock`): the node where the SWA lock, walking up from the locked
    node, first covers `sliding_window_size` tokens (None: the root, a virtual node, or
    the root reached first)."""
    from kvcheck.impl.radix_cache import TreeNode
    if not isinstance(node, TreeNode) or node is tree.root_node:
        return None
    size = 0
    while node is not tree.root_node:
        size += len(node.key)
        if size >= tree.sliding_window_size:
            return node
        node = node.parent
    return None
