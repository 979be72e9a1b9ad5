"""Req (upstream managers/schedule_batch.py, V1 per-field KV lengths)."""
from __future__ import annotations

from typing import Optional

import torch

FINISH_ABORT = "abort"
FINISH_LENGTH = "length"


class Req:
    def __init__(self, rid: int, origin_input_ids, max_new_tokens: int, session=None,
                 streaming: bool = False, rejected: bool = False):
        self.rid = rid
        self.origin_input_ids: list = list(origin_input_ids)
        self.output_ids: list = []
        self.max_new_tokens = max_new_tokens
        self.session = session                 # Session or None (req.session)
        self.streaming = streaming             # created by Session.create_req
        self.rejected = rejected               # create_req rejection stub
        self.phase = "queued"                  # queued | prefill | decode
        # KV fields
        self.req_pool_idx: Optional[int] = None
        self.kv_committed_len = 0
        self.kv_allocated_len = 0
        self.cache_protected_len = 0
        self.prefix_indices: Optional[torch.Tensor] = None
        self.last_node = None
        self.lock_held = False                 # the persistent admission lock (through last_node)
        self.kv_committed_freed = False
        self.kv_overallocated_freed = False
        self.inflight_middle_chunks = 0
        self.extend_end = 0                    # extend_range.end of the last chunk
        # finish state
        self.to_finish: Optional[str] = None
        self.finished_reason: Optional[str] = None
        self.finished_len: Optional[int] = None
        self.is_retracted = False
        self.logprob_start_len = -1            # as handle_generate_request resolved it
        # hybrid models (impl/swa.py, impl/mamba.py)
        self.swa_evicted_seqlen = 0
        self.swa_evict_floor = 0               # prefill-aware SWA (impl/swa.py); kept on retract
        self.swa_uuid_for_lock = None
        self.swa_branching_seqlen: Optional[int] = None     # borrow era (impl/swa_radix_cache.py)
        self.decode_batch_idx = 0
        self.mamba_pool_idx: Optional[torch.Tensor] = None
        self.mamba_ping_pong_track_buffer: Optional[torch.Tensor] = None
        # priority scheduling
        self.priority = 0
        self.wait_queue_entry_time = 0         # the scheduler's clock at the last queue entry
        self.fill_len = 0                      # len(full_untruncated_fill_ids) as last built
        self.prefix_len = 0                    # len(prefix_indices) at the last match

    @property
    def fill_ids(self) -> list:
        return self.origin_input_ids + self.output_ids

    def max_prefix_len(self) -> int:
        """`_compute_max_prefix_len`: one token short of the input (its logits), and no
        further than `logprob_start_len` when logprobs are returned from there."""
        limit = len(self.fill_ids) - 1
        if self.logprob_start_len >= 0:
            limit = min(limit, self.logprob_start_len)
        return max(limit, 0)

    @property
    def seqlen(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    def finished(self) -> bool:
        return self.finished_reason is not None

    def _cache_commit_len(self) -> int:
        return self.kv_committed_len

    def pop_committed_kv_cache(self) -> int:
        assert not self.kv_committed_freed, f"req {self.rid}: committed KV freed twice"
        self.kv_committed_freed = True
        return self._cache_commit_len()

    def pop_overallocated_kv_cache(self) -> tuple:
        assert not self.kv_overallocated_freed, f"req {self.rid}: overallocated KV freed twice"
        self.kv_overallocated_freed = True
        return self._cache_commit_len(), self.kv_allocated_len

    def reset_for_retract(self) -> None:
        self.kv_committed_len = 0
        self.kv_allocated_len = 0
        self.cache_protected_len = 0
        self.prefix_indices = None
        self.last_node = None
        self.lock_held = False
        self.kv_committed_freed = False
        self.kv_overallocated_freed = False
        self.inflight_middle_chunks = 0
        self.extend_end = 0
        self.swa_evicted_seqlen = 0
        self.swa_branching_seqlen = None
        self.decode_batch_idx = 0
        self.mamba_pool_idx = None
        self.mamba_ping_pong_track_buffer = None
        self.is_retracted = True
        self.phase = "queued"
