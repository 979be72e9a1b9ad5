"""Scheduler: the facade with one method per kvcheck operation.

Each method returns an outcome string: "ok", "rejected", "oom", "deferred", "stub" or
"refused" (a client request upstream turns down, nothing changed).
It takes plain constructor arguments (impl/ does not import spec/).
"""
from __future__ import annotations

import functools

from typing import Optional

import torch

from kvcheck.impl import common, faults
from kvcheck.impl.allocator import make_allocator
from kvcheck.impl.device import resolve_device
from kvcheck.impl.memory_pool import KVBuffer, ReqToTokenPool
from kvcheck.impl.radix_cache import RadixCache
from kvcheck.impl.schedule_batch import FINISH_ABORT, FINISH_LENGTH, Req
from kvcheck.impl.session_controller import SessionController
from kvcheck.impl.mamba import HybridReqToTokenPool
from kvcheck.impl.mamba_tree import MambaComponent
from kvcheck.impl.streaming_session import StreamingSession
from kvcheck.impl.swa import (SWATokenToKVPoolAllocator, free_swa_out_of_window_slots,
                      set_swa_evict_floor, swa_eviction_due)
from kvcheck.impl.swa_radix_cache import SWARadixCache, swa_lock_boundary

ERAS = ("wrapper", "borrow")


def chunk_end(prefix: int, input_len: int, chunk_size: Optional[int], p: int) -> int:
    if chunk_size is None:
        return input_len
    return min(input_len, prefix + (chunk_size // p) * p)


CLIP_MAX_NEW_TOKENS = 4096     # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION


def remaining_output(req: Req) -> int:
    """_get_running_request_total_token_offset (new_token_ratio 1)."""
    return min(req.max_new_tokens - len(req.output_ids), CLIP_MAX_NEW_TOKENS)


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


def _after_op(op):
    """After each operation, as the scheduler loop does after a round: `maybe_reap`
    carries out the deferred closes whose turn has ended (never inside a round: a
    request of the round finishing does not free its session's KV under the next one);
    in the borrow era the slots a turn borrows carry its lengths (upstream shares one
    ReqKvInfo between the turn and its slot)."""
    @functools.wraps(op)
    def run(self, *args, **kwargs):
        out = op(self, *args, **kwargs)
        self.session_controller.maybe_reap()
        if self.era == "borrow":
            self.tree_cache.sync_borrowed(self.reqs.values())
        return out
    return run


class Scheduler:
    def __init__(self, page_size: int = 1, num_pages: int = 16, num_rows: int = 4,
                 max_context_len: int = 64, chunk_size: Optional[int] = None,
                 spec_enabled: bool = False, overlap: bool = False, era: str = "wrapper",
                 device=None, need_sort: bool = True, debug_mode: Optional[bool] = None,
                 swa_window: int = 0, swa_num_pages: Optional[int] = None,
                 swa_eviction_interval: int = 1, mamba_slots: int = 0,
                 mamba_extra_buffer: str = "off", disable_radix_cache: bool = False,
                 prefill_aware_swa: bool = False, mamba_tree: bool = False,
                 accept: tuple = (), evict_shortfall: bool = False,
                 enable_priority_scheduling: bool = False, preemption_threshold: int = 10,
                 filter_before_prefill: bool = False):
        if era not in ERAS:
            raise ValueError(f"era must be one of {ERAS}, got {era!r}")
        self.page_size = page_size
        self.num_pages = num_pages
        self.num_rows = num_rows
        self.max_context_len = max_context_len
        self.chunk_size = chunk_size
        self.spec_enabled = spec_enabled
        self.overlap = overlap
        self.era = era
        self.accept = accept            # recorded findings impl follows: M2 only
        self.device = resolve_device(device)
        self.max_total_num_tokens = num_pages * page_size
        self.swa_window = swa_window
        self.swa_eviction_interval = swa_eviction_interval
        self.prefill_aware_swa = prefill_aware_swa
        self.forward_iter = 0
        if mamba_slots:
            self.req_to_token_pool = HybridReqToTokenPool(
                num_rows, max_context_len, mamba_slots, self.device,
                enable_mamba_extra_buffer=mamba_extra_buffer != "off",
                enable_mamba_extra_buffer_lazy=mamba_extra_buffer == "lazy",
                enable_overlap_schedule=overlap)
        else:
            self.req_to_token_pool = ReqToTokenPool(num_rows, max_context_len, self.device)
        if swa_window:
            self.token_to_kv_pool_allocator = SWATokenToKVPoolAllocator(
                num_pages, swa_num_pages or num_pages, page_size, self.device,
                need_sort=need_sort, debug_mode=debug_mode)
            self.radix_cache = SWARadixCache(self.req_to_token_pool, self.token_to_kv_pool_allocator,
                                             page_size, self.device, swa_window)
        else:
            self.token_to_kv_pool_allocator = make_allocator(num_pages, page_size, self.device,
                                                             need_sort=need_sort, debug_mode=debug_mode)
            self.radix_cache = RadixCache(self.req_to_token_pool, self.token_to_kv_pool_allocator,
                                          page_size, self.device)
        self.radix_cache.disable = disable_radix_cache
        if mamba_tree:                  # the Mamba tree (impl/mamba_tree.py): 0.5.23's MAMBA
            self.radix_cache.mamba = MambaComponent(self.radix_cache,   # component, 0.5.15's
                                                    wrapper=era == "wrapper")  # MambaRadixCache
        self.kv_buffer = KVBuffer(num_pages, page_size, self.device)
        self.tree_cache = StreamingSession(self.radix_cache, era=era,
                                           evict_shortfall=evict_shortfall)
        # checkpoint_into_tree splits at the prompt for a FULL-only tree only
        # (kvcheck.spec.hybrid.prompt_split_on): no SWA or Mamba component
        self.radix_cache.full_only = not swa_window and not mamba_slots
        if swa_window:      # who holds tree locks, for the SWA lock walk (impl/swa_radix_cache.py)
            self.radix_cache.lock_holders = self._lock_holders
        self.session_controller = SessionController(self.tree_cache)
        self.reqs: dict[int, Req] = {}        # live requests: queued, prefill, decode
        self.enable_priority_scheduling = enable_priority_scheduling
        self.preemption_threshold = preemption_threshold
        self.filter_before_prefill = filter_before_prefill
        # the running batch, in merge order; a request that finishes stays in it (its KV
        # already released) until the next decode step filters it (the two-phase finish)
        self.running_batch: list[Req] = []
        self.clock = 0                          # wait_queue_entry_time's clock

    # -- helpers ------------------------------------------------------------------------
    def _lock_holders(self) -> list:
        """The requests and session slots that may hold tree locks (a bound method, not a
        closure: a deep copy of the scheduler then asks its own requests)."""
        return [*self.reqs.values(), *self.tree_cache.slots.values()]

    def _req(self, rid: int, *phases: str) -> Req:
        req = self.reqs.get(rid)
        if req is None:
            raise KeyError(f"no live request {rid}")
        if phases and req.phase not in phases:
            raise ValueError(f"req {rid} is {req.phase}, expected {'/'.join(phases)}")
        return req

    def _abort_target(self, rid: int, *phases: str) -> Optional[Req]:
        """`abort_request`'s lookup: None when no live request has this rid (it finished,
        or never came); upstream then finds nothing and changes nothing."""
        try:
            return self._req(rid, *phases)
        except KeyError:
            return None

    def _extend_fits(self, start: int, end: int, reserved: int = 0) -> bool:
        """The extend's pages, beyond `reserved` tokens the round has admitted already,
        fit in the free and evictable KV (and SWA) tokens."""
        P = self.page_size
        need = (common.ceil_div(end, P) - common.ceil_div(start, P)) * P + reserved
        if self.swa_window and need > self.token_to_kv_pool_allocator.swa_available_size() \
                + self.radix_cache.swa_evictable_size():
            return False
        return need <= self.token_to_kv_pool_allocator.available_size() + self.tree_cache.evictable_size()

    def _retire(self, req: Req) -> None:
        self.reqs.pop(req.rid, None)
        req.phase = "finished"

    def _write_kv(self, req: Req, start: int, end: int) -> None:
        if end <= start:
            return
        loc = self.req_to_token_pool.req_to_token[req.req_pool_idx, start:end]
        self.kv_buffer.set_kv_buffer(loc, req.fill_ids[start:end])

    def _overlap_lookahead(self, req: Req) -> None:
        """Overlap scheduler (and a speculative verify in flight): the step after the
        last one is already prepared, so the last token's KV exists at finish/retract
        (committed == seqlen). Skipped when memory is short."""
        if not (self.overlap or self.spec_enabled) or req.kv_committed_len >= req.seqlen:
            return
        pos = req.kv_committed_len
        if pos >= req.kv_allocated_len:
            if common.alloc_for_decode(self, req) is None:
                return
            req.kv_allocated_len = pos + 1
            if self.swa_window:         # a prepared decode batch: `maybe_evict_swa` too
                self._decode_batch_done(req)
        self._write_kv(req, pos, pos + 1)
        req.kv_committed_len = pos + 1

    # -- operations ---------------------------------------------------------------------
    @_after_op
    def open_session(self, sid: int) -> str:
        # OpenSessionReqOutput(success=False) for an id already open
        return "ok" if self.session_controller.open(sid) else "refused"

    @_after_op
    def submit_turn(self, sid: int, rid: int, new_tokens, max_new_tokens: int,
                    priority: int = 0) -> str:
        session = self.session_controller.sessions.get(sid)
        if session is None:             # "session id ... does not exist": a plain aborted Req
            req = Req(rid, [0], max_new_tokens, session=None, streaming=False, rejected=True)
            req.to_finish = FINISH_ABORT
        else:
            req = session.create_req(rid, new_tokens, max_new_tokens)
            if not req.rejected and session.req_nodes:
                req.fill_len = len(req.origin_input_ids)    # carried onto the last turn's fill
        self._enqueue(req, priority)
        return "stub" if req.rejected else "ok"

    @_after_op
    def submit_request(self, rid: int, tokens, max_new_tokens: int,
                       logprob_start_len=None, priority: int = 0) -> str:
        """handle_generate_request: logprobs requested with the default start (-1) return
        the output tokens' only (start = the prompt length); none requested: -1."""
        req = Req(rid, list(tokens), max_new_tokens)
        if logprob_start_len is not None:
            req.logprob_start_len = len(tokens) if logprob_start_len == -1 else logprob_start_len
        self._enqueue(req, priority)
        return "ok"

    def _enqueue(self, req: Req, priority: int) -> None:
        """_add_request_to_queue: the request's priority, its entry time."""
        req.priority = priority
        self.reqs[req.rid] = req
        self._requeue(req)

    def _requeue(self, req: Req) -> None:
        self.clock += 1
        req.wait_queue_entry_time = self.clock

    @_after_op
    def schedule(self, rid: int, admit: bool = True) -> str:
        """The prefill round of one request."""
        self._req(rid, "queued")
        return self._schedule_round([rid], None if admit else 0)

    @_after_op
    def schedule_round(self, rids, limit: Optional[int] = None) -> str:
        """`_get_new_batch_prefill_raw`: the PrefillAdder loop admits a batch (the chunked
        request first), one `prepare_for_extend` allocates it, then its result is
        processed request by request. "ok" when every request named was admitted."""
        return self._schedule_round(list(rids), limit)

    def _schedule_round(self, rids: list, limit: Optional[int]) -> str:
        reqs = [self._req(rid, "queued", "prefill") for rid in rids]
        batch = self._admit_round(reqs, limit)
        if batch:
            self._prepare_for_extend(batch)
            self._process_prefill_result(batch)
        return "ok" if len(batch) == len(reqs) else "rejected"

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

    def _add_one_req(self, req: Req, budget: "_RoundBudget", refused: bool):
        fill = req.fill_ids
        input_len = len(fill)
        key = fill[: req.max_prefix_len()]
        prefix_indices, last_node, protected = self.tree_cache.match_prefix(req, key)
        req.prefix_indices = prefix_indices
        req.last_node = last_node
        req.cache_protected_len = protected
        prefix_len = req.prefix_len = len(prefix_indices)
        req.fill_len = input_len
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

    def _checkpoint_chunk(self, req: Req) -> int:
        """cache_unfinished_req(chunked=True) of the last chunk; returns where the next
        one starts."""
        start = req.kv_committed_len
        self.tree_cache.cache_unfinished_req(req, chunked=True)
        req.fill_len = len(req.fill_ids)
        req.prefix_indices = req.prefix_indices[:start] if req.prefix_indices is not None else None
        return start

    def _prepare_for_extend(self, batch: list) -> None:
        """alloc_for_extend of the batch: one eviction for its extend tokens (+ a page a
        request when P > 1), then each request's row (alloc_req_slots; rows are not
        evicted, so taking them after the eviction changes nothing) and KV in batch order;
        then the session hook (borrow era `maybe_hand_to_session`)."""
        pool = self.req_to_token_pool
        for req, _, _ in batch:
            req.is_retracted = False
            if self.radix_cache.mamba is not None:
                self.radix_cache.mamba.ensure_mamba_capacity(pool.mamba_slots_needed(req))
        P = self.page_size
        per_request = "round_evicts_per_request" in faults.ACTIVE
        if not per_request:
            common.evict_from_tree_cache(self.tree_cache, self.token_to_kv_pool_allocator,
                                         sum(end - prefix for _, prefix, end in batch)
                                         + (len(batch) * P if P > 1 else 0))
        for req, prefix, end in batch:
            if not common.alloc_for_extend(self, req, prefix, end, evict=per_request):
                raise RuntimeError(f"req {req.rid}: alloc_for_extend failed after admission")
        for i, (req, _, _) in enumerate(batch):
            set_swa_evict_floor(self, req)
            if self.era == "borrow" and not (i and "round_hook_skips_second" in faults.ACTIVE):
                self.tree_cache.take(req)

    def _process_prefill_result(self, batch: list) -> None:
        for req, _, end in batch:
            req.phase = "prefill"
            if end < len(req.fill_ids):
                req.inflight_middle_chunks = 1
            else:
                self._prefill_done(req)

    def _prefill_done(self, req: Req) -> None:
        req.inflight_middle_chunks = 0
        if req.to_finish is not None:
            req.finished_reason = req.to_finish
            common.release_kv_cache(self, req)
            self._retire(req)
            return
        req.output_ids.append(1)
        if len(req.output_ids) >= req.max_new_tokens:
            # check_finished in the prefill result: released before any cache_unfinished_req
            self._check_finished(req)
            return
        with common.free_group(self.token_to_kv_pool_allocator):
            self.tree_cache.cache_unfinished_req(req)
        req.phase = "decode"
        self.running_batch.append(req)

    @_after_op
    def prefill_chunk(self, rid: int) -> str:
        req = self._req(rid, "prefill")
        input_len = len(req.fill_ids)
        start = self._checkpoint_chunk(req)
        end = chunk_end(start, input_len, self.chunk_size, self.page_size)
        mamba = self.radix_cache.mamba
        evict = None if mamba is None or not mamba.wrapper else \
            lambda: mamba.ensure_mamba_capacity(0)   # 0.5.15 alloc_req_slots, every chunk
        if not common.alloc_for_extend(self, req, start, end, before_alloc=evict):
            return "oom"
        set_swa_evict_floor(self, req)
        if end >= input_len:
            self._prefill_done(req)
        return "ok"

    @_after_op
    def decode(self, rid: int, token: int = 1) -> str:
        req = self._req(rid, "decode")
        if not common.check_decode_mem(self, req):
            return "oom"
        pos = req.kv_committed_len
        if common.decode_needs_alloc(self, req):
            if common.alloc_for_decode(self, req) is None:
                return "oom"
        self._filter_batch()
        self._decode_batch_done(req)
        self._write_kv(req, pos, pos + 1)
        req.kv_committed_len += 1
        req.kv_allocated_len = max(req.kv_allocated_len, req.kv_committed_len)
        req.output_ids.append(token)
        self._check_finished(req)
        return "ok"

    @_after_op
    def decode_round(self, rids) -> str:
        """update_running_batch and the decode step over the batch (`rids`, batch order):
        check_decode_mem, retract_decode on a shortfall, prepare_for_decode (one eviction,
        then each request's slot), the forward, and the result in batch order. "oom" when
        a request was retracted or aborted."""
        reqs = [self._req(rid, "decode") for rid in rids]
        self._filter_batch()
        out = "ok"
        if not self._check_decode_mem(reqs):
            reqs = self._retract_decode(reqs)
            out = "oom"
        alloc = self.token_to_kv_pool_allocator
        common.evict_from_tree_cache(self.tree_cache, alloc, len(reqs) * self.page_size)
        for req in reqs:
            if common.alloc_for_decode(self, req, evict=False) is None:
                raise RuntimeError(f"req {req.rid}: alloc_for_decode failed after check_decode_mem")
        for req in reqs:
            pos = req.kv_committed_len
            self._write_kv(req, pos, pos + 1)
            req.kv_committed_len += 1
            req.kv_allocated_len = max(req.kv_allocated_len, req.kv_committed_len)
            req.output_ids.append(1)
        for req in reqs:
            if "decode_round_skips_finish" not in faults.ACTIVE:
                self._check_finished(req)
        return out

    def _check_decode_mem(self, reqs: list) -> bool:
        """check_decode_mem: a page for each request whose next token starts one, after
        eviction."""
        P = self.page_size
        need = P * sum(1 for r in reqs if r.kv_committed_len % P == 0)
        common.evict_from_tree_cache(self.tree_cache, self.token_to_kv_pool_allocator, need)
        return self.token_to_kv_pool_allocator.available_size() >= need

    def _retract_decode(self, reqs: list) -> list:
        """retract_decode: victims from the end of the keep order (most output, then the
        shortest prompt, first), at least one, until the rest fits; the last one is
        aborted when even it does not fit (released as a retraction, never re-queued)."""
        kept = sorted(reqs, key=lambda r: (len(r.output_ids), -len(r.origin_input_ids)),
                      reverse=True)
        first = True
        while first or not self._check_decode_mem(kept) or \
                "retract_decode_keeps_retracting" in faults.ACTIVE:
            if len(kept) == 1:
                break
            first = False
            victim = kept.pop(0 if "retract_victim_most_output" in faults.ACTIVE else -1)
            self._retract_req(victim)
            self._requeue(victim)
        if len(kept) <= 1 and not self._check_decode_mem(kept):
            last = kept.pop()
            self._retract_req(last)
            self._abort_queued(last)
        return [r for r in reqs if any(r is k for k in kept)]

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

    def _decode_batch_done(self, req: Req) -> None:
        """`maybe_evict_swa` (from the second decode batch, on maintenance steps), then
        `decode_batch_idx += 1`."""
        if not self.swa_window:
            return
        self.forward_iter += 1
        if req.decode_batch_idx >= 1 and self._swa_evict_due(req):
            pre_len = req.seqlen - 1
            if "swa_evict_frees_past_cursor" in faults.ACTIVE:
                pre_len += self.page_size
            old = req.swa_evicted_seqlen
            free_swa_out_of_window_slots(
                req, pre_len, sliding_window_size=self.swa_window, page_size=self.page_size,
                req_to_token_pool=self.req_to_token_pool,
                token_to_kv_pool_allocator=self.token_to_kv_pool_allocator, era=self.era)
            if "swa_evict_frees_past_cursor" in faults.ACTIVE and req.swa_evicted_seqlen > old:
                req.swa_evicted_seqlen -= self.page_size
        req.decode_batch_idx += 1

    def _swa_evict_due(self, req: Req) -> bool:
        """0.5.15: a maintenance step (`forward_iter % interval`); 0.5.23
        (`_swa_eviction_trigger`): `interval` tokens slid out of the window past the cursor."""
        if self.era == "borrow" and "swa_evict_step_count" not in faults.ACTIVE:
            return swa_eviction_due(req, self.swa_window, self.swa_eviction_interval)
        return (self.forward_iter - 1) % self.swa_eviction_interval == 0

    def _check_finished(self, req: Req) -> None:
        """check_finished in the result processing: max_new_tokens reached -> finish now."""
        if len(req.output_ids) >= req.max_new_tokens:
            self._finish_req(req)

    @_after_op
    def spec_decode(self, rid: int, drafts: int, accepted: int, token: int = 1) -> str:
        req = self._req(rid, "decode")
        need = req.kv_committed_len + 2 * (drafts + 1)
        if need > req.kv_allocated_len:
            start = req.kv_allocated_len
            out = common.alloc_token_range(self, req.req_pool_idx, start, need)
            if out is None:
                return "oom"
            self.req_to_token_pool.write(req.req_pool_idx, start, out)
            req.kv_allocated_len = need
        self._filter_batch()
        self._decode_batch_done(req)
        c = req.kv_committed_len
        req.output_ids.extend([token] * (accepted + 1))
        self._write_kv(req, c, c + accepted + 1)
        req.kv_committed_len = c + accepted + 1
        self._check_finished(req)
        return "ok"

    @_after_op
    def finish(self, rid: int) -> str:
        self._finish_req(self._req(rid, "decode"))
        return "ok"

    def _finish_req(self, req: Req) -> None:
        self._overlap_lookahead(req)
        req.finished_reason = FINISH_LENGTH
        req.finished_len = min(len(req.output_ids), req.max_new_tokens)
        common.release_kv_cache(self, req)
        self._retire(req)

    @_after_op
    def abort_queued(self, rid: int) -> str:
        req = self._abort_target(rid, "queued")
        if req is None:
            return "refused"
        self._abort_queued(req)
        return "ok"

    def _abort_queued(self, req: Req) -> None:
        session = req.session
        if session is not None and session.streaming:
            self.tree_cache.drop_parked_turn(req)      # FIX(H4) follow-up
            if "queued_abort_keeps_inflight" not in faults.ACTIVE:
                session.abort_req(req)
            if "M2" in self.accept and \
                    req.req_pool_idx is not None and req.mamba_pool_idx is not None:
                # accepted finding M2: release_kv_cache(checkpoint=False) -> claim_kv_row
                self.tree_cache.try_cache_finished_req(req)
                self._retire(req)
                return
        if self.radix_cache.mamba is not None and req.req_pool_idx is None and \
                req.mamba_pool_idx is not None:     # release_kv_cache(checkpoint=False)
            self.req_to_token_pool.free_mamba_cache(req)
        self._retire(req)

    def queue_reject(self, rid: int) -> str:
        """_add_request_to_queue refuses it (priority / queue limit): a queued abort."""
        return self.abort_queued(rid)

    @_after_op
    def pre_abort(self, rid: int) -> str:
        req = self._abort_target(rid, "queued")
        if req is None:
            return "refused"
        req.to_finish = FINISH_ABORT
        if not req.is_retracted:            # set_finish_with_abort: a one-token prompt
            req.origin_input_ids = [0]
        return "ok"

    @_after_op
    def abort_running(self, rid: int) -> str:
        req = self._abort_target(rid, "prefill", "decode")
        if req is None:
            return "refused"
        req.finished_reason = FINISH_ABORT
        common.release_kv_cache(self, req)
        self._retire(req)
        return "ok"

    @_after_op
    def retract(self, rid: int) -> str:
        req = self._req(rid, "decode")
        self._retract_req(req)
        self._requeue(req)
        return "ok"

    def _retract_req(self, req: Req) -> None:
        """release_req (release_kv_cache(is_insert=False), reset_for_retract): back to
        the waiting queue, out of the running batch."""
        self._overlap_lookahead(req)
        common.release_req(self, req)
        req.prefix_len = 0
        self.running_batch = [r for r in self.running_batch if r is not req]

    def _filter_batch(self) -> None:
        """update_running_batch's filter_batch: the finished requests leave the batch."""
        self.running_batch = [r for r in self.running_batch if not r.finished()]

    @_after_op
    def close_session(self, sid: int) -> str:
        return self.session_controller.close(sid)

    @_after_op
    def evict(self, num_tokens: int) -> str:
        self.tree_cache.evict(num_tokens)
        return "ok"

    # -- accounting (DOMAIN.md 2.14) --------------------------------------------------------
    def running_reqs(self) -> list:
        return [r for r in self.reqs.values() if r.phase in ("prefill", "decode")]

    def active_pool_idxs(self) -> set:
        return {r.req_pool_idx for r in self.running_reqs() if r.req_pool_idx is not None}
