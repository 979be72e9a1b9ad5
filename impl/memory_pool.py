"""ReqToTokenPool (upstream mem_cache/memory_pool.py) and the KV "buffer".

The KV buffer stands in for the real K/V tensors: per KV index it records the token id
whose KV the forward wrote there (-1: never written), so that an adapter can report
which token's KV each owned page position holds.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from kvcheck.impl import faults

from kvcheck.impl.device import resolve_device


class ReqToTokenPool:
    def __init__(self, size: int, max_context_len: int, device=None):
        self.size = size
        self.max_context_len = max_context_len
        self.device = resolve_device(device)
        self.req_to_token = torch.zeros((size, max_context_len), dtype=torch.int32, device=self.device)
        self.free_slots: list[int] = list(range(size))

    def available_size(self) -> int:
        return len(self.free_slots)

    def alloc(self, reqs: Sequence) -> Optional[list[int]]:
        """Rows for `reqs`. A request that already holds a row keeps it; the reuse must be
        a chunked continuation or a restored request with committed KV."""
        reusing = [r for r in reqs if r.req_pool_idx is not None]
        for r in reusing:
            assert r.inflight_middle_chunks > 0 or r.kv_committed_len > 0, (
                f"req {r.rid} reuses row {r.req_pool_idx} with inflight_middle_chunks="
                f"{r.inflight_middle_chunks} kv_committed_len={r.kv_committed_len}")
        need = len(reqs) - len(reusing)
        if need > len(self.free_slots):
            return None
        taken, self.free_slots = self.free_slots[:need], self.free_slots[need:]
        it = iter(taken)
        for r in reqs:
            if r.req_pool_idx is None:
                r.req_pool_idx = next(it)
        return [r.req_pool_idx for r in reqs]

    def free(self, req) -> None:
        assert req.req_pool_idx is not None, f"req {req.rid} frees no row"
        self.free_slots.append(req.req_pool_idx)
        if "free_keeps_req_pool_idx" not in faults.ACTIVE:
            req.req_pool_idx = None

    def write(self, row: int, start: int, values: torch.Tensor) -> None:
        self.req_to_token[row, start:start + len(values)] = values.to(torch.int32)

    def clear(self) -> None:
        self.free_slots = list(range(self.size))


class KVBuffer:
    """Per KV index, the token id whose KV was written there (-1: none)."""

    def __init__(self, num_pages: int, page_size: int, device=None):
        self.page_size = page_size
        self.device = resolve_device(device)
        self.token_of = torch.full(((num_pages + 1) * page_size,), -1, dtype=torch.int64, device=self.device)

    def set_kv_buffer(self, loc: torch.Tensor, token_ids: Sequence[int]) -> None:
        if len(token_ids) == 0:
            return
        self.token_of[loc.to(torch.int64)] = torch.as_tensor(list(token_ids), dtype=torch.int64, device=self.device)

    def read(self, page: int, offset: int) -> Optional[int]:
        v = int(self.token_of[page * self.page_size + offset].item())
        return None if v < 0 else v
