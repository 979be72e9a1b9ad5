"""0.5.23's `UnifiedRadixCache` MAMBA component (`config.mamba_tree`, borrow era, P = 1).

A hybrid SSM model's tree keeps, per node, an optional Mamba state
(`component_data[MAMBA].value`, one slot of the Mamba pool; a node without one is a
Mamba tombstone: it keeps its KV but cannot end a match), the node's own Mamba lock
(`component_data[MAMBA].lock_ref`: `inc_lock_ref` locks the full KV up the path but only
the anchor node's state, tombstone or not) and a position in the Mamba LRU list. Upstream
(0.5.23 `mem_cache/unified_cache/components/mamba.py`, `unified_tree_core.py`,
`unified_radix_cache.py`):

- match (`_match_prefix_helper`): the match ends at the deepest node on the walked path
  that has a state (`create_match_validator`); the full-KV hit past it is re-prefilled.
  `_match_post_processor` stamps that node and its ancestors only, and moves its state to
  the Mamba MRU end (`refresh_lru` MATCH_END). `finalize_match_result_in_cache`
  (`cow_mamba`, on for the scheduler's match) then copies the state into a fresh slot of
  the request unless it already holds one, evicting one state with the node locked when
  the pool is empty (upstream asserts "Can not alloc mamba cache" if that finds none:
  kvcheck's guard does not schedule there, `cow_refusal`).
- a rejected admission frees that copy for a request without a session (`Scheduler.
  get_new_batch_prefill`, "revert matched mamba idx"); a streaming turn keeps it.
- checkpoint (`checkpoint_into_tree`, `prepare_for_caching_req`): an unfinished request's
  state is copied into a fresh slot (`_alloc_mamba_slot`, evicting one state when short)
  that the insert gives to the node the key ends on; a finished one donates its own
  slot. `commit_insert_component_data`: a new leaf takes it; an existing node without a
  state takes it; a node that already has one keeps its own (`mamba_exist`), and
  `cleanup_after_caching_req` frees the offered slot (a copy) or the request's state (a
  donation: `free_mamba_cache`). With a Mamba component there is no prompt split.
- `_split_node`: the new upper half has no state and no Mamba lock
  (`redistribute_on_node_split`); the lower half keeps them and is re-stamped.
- eviction: a KV eviction deleting a leaf frees its state too (`_release_all_component_
  layers`); a Mamba eviction (`evict_for_alloc(mamba_num=n)`: `ensure_mamba_capacity`
  before `HybridReqToTokenPool.alloc`, the copy-on-write, a checkpoint copy) walks the
  Mamba LRU from its least recent unlocked state: an unlocked device leaf goes whole
  (`evict_device_leaf`), any other node loses only its state.

Where 0.5.15's `MambaRadixCache` (`config.era == "wrapper"`, `mem_cache/
mamba_radix_cache.py` of the 0.5.15 wheel, under the `StreamingSession` wrapper) differs
(`wrapper_rules` gates each; the rest above holds for both):
- the Mamba LRU is touched along paths: the match moves every state from the root down
  to the node it ends on to the MRU end, deeper more recent (`_match_post_processor`
  l.1094, `reset_node_and_parents_mru`); an insert's walk moves each walked node's state
  (`_insert_helper` l.1193, `reset_node_mru`); `_split_node` (l.1160) re-inserts the
  lower half's state at the MRU end.
- `cache_unfinished_req` (l.642) re-matches the inserted key after the insert (the lock
  moves to that match's node); the re-stamp changes no order: the insert's walk has
  just touched the same path root first, and it cannot split there (the scheduler's
  match split at the divergence point in the same step; no chunking), so the key ends
  on the node the insert ended on and nothing is modelled for it.
- a deleted leaf takes its childless, unlocked, stateless parents with it
  (`_iteratively_delete_tombstone_leaf` l.1266, from `_evict_leaf_node`: a KV eviction
  and a Mamba eviction of a leaf): no Mamba tombstone is left a leaf. 0.5.23 keeps such a
  node while it has full KV (`_iteratively_delete_tombstone_ancestors`).
- `alloc_req_slots` (`mem_cache/common.py` l.401-433), before `HybridReqToTokenPool.
  alloc` at every extend (each chunk's too), evicts `MAMBA_STATE_PER_REQ_PREFIX_CACHE`
  (3) minus the free slots when fewer are free, whatever the request needs (0.5.23's
  `ensure_mamba_capacity` evicts the shortfall only).
- chunked prefill is modelled (0.5.15 only): a plain request's chunk checkpoints like a
  prefill (`cache_unfinished_req(chunked=True)`), guarded by `chunk_refusal`.

The functions here act on nodes and the Mamba pool only; the step's modules call them.
"""
from __future__ import annotations

from typing import Optional

from kvcheck.spec.pages import chunk_end
from kvcheck.spec.state import ROOT, State


def on(s: State) -> bool:
    return s.cfg.mamba_tree


MAMBA_STATE_PER_REQ_PREFIX_CACHE = 3
"""0.5.15 `mem_cache/common.py` l.45: the free states `alloc_req_slots` keeps per request."""


def wrapper_rules(s: State) -> bool:
    """0.5.15's `MambaRadixCache` (module docstring) rather than 0.5.23's component."""
    return s.cfg.mamba_tree and s.cfg.era == "wrapper"


def touch(s: State, node) -> None:
    """`insert_mru` / `reset_node_mru` on the Mamba LRU list."""
    s.mamba_clock += 1
    node.mamba_tick = s.mamba_clock


def alloc_slot(s: State) -> Optional[int]:
    """`mamba_allocator.alloc(1)`: the lowest free slot, or None."""
    if not s.mamba_free_slots:
        return None
    return s.mamba_free_slots.pop(0)


def free_slot(s: State, m: int) -> None:
    s.mamba_free_slots.append(m)


def drop_state(s: State, node) -> None:
    """`MambaComponent.evict_component` (device): the node's state returns to the pool
    and leaves the Mamba LRU; the node becomes a Mamba tombstone."""
    if node.mamba_value is not None:
        free_slot(s, node.mamba_value)
        node.mamba_value = None
        node.mamba_tick = 0


def best_node(s: State, nid: int) -> int:
    """The deepest node from nid up (inclusive) that has a state; ROOT when none."""
    while nid != ROOT:
        n = dict.__getitem__(s.nodes, nid)
        if n.mamba_value is not None:
            return nid
        nid = n.parent
    return ROOT


def touch_path(s: State, nid: int) -> None:
    """`mamba_lru_list.reset_node_and_parents_mru` (0.5.15): the states from the root down
    to nid move to the MRU end, nid most recent."""
    path = []
    while nid != ROOT:
        n = dict.__getitem__(s.nodes, nid)
        if n.mamba_value is not None:
            path.append(nid)
        nid = n.parent
    for nid in reversed(path):
        touch(s, s.nodes[nid])


def walk_touch(s: State, node) -> None:
    """0.5.15 `_insert_helper` / `_split_node`: a walked node's (a split's lower half's)
    state moves to the MRU end."""
    if wrapper_rules(s) and node.mamba_value is not None:
        touch(s, node)


def tombstone_leaf(s: State, node) -> bool:
    """0.5.15 `_iteratively_delete_tombstone_leaf`: a node left childless that goes with
    the deleted leaf below it (stateless, unlocked; never the root)."""
    return wrapper_rules(s) and node.id != ROOT and not node.children and \
        node.lock_ref == 0 and node.mamba_value is None


def alloc_req_slots_evict(s: State) -> int:
    """How many states `alloc_req_slots` evicts before the alloc: the shortfall of the
    free slots against `MAMBA_STATE_PER_REQ_PREFIX_CACHE` (0.5.15, one request)."""
    return max(0, MAMBA_STATE_PER_REQ_PREFIX_CACHE - len(s.mamba_free_slots))


def chunk_refusal(s: State, req) -> Optional[str]:
    """Why the next chunk of req could hit `_alloc_mamba_slot`'s assertion, or None: 0.5.15's
    `cache_unfinished_req(chunked=True)` (a request outside a session; a streaming turn's
    chunk skips the tree) copies its state into a fresh slot, evicting one when none is
    free; a chunk that ends the prefill of a request that goes on decoding copies once
    more (`cache_unfinished_req` after the sample; a streaming turn only when it is its
    session's first). With fewer free and evictable than that, upstream asserts "Can not
    alloc mamba cache" (kvcheck's guard does not schedule the chunk there, as
    `cow_refusal` for the match; conservative: a state the chunk's lock move unlocks is
    not counted)."""
    if not wrapper_rules(s):
        return None
    plain = req.session is None
    end = chunk_end(req.extend_end, req.seqlen, s.cfg.chunk_size, s.cfg.page_size)
    goes_on = end == req.seqlen and not req.to_finish and \
        len(req.output) + 1 < req.max_new_tokens and (plain or req.session not in s.slots)
    if len(s.mamba_free_slots) + len(evictable(s)) >= plain + goes_on:
        return None
    return ("config.mamba_tree: the Mamba pool has no free slot and no evictable state, so the "
            "chunk's checkpoint copy would assert (upstream _alloc_mamba_slot: 'Can not alloc "
            "mamba cache')")


def evictable(s: State) -> list:
    """Nodes with a state and no Mamba lock (the Mamba LRU's `get_lru_no_lock` walk)."""
    return [n for n in dict.values(s.nodes)
            if n.id != ROOT and n.mamba_value is not None and n.mamba_lock_ref == 0]


def split(upper) -> None:
    """`redistribute_on_node_split`: the new upper half has no state and no Mamba lock."""
    upper.mamba_value = None
    upper.mamba_lock_ref = 0
    upper.mamba_tick = 0


def commit_insert(s: State, node, is_new_leaf: bool, value: int) -> bool:
    """`commit_insert_component_data` on the node the insert ended on; returns
    `mamba_exist` (the node kept its own state and value was not taken)."""
    exist = node.mamba_value is not None and not is_new_leaf
    if not exist:
        node.mamba_value = value
    touch(s, node)
    return exist


def admission_short(s: State, needed: int) -> bool:
    """kvcheck's admission glue under the Mamba tree: the slots `alloc` takes plus one for
    the checkpoint copy the prefill ends with must be free or evictable (upstream sizes
    its pool so this holds; short of it `_alloc_mamba_slot` asserts)."""
    return needed + 1 > len(s.mamba_free_slots) + len(evictable(s))


def cow_refusal(s: State, req) -> Optional[str]:
    """Why scheduling req now could hit the copy-on-write's assertion (no free slot and
    no state but the matched one to evict), or None. Conservative: the matched node is
    not known before the match, so one evictable state is not counted."""
    if not on(s) or req.mamba_pool_idx is not None or s.mamba_free_slots:
        return None
    slot = dict.get(s.slots, req.session) if req.session is not None else None
    if slot is not None and slot.row is not None and not req.to_finish:
        return None                     # restored from its session slot: no match, no copy
    if len(evictable(s)) > 1:
        return None
    return ("config.mamba_tree: the Mamba pool has no free slot and at most one evictable "
            "state, so the match's copy-on-write could assert (upstream "
            "finalize_match_result_in_cache: 'Can not alloc mamba cache')")
