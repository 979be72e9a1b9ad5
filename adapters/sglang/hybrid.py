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

Not driven (refused with one line): the SWA allocator and `SWARadixCache` (tombstones,
SWA LRU and SWA locks are not in the model), and any hybrid config on 0.5.22+.
"""
from __future__ import annotations

import types


def refusal(cfg, api: str):
    """Why this adapter cannot run cfg's hybrid fields on this release, or None."""
    if cfg.swa_window:
        return ("config.swa_window: the sglang adapter drives no SWA allocator / SWARadixCache "
                "(docs/semantics.md, Hybrid models); use swa_window=0 with --backend sglang")
    if cfg.mamba_slots and api != "flat":
        return "config.mamba_slots: the Mamba pool is driven on the wrapper era (0.5.15) only"
    return None


def hybrid_req_to_token_pool(cfg):
    """A real `HybridReqToTokenPool` over a stand-in `MambaPool` (see module docstring)."""
    import torch
    from sglang.srt.mem_cache.allocator.mamba import MambaSlotAllocator
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool, ReqToTokenPool

    pool = HybridReqToTokenPool.__new__(HybridReqToTokenPool)
    ReqToTokenPool.__init__(pool, size=cfg.num_rows, max_context_len=cfg.max_context_len,
                            device="cpu", enable_memory_saver=False)
    pool.mamba_ping_pong_track_buffer_size = 2 if cfg.overlap else 1
    pool.enable_mamba_extra_buffer = cfg.mamba_extra_buffer != "off"
    pool.enable_mamba_extra_buffer_lazy = cfg.mamba_extra_buffer == "lazy"
    pool.enable_memory_saver = False
    pool.start_layer = 0
    pool.layer_transfer_counter = None
    pool.mamba_pool = types.SimpleNamespace(size=cfg.mamba_slots, replayssm_write_pos=None)
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


def mamba_short(pool, req) -> bool:
    """The admission glue's Mamba check (the spec's `spec.hybrid.mamba_short`): the slots
    `alloc` would take for req exceed the free ones."""
    alloc = getattr(pool, "mamba_allocator", None)
    if alloc is None:
        return False
    n = 1 if req.mamba_pool_idx is None else 0
    if pool.enable_mamba_extra_buffer and req.mamba_ping_pong_track_buffer is None:
        n += 1 if pool.enable_mamba_extra_buffer_lazy else pool.mamba_ping_pong_track_buffer_size
    return n > alloc.available_size()


def mamba_refs(holder) -> tuple:
    """(mamba_pool_idx, *track buffer) of a request or slot, as ints."""
    idx = getattr(holder, "mamba_pool_idx", None)
    buf = getattr(holder, "mamba_ping_pong_track_buffer", None)
    out = () if idx is None else (int(idx),)
    return out + (() if buf is None else tuple(int(x) for x in buf.tolist()))


def hybrid_view(cfg, pool) -> dict:
    """The AbstractState's Mamba fields (empty when the pool is off)."""
    if not cfg.mamba_slots:
        return {}
    return dict(mamba_slots=cfg.mamba_slots,
                mamba_free=tuple(sorted(int(m) for m in pool.mamba_allocator.free_slots.tolist())))
