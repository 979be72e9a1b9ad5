"""The prefill round's admission (upstream schedule_policy.py `PrefillAdder`): the budget
the round's requests share, each request's admission test, and priority preemption."""
from __future__ import annotations

from typing import Optional

from kvcheck.impl import common, faults
from kvcheck.impl.mamba import HybridReqToTokenPool
from kvcheck.impl.prefill_budget import AddReqResult, PrefillBudget, truncated_extend_end
from kvcheck.impl.schedule_batch import Req
from kvcheck.impl.swa_radix_cache import swa_lock_boundary


def chunk_end(prefix: int, input_len: int, chunk_size: Optional[int], p: int) -> int:
    if chunk_size is None:
        return input_len
    return min(input_len, prefix + (chunk_size // p) * p)


CLIP_MAX_NEW_TOKENS = 4096     # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION


def remaining_output(req: Req) -> int:
    """_get_running_request_total_token_offset (new_token_ratio 1)."""
    return min(req.max_new_tokens - len(req.output_ids), CLIP_MAX_NEW_TOKENS)


def _decode_headroom(req: Req, end: int, input_len: int) -> int:
    """What an admitted extend reserves for decoding: `min(max_new_tokens, CLIP)` when it
    ends the prompt, nothing for a chunk (the rest of the prompt is still to come)."""
    return min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS) if end == input_len else 0


class _RoundBudget:
    """What one PrefillAdder has left while it admits a round: rows, KV tokens reserved
    by the requests it admitted (page-ceiled extends), the chunk (None: unchunked) and,
    for preemption, the memory budget's total offset (the running batch's remaining
    output, then each admitted request's page-ceiled extend, a page and its max_new)."""

    def __init__(self, rows: int, chunk: Optional[int], offset: int = 0):
        self.rows, self.reserved, self.chunk, self.offset = rows, 0, chunk, offset
        self.preempted: list = []

    def charge(self, item: tuple, P: int) -> None:
        req, prefix, end = item
        self.reserved += (common.ceil_div(end, P) - common.ceil_div(prefix, P)) * P
        if req.req_pool_idx is None:
            self.rows -= 1
        if self.chunk is not None:
            self.chunk -= common.ceil_align(end - prefix, P)
        self.offset += common.ceil_align(end - prefix, P) + P + \
            (min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS) if end == len(req.fill_ids) else 0)


class PrefillAdderMixin:
    """The Scheduler's PrefillAdder: which requests a prefill round admits (a mixin of
    impl/scheduler.py `Scheduler`, whose pools, tree and running batch it reads)."""

    def _extend_fits(self, start: int, end: int, reserved: int = 0) -> bool:
        """The extend's pages, beyond `reserved` tokens the round has admitted already,
        fit in the free and evictable KV (and SWA) tokens."""
        P = self.page_size
        need = (common.ceil_div(end, P) - common.ceil_div(start, P)) * P + reserved
        if self.swa_window and need > self.token_to_kv_pool_allocator.swa_available_size() \
                + self.radix_cache.swa_evictable_size():
            return False
        return need <= self.token_to_kv_pool_allocator.available_size() + self.tree_cache.evictable_size()

    def _admit_round(self, reqs: list, limit: Optional[int]) -> list:
        """PrefillAdder: rows, KV beyond `available + evictable` (the admitted requests'
        page-ceiled extends) and the chunk budget are shared by the round; a refused
        request ends it, a request cut into a chunk too."""
        if self.filter_before_prefill:
            self._filter_batch()
        offset = sum(map(remaining_output, self.running_batch)) \
            if self.enable_priority_scheduling else 0
        budget = _RoundBudget(self.req_to_token_pool.available_size(), self.chunk_size, offset)
        batch = []
        for i, req in enumerate(reqs):
            if budget.chunk is not None and budget.chunk <= 0:
                break
            refused = limit is not None and i >= limit
            if req.phase == "prefill":
                item = self._add_chunked_req(req, budget, refused)
            else:
                if self.enable_priority_scheduling and budget.rows <= 0 and \
                        not self._preempt_to_schedule(req, budget):
                    break
                item = self._add_one_req(req, budget, refused)
                if item is None:
                    break
            if item is not None:
                batch.append(item)
                budget.charge(item, self.page_size)
                if "round_kv_budget_not_shared" in faults.ACTIVE:
                    budget.reserved = 0
                if "round_rows_not_shared" in faults.ACTIVE:
                    budget.rows = self.req_to_token_pool.available_size()
                if "round_chunk_budget_not_shared" in faults.ACTIVE:
                    budget.chunk = self.chunk_size
                if item[2] < len(req.fill_ids) and req.phase != "prefill":
                    break           # the new chunked request spends the chunk budget
        for victim in budget.preempted:
            self._requeue(victim)
        return batch

    def _preempt_to_schedule(self, req: Req, budget: "_RoundBudget") -> bool:
        """PrefillAdder.preempt_to_schedule: the running requests of lower priority
        (lowest first, the latest queued first among equals; finished ones skipped:
        their KV is already released) until their remaining output covers what req
        needs beyond the budget's remaining tokens; each released as a retraction."""
        alloc = self.token_to_kv_pool_allocator
        rem_total = alloc.available_size() + self.tree_cache.evictable_size() - budget.offset
        short = req.fill_len - req.prefix_len + min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS) \
            - rem_total
        skip_finished = "preempt_takes_finished" not in faults.ACTIVE
        valid = [r for r in self.running_batch if not (skip_finished and r.finished())]
        tie = 1 if "preempt_oldest_first" in faults.ACTIVE else -1
        valid.sort(key=lambda r: (r.priority, tie * r.wait_queue_entry_time))
        victims = []
        for r in valid:
            if req.priority - r.priority <= self.preemption_threshold:
                break
            victims.append(r)
            short -= remaining_output(r)
            if short <= 0 and "preempt_takes_all" not in faults.ACTIVE:
                break
        if not victims or short > 0:
            return False
        rows = self.req_to_token_pool.available_size()
        for r in [r for r in self.running_batch if any(r is v for v in victims)]:
            budget.offset -= remaining_output(r)
            self._retract_req(r)
        if "preempt_rows_not_counted" not in faults.ACTIVE:
            budget.rows += self.req_to_token_pool.available_size() - rows
        budget.preempted += victims
        return True

    def _init_next_round_input(self, req: Req) -> tuple:
        """`init_next_round_input`: the match of the fill up to `max_prefix_len`; returns
        (prefix_len, input_len, last_node)."""
        fill = req.fill_ids
        input_len = len(fill)
        key = fill[: req.max_prefix_len()]
        prefix_indices, last_node, protected = self.tree_cache.match_prefix(req, key)
        req.prefix_indices = prefix_indices
        req.last_node = last_node
        req.cache_protected_len = protected
        prefix_len = req.prefix_len = len(prefix_indices)
        req.fill_len = input_len
        return prefix_len, input_len, last_node

    def _add_one_req(self, req: Req, budget: "_RoundBudget", refused: bool):
        prefix_len, input_len, last_node = self._init_next_round_input(req)
        end = chunk_end(prefix_len, input_len, budget.chunk, self.page_size)
        if refused or end <= prefix_len < input_len:
            self._rejected(req)
            return None
        if req.req_pool_idx is None and budget.rows < 1:
            self._rejected(req)
            return None
        if self.radix_cache.mamba is None and self._mamba_short(req):
            return None
        self.tree_cache.inc_lock_ref(last_node)
        was_held, req.lock_held = req.lock_held, True   # the budget is read under the lock
        if self.swa_window:
            req.swa_uuid_for_lock = swa_lock_boundary(self.radix_cache, last_node)
        if not self._extend_fits(prefix_len, end, budget.reserved) or self._mamba_tree_short(req):
            if not (budget.reserved and "round_refused_keeps_lock" in faults.ACTIVE):
                self.tree_cache.dec_lock_ref(last_node)
            req.lock_held = was_held
            self._rejected(req)
            return None
        if self.era == "borrow" and last_node is getattr(self.tree_cache.slots.get(
                getattr(req.session, "session_id", None)), "virtual_node", False):
            req.lock_held = False          # locking a virtual node holds nothing
        return req, prefix_len, end

    def _add_chunked_req(self, req: Req, budget: "_RoundBudget", refused: bool):
        """The chunked request: its last chunk checkpointed, its next one sized by what
        the round has left; None when the KV budget does not take it."""
        start = self._checkpoint_chunk(req)
        end = chunk_end(start, len(req.fill_ids), budget.chunk, self.page_size)
        if "round_chunk_left_behind" in faults.ACTIVE:
            refused = True
        if refused or end <= start or not self._extend_fits(start, end, budget.reserved):
            return None
        return req, start, end

    # -- upstream's own budget (admission "reserve", "reserve-held-rows") -------------------
    def _admit_reserve_round(self, reqs: list, limit: Optional[int]) -> list:
        """The PrefillAdder loop under upstream's own budget (impl/prefill_budget.py): the
        chunked request first, always continued; then each waiting request, once the batch
        is not full (priority scheduling may preempt for it), matched and admitted while
        `add_one_req` answers CONTINUE. 0.5.23 ("reserve-held-rows") also ends the round
        before the next match when `budget_state()` is OTHER (the chunk budget spent)."""
        if self.filter_before_prefill:
            self._filter_batch()
        budget = PrefillBudget(self.token_to_kv_pool_allocator, self.tree_cache, self.page_size,
                               self.req_to_token_pool.available_size(), self.chunk_size,
                               sum(map(remaining_output, self.running_batch)),
                               held_rows=self.admission == "reserve-held-rows")
        batch = []
        for i, req in enumerate(reqs):
            if budget.held_rows and budget.budget_state() is AddReqResult.OTHER:
                break
            refused = limit is not None and i >= limit
            if req.phase == "prefill":     # add_chunked_req: its verdict ends nothing
                item = self._add_chunked_reserve_req(req, budget, refused)
                res = AddReqResult.CONTINUE
            else:
                if budget.batch_is_full() and not (self.enable_priority_scheduling and
                                                   self._preempt_to_schedule(req, budget)):
                    break
                item, res = self._add_one_reserve_req(req, budget, refused)
            if item is not None:
                batch.append(item)
            if res is not AddReqResult.CONTINUE:
                break
        for victim in budget.preempted:
            self._requeue(victim)
        return batch

    def _add_one_reserve_req(self, req: Req, budget: PrefillBudget, refused: bool) -> tuple:
        """`init_next_round_input` and `add_one_req`: the whole remaining input, the
        remaining output (clipped) and a page must stay below `rem_total_tokens` as read
        under the admission lock; a chunk ends at a page boundary of the sequence (OTHER
        when that leaves nothing). Returns (the batch item or None, the verdict)."""
        prefix_len, input_len, last_node = self._init_next_round_input(req)
        if refused:
            self._rejected(req)
            return None, AddReqResult.OTHER
        # FIX(U9): the rows are checked again after a preemption (a preempted streaming
        # turn's row stays with its session's slot)
        if req.req_pool_idx is None and budget.rows < 1:
            self._rejected(req)
            return None, AddReqResult.OTHER
        end = truncated_extend_end(prefix_len, input_len, budget.rem_chunk_tokens, self.page_size)
        max_new = min(max(req.max_new_tokens - len(req.output_ids), 0), CLIP_MAX_NEW_TOKENS)
        total_tokens = input_len - prefix_len + max_new + self.page_size
        self.tree_cache.inc_lock_ref(last_node)
        was_held, req.lock_held = req.lock_held, True   # the budget is read under the lock
        res = AddReqResult.NO_TOKEN if total_tokens >= budget.rem_total_tokens else \
            AddReqResult.OTHER if end is None else AddReqResult.CONTINUE
        if res is not AddReqResult.CONTINUE:
            self.tree_cache.dec_lock_ref(last_node)
            req.lock_held = was_held
            self._rejected(req)
            return None, res
        if self.era == "borrow" and last_node is getattr(self.tree_cache.slots.get(
                getattr(req.session, "session_id", None)), "virtual_node", False):
            req.lock_held = False          # locking a virtual node holds nothing
        budget._update_prefill_budget(req, prefix_len, end, _decode_headroom(req, end, input_len))
        return (req, prefix_len, end), budget.budget_state()

    def _add_chunked_reserve_req(self, req: Req, budget: PrefillBudget, refused: bool):
        """The chunked request: its last chunk checkpointed, then always continued
        ("otherwise, it will cause a memory leak"), cut to what the round has left,
        `min(rem_chunk_tokens, rem_total_tokens)`, or to the chunk budget when nothing is
        left; not page-aligned. None only when kvcheck's round limit refuses it."""
        start = self._checkpoint_chunk(req)
        if refused:
            return None
        rem_tokens = min(budget.rem_chunk_tokens, budget.rem_total_tokens)
        if rem_tokens <= 0:
            rem_tokens = budget.rem_chunk_tokens
        input_len = len(req.fill_ids)
        end = start + min(input_len - start, rem_tokens)
        budget._update_prefill_budget(req, start, end, _decode_headroom(req, end, input_len))
        return req, start, end

    def _rejected(self, req: Req) -> str:
        """A request the round does not add: with a Mamba tree, `get_new_batch_prefill`
        frees the copy-on-write slot of a request without a session."""
        if self.radix_cache.mamba is not None and req.session is None and \
                req.mamba_pool_idx is not None:
            self.req_to_token_pool.free_mamba_cache(req)
        return "rejected"

    def _mamba_tree_short(self, req: Req) -> bool:
        """kvcheck's admission glue with a Mamba tree (kvcheck.spec.mamba_tree.admission_short):
        the slots `alloc` takes plus the checkpoint copy, from free and evictable states."""
        mamba = self.radix_cache.mamba
        if mamba is None:
            return False
        pool = self.req_to_token_pool
        return pool.mamba_slots_needed(req) + 1 > \
            pool.mamba_allocator.available_size() + mamba.evictable_size()

    def _mamba_short(self, req: Req) -> bool:
        """Admission needs the Mamba slots the row allocation will take."""
        pool = self.req_to_token_pool
        return isinstance(pool, HybridReqToTokenPool) and \
            pool.mamba_slots_needed(req) > pool.mamba_allocator.available_size()
