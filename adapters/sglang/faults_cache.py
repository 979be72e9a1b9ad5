"""Planted faults in upstream's KV memory code: the paged allocator's free,
release_kv_cache's free of the overallocation, the radix tree's node split."""
from __future__ import annotations

from kvcheck.adapters.sglang.faults_patch import _patch

PAGED = "sglang.srt.mem_cache.allocator.paged"


def _free_no_page_dedup(version: str) -> None:
    # PagedTokenToKVPoolAllocator.free frees unique(index // P): "freeing any index frees
    # its whole page", duplicates removed within one call (DOMAIN.md 1.1). Free the
    # indices one call each: a page is freed once per index of it.
    def make(orig):
        def free(self, free_index):
            if free_index.numel() <= 1:
                return orig(self, free_index)
            for i in range(free_index.numel()):
                orig(self, free_index[i:i + 1])
        return free
    _patch(PAGED, "PagedTokenToKVPoolAllocator", "free", make)


def _overalloc_free_floor(version: str) -> None:
    # 0.5.23 _release_overallocated_kv_indices: "start_p is aligned to the allocator's page
    # above, so it never shares a page with the tail free_kv_row in this group" (I18, the
    # boundary page freed once). Align it down instead: the page straddling the owned
    # length is freed by both calls.
    def make(orig):
        def _release_overallocated_kv_indices(req, start_p, end_p, tree_cache):
            # only where there is an overallocation to free (start_p < end_p): the
            # no-speculation assert start_p == end_p sees what upstream gives it
            if start_p < end_p:
                P = tree_cache.token_to_kv_pool_allocator.page_size
                start_p = (start_p // P) * P
            return orig(req, start_p, end_p, tree_cache)
        return _release_overallocated_kv_indices
    _patch("sglang.srt.mem_cache.common", None, "_release_overallocated_kv_indices", make)


def _split_no_lock_copy(version: str) -> None:
    # a node split gives the new upper node the child's lock count (0.5.15
    # RadixCache._split_node `new_node.lock_ref = child.lock_ref`; 0.5.23
    # FullComponent.redistribute_on_node_split): the path's lock counts are unchanged
    # (DOMAIN.md, match_prefix). Leave the upper node unlocked: a holder's path loses it.
    if version == "0.5.15":
        def make(orig):
            def _split_node(self, key, child, split_len):
                new_node = orig(self, key, child, split_len)
                new_node.lock_ref = 0
                return new_node
            return _split_node
        _patch("sglang.srt.mem_cache.radix_cache", "RadixCache", "_split_node", make)
        return

    def make23(orig):
        def redistribute_on_node_split(self, new_parent, child):
            out = orig(self, new_parent, child)
            new_parent.component_data[self.component_type].lock_ref = 0
            return out
        return redistribute_on_node_split
    _patch("sglang.srt.mem_cache.unified_cache.components.full", "FullComponent",
           "redistribute_on_node_split", make23)
