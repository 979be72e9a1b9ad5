"""Mamba state pool (upstream mem_cache/allocator/mamba.py `MambaSlotAllocator` and
mem_cache/memory_pool.py `HybridReqToTokenPool`).

One state slot per request row (`mamba_pool_idx`, a 0-d tensor; slot 0 is the reserved
dummy write target), plus the ping-pong track buffer when the extra buffer is enabled:
2 entries under the overlap scheduler, else 1; lazy mode allocates the first and leaves
the second at -1, the "none" sentinel. The tree cache keeps no Mamba state here (plain
RadixCache: `release_kv_cache` calls `free_mamba_cache`).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from kvcheck.impl import faults
from kvcheck.impl.memory_pool import ReqToTokenPool

I64 = torch.int64
EMPTY_TRACK = -1


class MambaSlotAllocator:
    def __init__(self, size: int, device):
        self.size = size
        self.device = device
        self.clear()

    def clear(self) -> None:
        self.free_slots = torch.arange(1, self.size + 1, dtype=I64, device=self.device)

    def available_size(self) -> int:
        return len(self.free_slots)

    def alloc(self, need_size: int) -> Optional[torch.Tensor]:
        if need_size > len(self.free_slots):
            return None
        out, self.free_slots = self.free_slots[:need_size], self.free_slots[need_size:]
        return out

    def free(self, free_index: torch.Tensor) -> None:
        if free_index.numel() == 0:
            return
        self.free_slots = torch.cat((self.free_slots, free_index.to(I64).reshape(-1)))


class HybridReqToTokenPool(ReqToTokenPool):
    def __init__(self, size: int, max_context_len: int, mamba_size: int, device=None,
                 enable_mamba_extra_buffer: bool = False, enable_mamba_extra_buffer_lazy: bool = False,
                 enable_overlap_schedule: bool = False):
        super().__init__(size, max_context_len, device)
        self.mamba_allocator = MambaSlotAllocator(mamba_size, self.device)
        self.enable_mamba_extra_buffer = enable_mamba_extra_buffer
        self.enable_mamba_extra_buffer_lazy = enable_mamba_extra_buffer_lazy
        self.mamba_ping_pong_track_buffer_size = 2 if enable_overlap_schedule else 1

    def mamba_slots_needed(self, req) -> int:
        """Slots `alloc` would take for req (admission checks them first)."""
        n = 1 if req.mamba_pool_idx is None else 0
        if self.enable_mamba_extra_buffer and req.mamba_ping_pong_track_buffer is None:
            n += 1 if self.enable_mamba_extra_buffer_lazy else self.mamba_ping_pong_track_buffer_size
        return n

    def alloc(self, reqs: Sequence) -> Optional[list[int]]:
        select_index = super().alloc(reqs)
        if select_index is None:
            return None
        for req in reqs:
            if req.mamba_pool_idx is None:
                mid = self.mamba_allocator.alloc(1)
                assert mid is not None, "Not enough space for mamba cache"
                req.mamba_pool_idx = mid[0]
            if self.enable_mamba_extra_buffer and req.mamba_ping_pong_track_buffer is None:
                self._alloc_ping_pong_buffer(req)
        return select_index

    def _alloc_ping_pong_buffer(self, req) -> None:
        n = 1 if self.enable_mamba_extra_buffer_lazy else self.mamba_ping_pong_track_buffer_size
        slots = self.mamba_allocator.alloc(n)
        assert slots is not None, "Not enough space for mamba ping pong idx"
        buf = torch.full((self.mamba_ping_pong_track_buffer_size,), EMPTY_TRACK, dtype=I64,
                         device=self.device)
        buf[:n] = slots
        req.mamba_ping_pong_track_buffer = buf

    def free_mamba_cache(self, req) -> None:
        assert req.mamba_pool_idx is not None, "double free? mamba_index is None"
        self.mamba_allocator.free(req.mamba_pool_idx.unsqueeze(0))
        req.mamba_pool_idx = None
        if req.mamba_ping_pong_track_buffer is not None:
            buf = req.mamba_ping_pong_track_buffer
            self.mamba_allocator.free(buf[buf != EMPTY_TRACK])
            req.mamba_ping_pong_track_buffer = None


def mamba_refs(holder) -> tuple:
    """(mamba_pool_idx, *track buffer) of a request or slot, as ints."""
    out = () if holder.mamba_pool_idx is None else (int(holder.mamba_pool_idx.item()),)
    buf = holder.mamba_ping_pong_track_buffer
    return out + (() if buf is None else tuple(buf.tolist()))
