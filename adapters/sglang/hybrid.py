"""Hybrid models on a real release (0.5.15, wrapper era): the Mamba pool.

Driven for real: `HybridReqToTokenPool.alloc` / `free_mamba_cache` /
`_alloc_ping_pong_buffer` (called by upstream's `alloc_req_slots` and
`release_kv_cache`), `MambaSlotAllocator`, and `StreamingSession`'s `save_from_req`,
`restore_to_req`, ephemeral abort slot and `_free_slot_mamba`. Stood in: `MambaPool`,
the per-layer conv/SSM state tensors, which no bookkeeping path reads (upstream builds
them from a model's `cache_params`); its two attributes the bookkeeping touches are
given (`size`, `replayssm_write_pos = None`: no ReplaySSM). The pool object is a real
`HybridReqToTokenPool` whose `__init__` (which would build `MambaPool`) is replaced by
`ReqToTokenPool.__init__` plus the attributes `_init_mamba_pool` sets.

SWA: the real `SWATokenToKVPoolAllocator` constructs and runs on the CPU in
0.5.15 and 0.5.23 over a real one-head `SWAKVPool` (`swa_allocator`), with no stand-in.
0.5.15 (wrapper era): the tree production pairs with it, `SWARadixCache` wrapped by
`StreamingSession`, is driven too (adapters/sglang/swa_tree.py). 0.5.23 (borrow era):
`UnifiedRadixCache` with the FULL + SWA components is built as production builds it and
driven and read back (adapters/sglang/swa_unified.py: cursors, floors, a request's
`swa_branching_seqlen`, per-node SWA values and locks, the SWA lock boundary; C6/C7 on the
concrete tree), and runs in `check`/`fuzz`: the spec follows the release's SWA component
(the checkpoint's out-of-window free, tombstone node and window-capped leaf,
`swa_branching_seqlen`, an insert's tombstone recovery, the joint FULL + SWA eviction for
an allocation over the SWA LRU, the SWA-lock evictable size; docs/semantics.md, "The 0.5.23
SWA tree against the spec"), and every walk of the campaign (benchmarks/swa_0523_campaign.py)
without prefill-aware SWA passes. `refusal` keeps one line for prefill-aware SWA on this
tree (candidate W1: 0.5.23 builds it only for an all-SWA model, `PureSWARadixCache`) and
one for SWA beside a Mamba pool or a disabled tree (not driven).

Mamba on 0.5.23 (borrow era), two pairings, both driven:
- the tree on, `config.mamba_tree`: `UnifiedRadixCache` with FULL + MAMBA components, what
  production builds for a hybrid SSM model (`registry.py` `create_unified_radix_cache`
  l.149-169; `seed_server_args` gives the component its `mamba_cache_chunk_size`).
  Driven for real: the component's match (`finalize_match_result_in_cache`, the
  copy-on-write a request takes through `init_next_round_input`), checkpoints
  (`checkpoint_into_tree`: the copy into a fresh slot for an unfinished request, the
  donation of a finished one's own slot, `cleanup_after_caching_req`), Mamba eviction
  (`evict_for_alloc(mamba_num=...)` from `ensure_mamba_capacity`, `_alloc_mamba_slot` and
  the copy-on-write), the nodes' Mamba locks and LRU. Stood in: `MambaPool.copy_from`
  (the one state operation those paths call; recorded, no tensor). Read back
  (`node_mamba`): each node's state and Mamba lock_ref (`component_data[MAMBA]`), beside
  its KV and full lock; the Mamba LRU order shows only through what eviction takes.
  Glue (the scheduler's inline code, replicated): a request `add_one_req` does not add
  gives its copy-on-write back when it has no session (`revert_cow`); a queued abort
  releases a state it holds (`release_queued_mamba`: a copy-on-write slot held without
  a row is freed; a turn that borrows its slot's record reaches `try_cache_finished_req`
  and `finish_req`, finding M2, which the spec follows under `--accept M2`,
  docs/upstream-findings.md; the tree off takes the same branch); admission needs the
  slots `alloc` takes plus the checkpoint copy from free and evictable states
  (`mamba_short`). Modelled with page_size 1, no extra buffer, no chunking, no SWA.
- the tree off, `config.disable_radix_cache` (`--disable-radix-cache`: the same classes
  with `disable` set, whose tree keeps no Mamba state): `take` makes the turn's record the
  slot's (`slot.kv is req.kv`, Mamba refs included, from the first row allocation),
  `release_session` ends with `_free_slot_mamba`, which frees only the track entries
  `mamba_ping_pong_empty` marks allocated, and an aborted turn gets the record back and
  is released like a plain request, through `MambaComponent.cleanup_after_caching_req`
  (`free_mamba_cache`, keep none); all extra-buffer modes.
The pool is built as on 0.5.15 plus 0.5.23's `mamba_initial_tracking_slots` and
`ple_window_cache`; the refs live on `req.kv`, a `ReqKvInfo`, read through `kv_record`.
The adapter refuses 0.5.23 Mamba with the tree on and no `mamba_tree` (a pairing whose
tree states the spec would not model). `mamba_tree_probe` runs that refused pairing
beside the spec without `mamba_tree` and shows where they part (the checkpoint's copy,
I44 at the first prefill). Figures: docs/semantics.md, "Hybrid models".

Mamba on 0.5.15 (wrapper era), two pairings, both driven:
- the tree on, `config.mamba_tree`: what production pairs with a hybrid SSM model,
  `StreamingSession(MambaRadixCache)` (`mamba_radix_cache`), over the real
  `HybridReqToTokenPool`. Driven for real: its match and copy-on-write (through
  `init_next_round_input`, `cow_mamba` = `supports_mamba()`), `cache_unfinished_req`'s
  copy (`mamba_pool.copy_from`, the stand-in's one state operation: recorded, no
  tensor), `cache_finished_req`'s donation, `evict_mamba` / `evict_full` with their
  tombstone cascades, the two LRU lists, `alloc_req_slots`' Mamba eviction before every
  `alloc`, the nodes' Mamba locks; read back per node (`node_mamba`: `mamba_value`,
  `mamba_lock_ref`) beside the KV and full lock, the full LRU order as `evict_full` pops
  it (`swa_tree.eviction_order`), and upstream's pool checks with `is_hybrid_ssm` (its
  `MambaRadixCache` branches). Glue replicated from `get_new_batch_prefill` /
  `abort_request` (l.2905-2921, l.3905-3910): `revert_cow`, `release_queued_mamba`
  (a queued turn restored from its slot holds the slot's row and reaches
  `try_cache_finished_req` -> `finish_req`: M2 on this release too, followed by the
  spec under `--accept M2`). What stays stood in is the `MambaPool` tensors (above): nothing
  the bookkeeping reads. Modelled with page_size 1, no extra buffer (v1 asserts page 1
  without it), no chunking, no SWA, no int8 checkpoints.
- the tree a plain `RadixCache` (no `mamba_tree`; not a production pairing): a plain
  release frees the state, the tree holds none; what it covers is the pool, the
  allocator, and every session path that moves, shares or frees a Mamba ref (I44, I45;
  finding M1, whose lazy track buffer the Mamba tree is not modelled with).
"""
from __future__ import annotations

import types

from kvcheck.spec.swa_pool import swa_keep


def refusal(cfg, api: str, version: str = ""):
    """Why this adapter cannot run cfg's hybrid fields on this release (`version`, e.g.
    "0.5.14"; "" when not known yet), or None."""
    if cfg.swa_window and not spec_swa_tree(version):
        return (f"config.swa_window: sglang {version}'s SWARadixCache caches a finished "
                "request's out-of-window output with its SWA KV, where 0.5.15's, which the "
                "spec's SWA tree follows, keeps it as a tombstone and frees that SWA KV "
                "(docs/upstream-findings.md, \"Older releases\")")
    if (cfg.swa_window or cfg.mamba_tree) and api == "flat" and not spec_wrapper_trees(version):
        what = "config.swa_window" if cfg.swa_window else "config.mamba_tree"
        return (f"{what}: sglang {version}'s scheduler builds a UnifiedRadixCache for a hybrid "
                "model under the StreamingSession wrapper (mem_cache/registry.py "
                "create_tree_cache), where 0.5.15 built SWARadixCache / MambaRadixCache, "
                "which the spec's wrapper-era hybrid trees follow; the spec models the "
                "unified components in the borrow era only (docs/upstream-findings.md, "
                "\"Releases between\")")
    if cfg.swa_window and api != "flat" and not spec_swa_keep(version) and \
            swa_keep(cfg.swa_window, cfg.page_size) != max(cfg.swa_window, cfg.page_size):
        return (f"config.swa_window {cfg.swa_window} on page size {cfg.page_size}: sglang "
                f"{version} keeps max(window, P) = {max(cfg.swa_window, cfg.page_size)} SWA "
                "tokens behind pre_len (free_swa_out_of_window_slots), where 0.5.23, which "
                "the spec's SWA follows, keeps ceil_align(max(window, P), P) = "
                f"{swa_keep(cfg.swa_window, cfg.page_size)}; use a window of at most a page "
                "or a page multiple (docs/upstream-findings.md, \"Releases between\")")
    if cfg.swa_window and api != "flat" and cfg.prefill_aware_swa:
        return ("config.prefill_aware_swa: 0.5.23 pairs prefill-aware SWA only with an all-SWA "
                "model (PureSWARadixCache), not with the UnifiedRadixCache this adapter drives, "
                "where the release leaks SWA pages (candidate W1, docs/semantics.md); use "
                "prefill_aware_swa=False")
    if cfg.swa_window and api != "flat" and (cfg.disable_radix_cache or cfg.mamba_slots):
        return ("config.swa_window with disable_radix_cache or mamba_slots: the adapter drives "
                "0.5.23's SWA component on the radix tree of a sliding-window model only")
    if cfg.mamba_slots and api != "flat" and not cfg.disable_radix_cache and not cfg.mamba_tree:
        return ("config.mamba_slots: on 0.5.22+ a hybrid SSM model's tree is UnifiedRadixCache "
                "with a Mamba component, which keeps Mamba states in tree nodes; use "
                "mamba_tree=True (the component, adapters/sglang/hybrid.py) or "
                "disable_radix_cache=True (a tree that keeps none)")
    return None


def release_tuple(version) -> tuple:
    """(0, 5, 14) of "0.5.14", "0.5.14.post1" or "sglang-0.5.14"; (999,) when not a release
    number (an unversioned backend, None)."""
    try:
        return tuple(int(x) for x in (version or "").rsplit("-", 1)[-1].split(".")[:3])
    except ValueError:
        return (999,)


def spec_swa_tree(version) -> bool:
    """Whether the release's SWARadixCache is the one the spec's SWA tree follows (0.5.15's
    and later; an unversioned backend is taken to be)."""
    return release_tuple(version) >= (0, 5, 15)


def spec_wrapper_trees(version) -> bool:
    """Whether a wrapper-era release builds 0.5.15's SWARadixCache / MambaRadixCache for a
    hybrid model (0.5.14-0.5.15; an unversioned backend is taken to): from 0.5.16 its
    registry routes every hybrid SWA or SSM model to UnifiedRadixCache."""
    return release_tuple(version) < (0, 5, 16) or release_tuple(version) == (999,)


def evicts_shortfall(version) -> bool:
    """Whether a wrapper-era release's `evict_from_tree_cache` evicts only the allocation's
    shortfall (0.5.17+, `Config.evict_shortfall`) rather than its whole need (0.5.14-0.5.16;
    an unversioned backend is taken to be recent)."""
    return release_tuple(version) >= (0, 5, 17)


def filters_before_prefill(version) -> bool:
    """Whether the release filters the finished requests out of the running batch before
    every prefill round (0.5.23 scheduler.py l.3963-3968, `Config.filter_before_prefill`);
    before it they stay until `update_running_batch`."""
    return release_tuple(version) >= (0, 5, 23)


def admission_rule(version) -> str:
    """The `Config.admission` value that follows the release's own PrefillAdder round:
    'reserve-held-rows' from 0.5.23 (the rows the round's requests hold added back,
    scheduler.py l.4225; `budget_state()` OTHER before each match, l.4207), 'reserve'
    before it (0.5.15 scheduler.py l.2728-2731 and l.2853-2858; 0.5.22 l.3907-3925)."""
    return "reserve-held-rows" if release_tuple(version) >= (0, 5, 23) else "reserve"


def spec_swa_keep(version) -> bool:
    """Whether the release keeps `ceil_align(max(window, P), P)` SWA tokens behind pre_len
    (kvcheck.spec.swa_pool.swa_keep: 0.5.23, and the wrapper era, whose rule is its own): 0.5.22
    keeps `max(window, P)`, which is the same when that is a page multiple."""
    return not (0, 5, 22) <= release_tuple(version) < (0, 5, 23)


def swa_allocator(cfg):
    """The real `SWATokenToKVPoolAllocator` over a real `SWAKVPool` on the CPU, in both
    releases: one SWA layer and one full layer of one head of dimension 1 (a few bytes
    per token; no bookkeeping path reads the KV values; `register_mapping` is all the
    allocator asks of the pool). Nothing is stood in and nothing needs CUDA (P > 1 runs
    the Triton kernels under TRITON_INTERPRET, as the plain paged allocator does). The
    backend builds it for an SWA config on 0.5.15 (adapters/sglang/swa_tree.py)."""
    import torch
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
    P = cfg.page_size
    size, size_swa = cfg.num_pages * P, cfg.swa_pages * P
    import inspect
    extra = {}      # 0.5.11-0.5.14 ask for the KV layout flag (no default)
    if "enable_kvcache_transpose" in inspect.signature(SWAKVPool.__init__).parameters:
        extra["enable_kvcache_transpose"] = False
    kv = SWAKVPool(size=size, size_swa=size_swa, page_size=P, dtype=torch.bfloat16, head_num=1,
                   head_dim=1, swa_attention_layer_ids=[0], full_attention_layer_ids=[1],
                   device="cpu", enable_memory_saver=False, **extra)
    return SWATokenToKVPoolAllocator(size=size, size_swa=size_swa, page_size=P,
                                     dtype=torch.bfloat16, device="cpu", kvcache=kv,
                                     need_sort=False)


class MambaPoolStandIn(types.SimpleNamespace):
    """What the bookkeeping reads of `MambaPool` (its `size`; no ReplaySSM: the
    `replayssm_*` cursors None). Its one state operation, `copy_from(src, dst)` (0.5.23's
    Mamba tree component copies a request's state into a tree slot at a checkpoint),
    copies no tensor: each call is recorded in `copies` as (src, dst) slot ids."""

    def copy_from(self, src_index, dst_index) -> None:
        self.copies.append((src_index.tolist(), dst_index.tolist()))


def hybrid_req_to_token_pool(cfg):
    """A real `HybridReqToTokenPool` over a stand-in `MambaPool` (see module docstring).
    0.5.23's `__init__` sets two more attributes its bookkeeping reads
    (`mamba_initial_tracking_slots`, `allocation_sizing.get_mamba_tracking_slots`;
    `ple_window_cache`)."""
    import torch
    from sglang.srt.mem_cache.allocator.mamba import MambaSlotAllocator
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool, ReqToTokenPool

    pool = HybridReqToTokenPool.__new__(HybridReqToTokenPool)
    ReqToTokenPool.__init__(pool, size=cfg.num_rows, max_context_len=cfg.max_context_len,
                            device="cpu", enable_memory_saver=False)
    pool.mamba_ping_pong_track_buffer_size = 2 if cfg.overlap else 1
    pool.enable_mamba_extra_buffer = cfg.mamba_extra_buffer != "off"
    pool.enable_mamba_extra_buffer_lazy = cfg.mamba_extra_buffer == "lazy"
    pool.mamba_initial_tracking_slots = 0 if not pool.enable_mamba_extra_buffer else (
        1 if pool.enable_mamba_extra_buffer_lazy else pool.mamba_ping_pong_track_buffer_size)
    pool.ple_window_cache = None
    pool.enable_memory_saver = False
    pool.start_layer = 0
    pool.layer_transfer_counter = None
    pool.mamba_pool = MambaPoolStandIn(size=cfg.mamba_slots, replayssm_write_pos=None,
                                       replayssm_spec_write_pos=None,
                                       replayssm_cache_base=None, replayssm_is_flush=None,
                                       copies=[])
    pool.mamba_allocator = MambaSlotAllocator(size=cfg.mamba_slots, device="cpu")
    pool.mamba_map = {}
    pool.mamba_ckpt_pool = None
    pool.device = "cpu"
    rows = pool.req_to_token.shape[0]
    pool.req_index_to_mamba_index_mapping = torch.zeros(rows, dtype=torch.int32)
    if pool.enable_mamba_extra_buffer:
        pool.req_index_to_mamba_ping_pong_track_buffer_mapping = torch.zeros(
            (rows, pool.mamba_ping_pong_track_buffer_size), dtype=torch.int64)
    return pool


def kv_record(holder):
    """Where a request's or slot's Mamba refs live: the holder itself in 0.5.15, its
    `ReqKvInfo` (`holder.kv`, shared by a slot and the turn borrowing it) in 0.5.22+. In
    0.5.16-0.5.18 `holder.kv` holds the allocated length and SWA cursor only, the Mamba
    refs stay on the holder."""
    kv = getattr(holder, "kv", None)
    return kv if kv is not None and hasattr(kv, "mamba_pool_idx") else holder


MAMBA_CHUNK = 64
"""`mamba_cache_chunk_size` without a model config: FLA's `CHUNK_SIZE`, the value 0.5.23
falls back to when the model declares no `mamba_chunk_size` (`arg_groups/overrides.py`
l.1897-1917)."""


def seed_server_args(args) -> None:
    """0.5.23's Mamba tree component reads `mamba_cache_chunk_size` at construction, from
    the model's HF config, which a dummy model path cannot load; upstream's own fixtures
    pre-seed `_mamba_cache_chunk_size`, which `overrides.mamba_cache_chunk_size` honours."""
    args._mamba_cache_chunk_size = MAMBA_CHUNK


def cache_params(cfg) -> dict:
    """The `CacheInitParams` fields of 0.5.23's `UnifiedRadixCache` for cfg: the tree
    components `create_unified_radix_cache` (`mem_cache/registry.py` l.160-167) picks
    (FULL, plus MAMBA for a hybrid SSM model) and the extra-buffer flags."""
    from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
    if not cfg.mamba_slots:
        return dict(tree_components=(ComponentType.FULL,))
    return dict(tree_components=(ComponentType.FULL, ComponentType.MAMBA),
                enable_mamba_extra_buffer=cfg.mamba_extra_buffer != "off",
                enable_mamba_extra_buffer_lazy=cfg.mamba_extra_buffer == "lazy")


def tree_mamba(backend) -> list:
    """(key path length, Mamba slot or None, MAMBA lock_ref) of every node of a 0.5.23
    tree with a Mamba component, in path order."""
    from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
    out, stack = [], [(backend._root(), 0)]
    while stack:
        node, depth = stack.pop()
        for child in node.children.values():
            d = depth + len(child.key)
            data = child.component_data[ComponentType.MAMBA]
            value = None if data.value is None else [int(v) for v in data.value.tolist()]
            out.append((d, value, int(data.lock_ref)))
            stack.append((child, d))
    return sorted(out, key=repr)


PROBE_OPS = "submit_request 1; schedule 1; decode 1; finish 1; submit_request 2 (shares 1's prompt); " \
    "schedule 2; finish 2; open_session 1; submit_turn 3; schedule 3; finish 3; close_session 1"


def mamba_short(pool, req, tree=None) -> bool:
    """The admission glue's Mamba check (the spec's `kvcheck.spec.mamba_pool.mamba_short`): the
    slots `alloc` would take for req exceed the free ones. With a Mamba tree component (`tree`,
    `kvcheck.spec.mamba_tree.admission_short`): those plus the checkpoint copy exceed the free
    slots and the tree's unlocked states (`mamba_evictable_size`)."""
    alloc = getattr(pool, "mamba_allocator", None)
    if alloc is None:
        return False
    kv = kv_record(req)
    n = 1 if kv.mamba_pool_idx is None else 0
    if pool.enable_mamba_extra_buffer and kv.mamba_ping_pong_track_buffer is None:
        n += 1 if pool.enable_mamba_extra_buffer_lazy else pool.mamba_ping_pong_track_buffer_size
    if tree is not None:
        return n + 1 > alloc.available_size() + int(tree.mamba_evictable_size())
    return n > alloc.available_size()


def revert_cow(pool, req) -> None:
    """0.5.23 `Scheduler.get_new_batch_prefill` for a request `add_one_req` did not add
    (scheduler.py l.4284-4297, inline there): the staged copy-on-write is dropped and a
    request without a session frees the slot `finalize_match_result_in_cache` gave it."""
    kv = kv_record(req)
    kv.mamba_cow_src_index = None
    kv.mamba_needs_clear = False
    if holds_mamba(kv) and not getattr(req, "session", None):
        pool.mamba_allocator.free(kv.mamba_pool_idx.unsqueeze(-1))
        kv.mamba_pool_idx = None


def release_queued_mamba(req, cache) -> None:
    """`Scheduler.abort_request`, waiting-queue branch, "For mamba radix cache": a popped
    request holding a Mamba state is released. 0.5.23 (scheduler.py l.5716-5721, the Mamba
    tree on or off): `release_kv_cache(req, checkpoint=False)`, driven as upstream runs
    it: a copy-on-write slot held without a row is freed (the `not holds_kv` branch); a
    queued turn that borrows its slot's record (holds_kv) goes through `claim_kv_row` ->
    `try_cache_finished_req` -> `finish_req` (finding M2: the spec follows it under
    `--accept M2`; without, runs leave the trigger out, `adapters/sglang/findings.py`).
    0.5.15 (scheduler.py l.3905-3910, `release_kv_cache(req, is_insert=False)` for any
    request with a `mamba_pool_idx`, with `MambaRadixCache` or a plain tree): a request
    without a row has its state freed (`req_pool_idx is None`); a turn restored from its
    slot holds the slot's row and reaches the wrapper's `try_cache_finished_req` ->
    `finish_req` (M2 on this release too)."""
    import inspect
    from sglang.srt.mem_cache.common import release_kv_cache
    kv = kv_record(req)
    if kv is req:                               # 0.5.15
        if req.mamba_pool_idx is not None:
            release_kv_cache(req, cache, is_insert=False)
    elif kv.holds_mamba and "checkpoint" in inspect.signature(release_kv_cache).parameters:
        release_kv_cache(req, cache, checkpoint=False)
    elif kv.holds_mamba:                        # 0.5.19-0.5.21 (scheduler.py: 0.5.19
        release_kv_cache(req, cache, is_insert=False)   # l.5010-5015, 0.5.21 l.5484-5489)


def holds_mamba(kv) -> bool:
    """`ReqKvInfo.holds_mamba` (0.5.22+); a 0.5.15 `Req` holds one when it has a
    `mamba_pool_idx`."""
    return kv.holds_mamba if hasattr(kv, "holds_mamba") else kv.mamba_pool_idx is not None


def node_mamba(cfg, node) -> dict:
    """A tree node's NodeView Mamba fields (its state, its Mamba lock_ref), as
    `kvcheck.spec.view.node_mamba_view` gives them; {} without a Mamba tree. 0.5.23:
    `component_data[MAMBA]`; 0.5.15 `MambaRadixCache`'s `TreeNode`: `mamba_value`,
    `mamba_lock_ref`."""
    if not cfg.mamba_tree:
        return {}
    from kvcheck.spec.view import node_mamba_view
    if hasattr(node, "component_data"):
        from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
        data = node.component_data[ComponentType.MAMBA]
        value, lock = data.value, data.lock_ref
    else:
        value, lock = node.mamba_value, node.mamba_lock_ref
    return node_mamba_view(None if value is None else int(value.reshape(-1)[0].item()), int(lock))


def mamba_radix_cache(cfg, pool, alloc):
    """0.5.15's hybrid SSM tree as production builds it with `--enable-streaming-session`:
    `StreamingSession(MambaRadixCache(params))` (page_size 1, no extra buffer: its v1
    asserts page 1) over the real `HybridReqToTokenPool`; returns (the wrapper, the
    tree). Its only state operation, `mamba_pool.copy_from` in `cache_unfinished_req`,
    reaches the stand-in `MambaPool` (recorded, no tensor)."""
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.mamba_radix_cache import MambaRadixCache
    from sglang.srt.session.streaming_session import StreamingSession
    params = CacheInitParams(disable=False, req_to_token_pool=pool,
                             token_to_kv_pool_allocator=alloc, page_size=cfg.page_size,
                             enable_mamba_extra_buffer=False, enable_mamba_extra_buffer_lazy=False)
    tree = MambaRadixCache(params)
    return StreamingSession(tree), tree


def mamba_refs(holder) -> tuple:
    """(mamba_pool_idx, *track buffer) of a request or slot, as ints."""
    kv = kv_record(holder)
    idx = getattr(kv, "mamba_pool_idx", None)
    buf = getattr(kv, "mamba_ping_pong_track_buffer", None)
    out = () if idx is None else (int(idx),)
    return out + (() if buf is None else tuple(int(x) for x in buf.tolist()))


def hybrid_view(cfg, pool) -> dict:
    """The AbstractState's Mamba fields (empty when the pool is off)."""
    if not cfg.mamba_slots:
        return {}
    return dict(mamba_slots=cfg.mamba_slots,
                mamba_free=tuple(sorted(int(m) for m in pool.mamba_allocator.free_slots.tolist())))


