"""RadixCache (upstream mem_cache/radix_cache.py), page-aligned, with deterministic LRU.

Eviction order: a global tick increments once per match_prefix call and once per insert
call; every node on the walked path (and both halves of a split) is stamped; a node
the call creates (a split's upper half, a new leaf) gets a later tick, in creation order,
as upstream's `TreeNode()` reads the clock (0.5.15) or its counter (0.5.23) after the walk. evict() pops unlocked childless leaves by (last_access_tick, key path).
"""
from __future__ import annotations

from typing import Optional

import torch

from kvcheck.impl import faults

I64 = torch.int64


class TreeNode:
    __slots__ = ("children", "parent", "key", "value", "lock_ref", "last_access_tick", "id",
                 "evicted_path", "mamba_value", "mamba_lock_ref", "mamba_tick", "swa_tick")
    _counter = 0

    def __init__(self, key: tuple = (), value: Optional[torch.Tensor] = None, parent=None,
                 lock_ref: int = 0, tick: int = 0):
        self.children: dict = {}
        self.parent: Optional[TreeNode] = parent
        self.key: tuple = key
        self.value = value
        self.lock_ref = lock_ref
        self.last_access_tick = tick
        TreeNode._counter += 1
        self.id = TreeNode._counter
        self.evicted_path = None
        # 0.5.23's MAMBA component (impl/mamba_tree.py): the node's state, its own lock and
        # its Mamba LRU position; a split's new upper half starts without them
        self.mamba_value: Optional[torch.Tensor] = None
        self.mamba_lock_ref = 0
        self.mamba_tick = 0
        self.swa_tick = 0                   # 0.5.23's SWA LRU position (impl/swa_radix_cache.py)

    def path(self) -> tuple:
        """The full key from the root (kept for a node already evicted, which a queued
        request that matched it may still name)."""
        if self.evicted_path is not None:
            return self.evicted_path
        parts = []
        n = self
        while n is not None and n.parent is not None:
            parts.append(n.key)
            n = n.parent
        out: tuple = ()
        for k in reversed(parts):
            out += k
        return out


class RadixCache:
    def __init__(self, req_to_token_pool, token_to_kv_pool_allocator, page_size: int, device):
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.page_size = page_size
        self.device = device
        self.split_at_prompt = False      # borrow era: checkpoint_into_tree's prompt split
        self.full_only = True             # ... which only a FULL-only tree makes
        self.disable = False              # borrow era --disable-radix-cache: keeps nothing
        self.segment_frees = False        # borrow era: tree KV goes back by free_segment
        self.mamba = None                 # MambaComponent (impl/mamba_tree.py) or None
        self.reset()

    def reset(self) -> None:
        self.root_node = TreeNode(key=(), value=torch.empty(0, dtype=I64, device=self.device), lock_ref=1)
        self.evictable_size_ = 0
        self.protected_size_ = 0
        self.tick = 0

    # -- helpers -----------------------------------------------------------------
    def page_align_len(self, n: int) -> int:
        return n // self.page_size * self.page_size

    def free_tree_kv(self, kv: torch.Tensor) -> None:
        """Give back page-aligned tree KV (an evicted leaf, the duplicates an insert
        exposed). Borrow era: 0.5.23's `FreeDeviceKV` action, `free_segment(indices,
        start_pos=0)` (page representatives, no unique: the tree's values are whole pages
        of a row); wrapper era: `free`."""
        if self.segment_frees:
            self.token_to_kv_pool_allocator.free_segment(kv, start_pos=0)
        else:
            self.token_to_kv_pool_allocator.free(kv)

    def _child_key(self, key: tuple) -> tuple:
        return tuple(key[: self.page_size])

    def _key_match(self, a: tuple, b: tuple) -> int:
        """Matched length in whole pages."""
        P = self.page_size
        n = min(len(a), len(b))
        i = 0
        while i + P <= n and a[i:i + P] == b[i:i + P]:
            i += P
        return i

    def evictable_size(self) -> int:
        return self.evictable_size_

    def protected_size(self) -> int:
        return self.protected_size_

    def all_nodes(self) -> list:
        out, stack = [], [self.root_node]
        while stack:
            n = stack.pop()
            if n is not self.root_node:
                out.append(n)
            stack.extend(n.children.values())
        return out

    # -- match / split / insert ---------------------------------------------------
    def match_prefix(self, key) -> tuple:
        """(device_indices, last_node): the longest cached page-aligned prefix of key.
        Splits a node when the match ends inside it. Takes no lock. Disabled: nothing."""
        if self.disable:
            return torch.empty(0, dtype=I64, device=self.device), self.root_node
        key = tuple(key)[: self.page_align_len(len(key))]
        self.tick += 1
        t = self.tick
        node = self.root_node
        values = []
        while len(key) > 0 and self._child_key(key) in node.children:
            child = node.children[self._child_key(key)]
            if self.mamba is None:      # a Mamba tree stamps only the node the match ends on
                child.last_access_tick = t
            plen = self._key_match(child.key, key)
            if plen < len(child.key):
                new_node = self._split_node(child, plen)
                values.append(new_node.value)
                node = new_node
                break
            values.append(child.value)
            node = child
            key = key[plen:]
        if self.mamba is not None:
            node, values = self._mamba_match_end(node, values)
        if values:
            idx = torch.cat(values)
        else:
            idx = torch.empty(0, dtype=I64, device=self.device)
        return idx, node

    def _mamba_match_end(self, node, values: list) -> tuple:
        """0.5.23 with a Mamba component: the match ends at the deepest node with a state
        (`create_match_validator`); `_match_post_processor` stamps it and its ancestors
        and moves it to the Mamba MRU end."""
        best = self.mamba.best_match_node(node)
        depth, x = 0, best
        while x is not self.root_node:
            depth += 1
            x = x.parent
        self.tick += 1
        x = best
        while x is not self.root_node:
            x.last_access_tick = self.tick
            x = x.parent
        self.mamba.touch_matched(best)
        return best, values[:depth]

    def _creation_tick(self) -> int:
        """A node created by a walk: newer than the walk's stamp (`TreeNode()` reads the
        clock, or 0.5.23's counter, after the walk)."""
        self.tick += 1
        return self.tick

    def _split_node(self, child: TreeNode, split_len: int) -> TreeNode:
        t = child.last_access_tick
        new_node = TreeNode(key=child.key[:split_len], value=child.value[:split_len].clone(),
                            parent=child.parent, lock_ref=child.lock_ref,
                            tick=self._creation_tick())
        if "split_no_lock_copy" in faults.ACTIVE:
            new_node.lock_ref = 0
        parent = child.parent
        parent.children[self._child_key(child.key)] = new_node
        child.key = child.key[split_len:]
        child.value = child.value[split_len:].clone()
        child.parent = new_node
        child.last_access_tick = t
        if self.mamba is not None:      # `_split_node` re-stamps the lower half
            child.last_access_tick = self._creation_tick()
            self.mamba.touch_walked(child)
        new_node.children[self._child_key(child.key)] = child
        return new_node

    def insert(self, key, value: torch.Tensor) -> int:
        """Insert key -> value; returns how much of key already existed."""
        return self.insert_walk(key, value)[0]

    def insert_walk(self, key, value: torch.Tensor) -> tuple:
        """`insert`'s walk: (how much of key already existed, the node the key ends on,
        whether that node is the new leaf). With a Mamba component an existing end node
        is re-stamped (`commit_insert_component_data`)."""
        key = tuple(key)
        total_prefix, node = self._insert_helper_walk(key)
        self.update_component_on_insert_overlap(key, value, total_prefix)
        if total_prefix < len(key):
            leaf = self._add_new_node(node, key[total_prefix:], value[total_prefix:])
            return total_prefix, leaf, True
        if self.mamba is not None and node is not self.root_node:
            node.last_access_tick = self._creation_tick()
        return total_prefix, node, False

    def _insert_helper_walk(self, key: tuple) -> tuple:
        """`_insert_helper`'s walk over the part of key the tree holds, in one call: every
        node on it stamped with the call's tick, the node the key leaves split (its upper
        half, then its lower half, newer). Returns (the length held, the node it ends on)."""
        self.tick += 1
        t = self.tick
        node = self.root_node
        total_prefix = 0
        while len(key) > 0 and self._child_key(key) in node.children:
            node = node.children[self._child_key(key)]
            node.last_access_tick = t
            if self.mamba is not None:
                self.mamba.touch_walked(node)
            plen = self._key_match(node.key, key)
            total_prefix += plen
            key = key[plen:]
            if plen < len(node.key):
                node = self._split_node(node, plen)
        return total_prefix, node

    def _add_new_node(self, parent: TreeNode, key: tuple, value: torch.Tensor) -> TreeNode:
        """`_add_new_node`: a fresh unlocked (evictable) node for key under parent."""
        node = TreeNode(key=key, value=value.clone().to(I64), parent=parent,
                        tick=self._creation_tick())
        parent.children[self._child_key(key)] = node
        self.evictable_size_ += len(key)
        return node

    def update_component_on_insert_overlap(self, key: tuple, value: torch.Tensor, end: int) -> None:
        """After the walk over the existing `key[:end]`, before the new leaf: the hybrid
        trees' hook (impl/swa_radix_cache.py); nothing here."""

    def prepare_for_caching_req(self, req, n: int):
        """The insert length a checkpoint of `req` caps `n` tokens at, or None (no cap):
        the hybrid trees' hook (impl/swa_radix_cache.py); none here."""
        return None

    def cleanup_after_caching_req(self, req, cap, finished: bool) -> None:
        """After a checkpoint capped at `cap`: the hybrid trees' hook (impl/swa_radix_cache.py)."""

    def path_indices(self, node) -> torch.Tensor:
        """`path_device_indices`: the KV indices from the root down to node."""
        parts = []
        while node is not self.root_node:
            parts.append(node.value)
            node = node.parent
        if not parts:
            return torch.empty(0, dtype=I64, device=self.device)
        return torch.cat(parts[::-1])

    # -- locks ------------------------------------------------------------------------
    def inc_lock_ref(self, node) -> None:
        if not isinstance(node, TreeNode):
            return
        if self.mamba is not None and node is not self.root_node:
            node.mamba_lock_ref += 1        # MAMBA: the anchor node's own state only
        while node is not self.root_node:
            assert node.parent is not None, "holds a node from another tree"
            if node.lock_ref == 0:
                self.evictable_size_ -= len(node.key)
                self.protected_size_ += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node) -> None:
        if not isinstance(node, TreeNode):
            return
        if self.mamba is not None and node is not self.root_node:
            node.mamba_lock_ref -= 1
        while node is not self.root_node:
            assert node.parent is not None, "holds a node from another tree"
            if node.lock_ref == 1:
                self.evictable_size_ += len(node.key)
                self.protected_size_ -= len(node.key)
            node.lock_ref -= 1
            node = node.parent

    # -- eviction -----------------------------------------------------------------------
    def _is_candidate(self, n: TreeNode) -> bool:
        if "evict_ignores_lock" in faults.ACTIVE:
            return n is not self.root_node and not n.children
        return n is not self.root_node and n.lock_ref == 0 and not n.children

    def evict(self, num_tokens: int) -> int:
        candidates = {n.id: n for n in self.all_nodes() if self._is_candidate(n)}
        paths = {i: n.path() for i, n in candidates.items()}
        evicted = 0
        while evicted < num_tokens and candidates:
            vid = min(candidates, key=lambda i: (candidates[i].last_access_tick, paths[i]))
            x = candidates.pop(vid)
            evicted += len(x.key)
            parent = x.parent
            self.delete_leaf(x, paths[vid])
            if self.mamba is not None:
                freed, parent = self.mamba.delete_tombstone_parents(parent)
                evicted += freed
            if self._is_candidate(parent):
                candidates[parent.id] = parent
                paths[parent.id] = parent.path()
        return evicted

    def delete_leaf(self, x: TreeNode, path: Optional[tuple] = None) -> None:
        """`_delete_leaf`: the leaf's KV (and its Mamba state) go back; it leaves the tree."""
        path = x.path() if path is None else path
        self.free_tree_kv(x.value)
        if self.mamba is not None:
            self.mamba.evict_component(x)
        del x.parent.children[self._child_key(x.key)]
        self.evictable_size_ -= len(x.key)
        x.evicted_path = path
        x.parent = None

    # -- request caching (inner radix paths) ----------------------------------------------
    def cache_unfinished_req(self, req, chunked: bool = False) -> None:
        """Insert the page-aligned fill_ids[:end]; free duplicates; re-match; rewrite the
        row; move the lock; cache_protected_len = len(new_indices). Disabled: nothing."""
        if self.disable:
            return
        if self.mamba is not None:
            self.mamba.checkpoint(req, finished=False)
            return
        end = req.pop_committed_kv_cache() if "unfinished_pops_committed" in faults.ACTIVE \
            else req.kv_committed_len
        token_ids = req.fill_ids[:end]
        kv = self.req_to_token_pool.req_to_token[req.req_pool_idx, :end].to(I64)
        cap = self.prepare_for_caching_req(req, end)
        n_keys = self.page_align_len(end if cap is None else cap)
        keys = token_ids[:n_keys]
        new_prefix_len = self.insert(keys, kv[:n_keys])
        protected = req.cache_protected_len
        self.free_tree_kv(kv[protected:new_prefix_len])
        if self.split_at_prompt and self.full_only:
            self._split_at_prompt(req, n_keys, kv)
        new_indices, new_last_node = self.rematch_inserted(keys)
        assert len(new_indices) == n_keys, f"re-match {len(new_indices)} != {n_keys}"
        if "cache_unfinished_no_row_rewrite" not in faults.ACTIVE:
            self.req_to_token_pool.write(req.req_pool_idx, protected, new_indices[protected:])
        self.dec_lock_ref(req.last_node)
        self.inc_lock_ref(new_last_node)
        req.last_node = new_last_node
        req.cache_protected_len = end if "protected_len_unaligned" in faults.ACTIVE else len(new_indices)
        req.prefix_indices = torch.cat((new_indices, kv[len(new_indices):]))
        self.cleanup_after_caching_req(req, cap, finished=False)

    def rematch_inserted(self, keys) -> tuple:
        """The path `cache_unfinished_req` just inserted, as `match_prefix` returns it."""
        return self.match_prefix(keys)

    def _split_at_prompt(self, req, n_keys: int, kv: torch.Tensor) -> None:
        """Borrow era (checkpoint_into_tree): insert the page-aligned prompt again, which
        splits the inserted path at the prompt boundary; nothing is added or freed."""
        prompt_len = self.page_align_len(len(req.origin_input_ids))
        if 0 < prompt_len < n_keys:
            self.insert(req.fill_ids[:prompt_len], kv[:prompt_len])

    def cache_finished_req(self, req, is_insert: bool = True) -> None:
        """Insert (or not) the page-aligned committed prefix, free duplicates and the
        unaligned tail [len(keys), committed), drop the request's lock."""
        if is_insert and self.mamba is not None and not self.disable:
            self.mamba.checkpoint(req, finished=True)
            self.dec_lock_ref(req.last_node)
            req.lock_held = False
            return
        committed = req.pop_committed_kv_cache()
        if "finished_keys_past_committed" in faults.ACTIVE:
            committed = len(req.fill_ids)
        kv = self.req_to_token_pool.req_to_token[req.req_pool_idx, :committed].to(I64)
        is_insert = is_insert and not self.disable      # disabled: the row is freed
        cap = self.prepare_for_caching_req(req, committed) if is_insert else None
        n_keys = self.page_align_len(committed if cap is None else cap)
        protected = req.cache_protected_len
        if is_insert:
            keys = req.fill_ids[:n_keys]
            new_prefix_len = self.insert(keys, kv[:n_keys])
            self.free_tree_kv(kv[protected:new_prefix_len])
            if self.split_at_prompt and self.full_only:
                self._split_at_prompt(req, n_keys, kv)
        else:
            self.token_to_kv_pool_allocator.free(kv[protected:n_keys])
        self.token_to_kv_pool_allocator.free(kv[n_keys:])
        if req.lock_held:
            self.dec_lock_ref(req.last_node)
            req.lock_held = False
        self.cleanup_after_caching_req(req, cap, finished=True)
