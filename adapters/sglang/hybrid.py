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

SWA (issue 15): the real `SWATokenToKVPoolAllocator` constructs and runs on the CPU in
0.5.15 and 0.5.23 over a real one-head `SWAKVPool` (`swa_allocator`), with no stand-in.
0.5.15 (wrapper era): the tree production pairs with it, `SWARadixCache` wrapped by
`StreamingSession`, is driven too (adapters/sglang/swa_tree.py). 0.5.23 (borrow era):
`UnifiedRadixCache`'s SWA component is not driven (refused with one line): its
`swa_evict_floor`/`component_evicted_seqlens` records and its tree component have no
read-back here yet (docs/semantics.md, "SWA on the real releases").
Also not driven: a hybrid config on 0.5.22+ (Mamba lives on `req.kv` there).
"""
from __future__ import annotations

import types


def refusal(cfg, api: str):
    """Why this adapter cannot run cfg's hybrid fields on this release, or None."""
    if cfg.swa_window and api != "flat":
        return ("config.swa_window: the sglang adapter drives the SWA tree on the wrapper era "
                "(0.5.15 SWARadixCache) only, not 0.5.23's UnifiedRadixCache SWA component; "
                "use swa_window=0 with a borrow-era release")
    if cfg.mamba_slots and api != "flat":
        return "config.mamba_slots: the Mamba pool is driven on the wrapper era (0.5.15) only"
    return None


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
    kv = SWAKVPool(size=size, size_swa=size_swa, page_size=P, dtype=torch.bfloat16, head_num=1,
                   head_dim=1, swa_attention_layer_ids=[0], full_attention_layer_ids=[1],
                   device="cpu", enable_memory_saver=False)
    return SWATokenToKVPoolAllocator(size=size, size_swa=size_swa, page_size=P,
                                     dtype=torch.bfloat16, device="cpu", kvcache=kv,
                                     need_sort=False)


def swa_probe(cfg) -> dict:
    """Run the real SWA allocator of this release through one request's life on the CPU
    (alloc_extend of 3 tokens, a decode past a page boundary, the window's free_swa of
    the first page, the release's free) and report what its own counters say, so a test
    can show it needs no CUDA and no stand-in (the served release runs it: `run_trace
    --serve`'s `swa_probe`). cfg: page_size 2, swa_window set."""
    import torch
    from adapters.sglang import shim
    alloc, I = swa_allocator(cfg), torch.int64
    shim.arm()
    t = lambda *v: torch.tensor(list(v), dtype=I)  # noqa: E731
    out = alloc.alloc_extend(prefix_lens=t(0), prefix_lens_cpu=t(0), seq_lens=t(3),
                             seq_lens_cpu=t(3), last_loc=t(-1), extend_num_tokens=3)
    dec = alloc.alloc_decode(seq_lens=t(5), seq_lens_cpu=t(5), last_loc=out[-1:] + 1)
    held = torch.cat([out, dec])
    mapped = alloc.full_to_swa_index_mapping[held].tolist()
    alloc.free_swa(out[:2])
    after_window = (alloc.full_available_size(), alloc.swa_available_size())
    alloc.free(held)
    return dict(mapped=mapped, after_window=list(after_window),
                after_free=[alloc.full_available_size(), alloc.swa_available_size()],
                stub_calls=shim.calls())


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
