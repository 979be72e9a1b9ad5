"""Upstream's own PrefillAdder budget (`admission` "reserve" / "reserve-held-rows": 0.5.15
schedule_policy.py `PrefillAdder` l.433-700, 0.5.23 prefill_budget.py): each admitted
request reserves its page-ceiled extend, a page and, when its prompt ends in the round,
its clipped max_new_tokens of decode headroom; the running batch reserves its remaining
output. `rem_total_tokens` is what the free and evictable KV leaves beyond those
reservations, `cur_rem_tokens` what it leaves beyond the round's extends alone."""
from __future__ import annotations

import enum
from typing import Optional

from kvcheck.impl import common


class AddReqResult(enum.Enum):
    """What `add_one_req` answers, and what `budget_state()` says of the round."""
    CONTINUE = enum.auto()      # the next request may be considered
    NO_TOKEN = enum.auto()      # the KV reservations are spent
    OTHER = enum.auto()         # the chunk budget is spent (or the chunk would be empty)


def truncated_extend_end(prefix_len: int, input_len: int, rem_chunk_tokens: Optional[int],
                         page_size: int) -> Optional[int]:
    """`add_one_req`'s extend end: the whole input when its page-ceiled extend fits the
    chunk budget; else `rem_chunk_tokens // P * P` tokens from the prefix, the end cut back
    to a page boundary of the sequence; None (OTHER) when that leaves nothing."""
    extend = input_len - prefix_len
    if rem_chunk_tokens is None or common.ceil_align(extend, page_size) <= rem_chunk_tokens:
        return input_len
    trunc_len = rem_chunk_tokens // page_size * page_size
    now_input_len = (prefix_len + trunc_len) // page_size * page_size
    return now_input_len if now_input_len > prefix_len else None


class PrefillBudget:
    """One PrefillAdder's budget for a round. `rows`, `offset` and `preempted` are read and
    changed by `preempt_to_schedule` as for the page budget: the free rows left (those a
    preemption freed added), `rem_total_token_offset`, and the requests preempted.
    `held_rows` (0.5.23): the batch-full test adds back the rows the admitted requests
    already hold; 0.5.14-0.5.22 count every admitted request against the free rows."""

    def __init__(self, allocator, tree_cache, page_size: int, rows: int,
                 rem_chunk_tokens: Optional[int], running_offset: int, held_rows: bool):
        self.allocator, self.tree_cache, self.page_size = allocator, tree_cache, page_size
        self.rows = rows
        self.rem_chunk_tokens = rem_chunk_tokens
        self.offset = running_offset            # rem_total_token_offset
        self.cur_offset = 0                     # cur_rem_token_offset
        self.held_rows = held_rows
        self.can_run = 0                        # len(can_run_list)
        self.new_rows = 0                       # admitted requests without a row
        self.preempted: list = []

    def _available_and_evictable(self) -> int:
        return self.allocator.available_size() + self.tree_cache.evictable_size()

    @property
    def rem_total_tokens(self) -> int:
        return self._available_and_evictable() - self.offset

    @property
    def cur_rem_tokens(self) -> int:
        return self._available_and_evictable() - self.cur_offset

    def budget_state(self) -> AddReqResult:
        if self.rem_total_tokens <= 0 or self.cur_rem_tokens <= 0:
            return AddReqResult.NO_TOKEN
        if self.rem_chunk_tokens is not None and self.rem_chunk_tokens <= 0:
            return AddReqResult.OTHER
        return AddReqResult.CONTINUE

    def batch_is_full(self) -> bool:
        """`len(can_run_list) >= get_num_allocatable_reqs(...)`, before the next match."""
        free = self.rows + self.new_rows        # free at the round's start, and preempted
        held = self.can_run - self.new_rows     # admitted requests that hold a row already
        return self.can_run >= free + (held if self.held_rows else 0)

    def _update_prefill_budget(self, req, prefix_len: int, end: int, max_new_tokens: int) -> None:
        """An admitted request's reservation: its page-ceiled extend and a page (for the
        page the allocation may add), and `max_new_tokens` of decode headroom (0 for a
        chunk that does not end the prompt)."""
        extend_input_len = common.ceil_align(end - prefix_len, self.page_size)
        self.offset += extend_input_len + max_new_tokens + self.page_size
        self.cur_offset += extend_input_len + self.page_size
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens -= extend_input_len
        self.can_run += 1
        if req.req_pool_idx is None:
            self.rows -= 1
            self.new_rows += 1
