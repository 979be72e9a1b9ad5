"""0.5.23's `UnifiedRadixCache` MAMBA component (upstream mem_cache/unified_cache/
components/mamba.py `MambaComponent`), for page_size 1 without the extra buffer: per-node
Mamba states (`TreeNode.mamba_value`, a 1-element slot tensor; None = a Mamba tombstone),
the node's own Mamba lock (`mamba_lock_ref`), a Mamba LRU (`mamba_tick`, larger = more
recent), the copy-on-write at a match, the checkpoint copy and the finished request's
donation, and Mamba eviction. spec/mamba_tree.py states the rules; this module is the
tensor-side implementation the lockstep runs beside it. `wrapper=True`: 0.5.15's
`MambaRadixCache` where it differs (spec/mamba_tree.py: the Mamba LRU touched along
paths, tombstone parents deleted with a leaf, `alloc_req_slots`' eviction).
"""
from __future__ import annotations

import torch

from kvcheck.impl import faults

I64 = torch.int64


class MambaComponent:
    MAMBA_STATE_PER_REQ_PREFIX_CACHE = 3

    def __init__(self, cache, wrapper: bool = False):
        self.cache = cache                  # kvcheck.impl.radix_cache.RadixCache
        self.clock = 0
        self.wrapper = wrapper              # 0.5.15 MambaRadixCache

    @property
    def allocator(self):
        return self.cache.req_to_token_pool.mamba_allocator

    # -- LRU / values ----------------------------------------------------------------------
    def touch(self, node) -> None:
        """`insert_mru` / `reset_node_mru` on the Mamba LRU list."""
        self.clock += 1
        node.mamba_tick = self.clock

    def touch_walked(self, node) -> None:
        """0.5.15 `_insert_helper` / `_split_node`: a walked node's state to the MRU end."""
        if self.wrapper and node.mamba_value is not None:
            self.touch(node)

    def touch_matched(self, best) -> None:
        """`_match_post_processor`: best's state to the MRU end (0.5.23); every state from
        the root down to best, best last (0.5.15 `reset_node_and_parents_mru`)."""
        path, x = [], best
        while x is not self.cache.root_node and (self.wrapper or x is best):
            path.append(x)
            x = x.parent
        for n in reversed(path):
            if n.mamba_value is not None:
                self.touch(n)

    def delete_tombstone_parents(self, parent) -> tuple:
        """0.5.15 `_iteratively_delete_tombstone_leaf` after a deleted leaf: parents left
        childless, unlocked and stateless go too. Returns (their tokens, the first
        parent kept)."""
        freed = 0
        while self.wrapper and parent is not self.cache.root_node and not parent.children \
                and parent.lock_ref == 0 and parent.mamba_value is None:
            up = parent.parent
            freed += len(parent.key)
            self.cache.delete_leaf(parent)
            parent = up
        return freed, parent

    def evict_component(self, node) -> None:
        """A node's state returns to the pool; the node becomes a Mamba tombstone."""
        if node.mamba_value is not None:
            self.allocator.free(node.mamba_value)
            node.mamba_value = None

    def evictable_nodes(self) -> list:
        return [n for n in self.cache.all_nodes()
                if n.mamba_value is not None and n.mamba_lock_ref == 0]

    def evictable_size(self) -> int:
        """`mamba_evictable_size`: states without a Mamba lock."""
        return len(self.evictable_nodes())

    # -- eviction ---------------------------------------------------------------------------
    def evict(self, mamba_num: int) -> None:
        """`evict_for_alloc(EvictParams(mamba_num=n))`: from the least recent unlocked state,
        an unlocked device leaf goes whole, any other node loses only its state."""
        freed = 0
        while freed < mamba_num:
            cands = self.evictable_nodes()
            if not cands:
                return
            x = min(cands, key=lambda n: n.mamba_tick)
            if not x.children and x.lock_ref == 0:
                parent = x.parent
                self.cache.delete_leaf(x)
                self.delete_tombstone_parents(parent)
            else:
                self.evict_component(x)
            freed += 1

    def alloc_mamba_slot(self) -> torch.Tensor:
        """`_alloc_mamba_slot`: one slot, evicting one state when the pool is empty."""
        slot = self.allocator.alloc(1)
        if slot is None:
            self.evict(1)
            slot = self.allocator.alloc(1)
            assert slot is not None, "Can not alloc mamba cache"
        return slot

    def ensure_mamba_capacity(self, needed: int) -> None:
        """`allocation.ensure_mamba_capacity`: evict the shortfall before `alloc`. 0.5.15
        `alloc_req_slots`: evict up to MAMBA_STATE_PER_REQ_PREFIX_CACHE free states."""
        available = self.allocator.available_size()
        if self.wrapper:
            needed = self.MAMBA_STATE_PER_REQ_PREFIX_CACHE
        if available < needed:
            self.evict(needed - available)

    # -- match --------------------------------------------------------------------------------
    def best_match_node(self, last_node):
        """The deepest node from last_node up that has a state (the root when none)."""
        node = last_node
        while node is not self.cache.root_node and node.mamba_value is None:
            node = node.parent
        return node

    def finalize_match_result_in_cache(self, req, best) -> None:
        """Copy-on-write: a request without a state gets a fresh slot holding the matched
        node's state (evicting one with the node locked when the pool is empty)."""
        if best is self.cache.root_node or best.mamba_value is None:
            return
        if req.mamba_pool_idx is not None:
            return
        dst = self.allocator.alloc(1)
        if dst is None:
            self.cache.inc_lock_ref(best)
            self.evict(1)
            dst = self.allocator.alloc(1)
            self.cache.dec_lock_ref(best)
            assert dst is not None, "Can not alloc mamba cache"
        req.mamba_pool_idx = dst[0]

    # -- insert ------------------------------------------------------------------------------
    def commit_insert_component_data(self, node, is_new_leaf: bool, value: torch.Tensor) -> bool:
        """Returns mamba_exist: the node kept the state it had (an empty key commits
        nothing on the root)."""
        if node is self.cache.root_node:
            return True
        if is_new_leaf or node.mamba_value is None:
            node.mamba_value = value
            self.touch(node)
            return False
        self.touch(node)
        return True

    def checkpoint(self, req, finished: bool) -> None:
        """`checkpoint_into_tree` (P = 1, no extra buffer): offer a copy (unfinished) or
        the request's own state (finished), insert [0, committed), free the duplicates of
        [protected, existing), move the lock to the node the key ends on, free what the
        node did not take."""
        cache = self.cache
        pool = cache.req_to_token_pool
        end = req.kv_committed_len
        if finished:
            req.pop_committed_kv_cache()
            assert req.mamba_pool_idx is not None, "finished request holds no Mamba state"
            value = req.mamba_pool_idx.reshape(1).clone()
        else:
            value = self.alloc_mamba_slot()
        kv = pool.req_to_token[req.req_pool_idx, :end].to(I64)
        new_prefix_len, node, is_new_leaf = cache.insert_walk(tuple(req.fill_ids[:end]), kv)
        exist = self.commit_insert_component_data(node, is_new_leaf, value)
        protected = req.cache_protected_len
        cache.free_tree_kv(kv[protected:new_prefix_len])
        new_indices = cache.path_indices(node)
        pool.write(req.req_pool_idx, protected, new_indices[protected:])
        cache.dec_lock_ref(req.last_node)
        cache.inc_lock_ref(node)
        req.last_node = node
        req.lock_held = True
        req.cache_protected_len = len(new_indices)
        req.prefix_indices = new_indices
        if not finished:
            if exist:
                self.allocator.free(value)
        elif exist and "mamba_donate_when_node_has_state" not in faults.ACTIVE:
            pool.free_mamba_cache(req)          # the node kept its own
        else:
            req.mamba_pool_idx = None           # the node owns it now
