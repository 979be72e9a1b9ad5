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
from kvcheck.impl import common, faults
from kvcheck.impl.allocator import make_allocator
from kvcheck.impl.device import resolve_device
from kvcheck.impl.memory_pool import KVBuffer, ReqToTokenPool
from kvcheck.impl.radix_cache import RadixCache
from kvcheck.impl.running_batch import RunningBatchMixin
from kvcheck.impl.schedule_batch import FINISH_ABORT, Req
from kvcheck.impl.schedule_policy import PrefillAdderMixin, chunk_end
from kvcheck.impl.session_controller import SessionController
from kvcheck.impl.mamba import HybridReqToTokenPool
from kvcheck.impl.mamba_tree import MambaComponent
from kvcheck.impl.streaming_session import StreamingSession
from kvcheck.impl.swa import SWATokenToKVPoolAllocator, set_swa_evict_floor
from kvcheck.impl.swa_radix_cache import SWARadixCache

ERAS = ("wrapper", "borrow")
ADMISSIONS = ("pages", "reserve", "reserve-held-rows")
"""The prefill round's admission rule: kvcheck's page budget (impl/schedule_policy.py
`_admit_round`), or upstream's own PrefillAdder budget (impl/prefill_budget.py) as
0.5.14-0.5.22 ("reserve") and 0.5.23 ("reserve-held-rows") count the rows."""


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


class Scheduler(PrefillAdderMixin, RunningBatchMixin):
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
                 filter_before_prefill: bool = False, admission: str = "pages"):
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
        # (kvcheck.spec.swa_tree.prompt_split_on): no SWA or Mamba component
        self.radix_cache.full_only = not swa_window and not mamba_slots
        if swa_window:      # who holds tree locks, for the SWA lock walk (impl/swa_radix_cache.py)
            self.radix_cache.lock_holders = self._lock_holders
        self.session_controller = SessionController(self.tree_cache)
        self.reqs: dict[int, Req] = {}        # live requests: queued, prefill, decode
        self.enable_priority_scheduling = enable_priority_scheduling
        self.preemption_threshold = preemption_threshold
        self.filter_before_prefill = filter_before_prefill
        if admission not in ADMISSIONS:
            raise ValueError(f"admission must be one of {ADMISSIONS}, got {admission!r}")
        if admission != "pages" and (swa_window or mamba_slots or disable_radix_cache):
            raise ValueError(f"admission {admission!r} runs without the hybrid pools and "
                             "with the radix tree on (upstream's add_one_req_ignore_eos path)")
        self.admission = admission
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

    def _retire(self, req: Req) -> None:
        self.reqs.pop(req.rid, None)
        req.phase = "finished"

    def _write_kv(self, req: Req, start: int, end: int) -> None:
        if end <= start:
            return
        loc = self.req_to_token_pool.req_to_token[req.req_pool_idx, start:end]
        self.kv_buffer.set_kv_buffer(loc, req.fill_ids[start:end])

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
        admit = self._admit_round if self.admission == "pages" else self._admit_reserve_round
        batch = admit(reqs, limit)
        if batch:
            self._prepare_for_extend(batch)
            self._process_prefill_result(batch)
        return "ok" if len(batch) == len(reqs) else "rejected"

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
