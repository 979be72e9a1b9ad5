"""SglangBackend's operations: each kvcheck operation carried out through upstream's own
code and the glue named in README.md (entry, prefill chunk, decode, finish, abort, retract,
close, evict; the rounds in prefill_round.py and decode_round.py)."""
from __future__ import annotations

from kvcheck.spec.model import resolve_logprob_start
from kvcheck.spec.pages import chunk_end

from kvcheck.adapters.sglang import hybrid
from kvcheck.adapters.sglang.decode_round import DecodeRound
from kvcheck.adapters.sglang.prefill_round import PrefillRound
from kvcheck.adapters.sglang.release import SAMPLED_TOKEN, VOCAB, _Live


class Drive(PrefillRound, DecodeRound):
    """The operations of SglangBackend (adapters/sglang/backend.py); the rounds' in
    prefill_round.py and decode_round.py."""

    def _op_open_session(self, op):
        if self.entry:          # Scheduler.open_session
            out = self.entry.open_session(self._sid(op.sid))
        else:
            from sglang.srt.managers.io_struct import OpenSessionReqInput
            out = self.ctrl.open(OpenSessionReqInput(
                capacity_of_str_len=1 << 20, session_id=self._sid(op.sid), streaming=True))
        return "ok" if out.success else "refused"   # "already exist, cannot open"

    def _priority(self, op):
        return op.priority if self.cfg.enable_priority_scheduling else None

    def _submit(self, op, t) -> str:
        """Upstream's own Scheduler.handle_generate_request (entry.py): the request it
        queued, a session's turn, a rejected stub or a plain request."""
        req = self.entry.submit(t)
        return self._queued(op, req, streaming=req.session is not None,
                            rejected=req.to_finish is not None)

    def _queued(self, op, req, streaming: bool, rejected: bool) -> str:
        """The request op submitted, now live and waiting: "stub" for a rejected one."""
        self.live[op.rid] = _Live(op.rid, req, streaming=streaming, rejected=rejected)
        self._enqueue(self.live[op.rid], self._priority(op))
        return "stub" if rejected else "ok"

    def _op_submit_turn(self, op):
        """Scheduler.handle_generate_request, session branch."""
        sid = self._sid(op.sid)
        t = self._tokenized(op.rid, op.new_tokens, op.max_new_tokens, op.sid,
                            priority=self._priority(op))
        if self.entry:
            return self._submit(op, t)
        session = self.ctrl.get(sid)
        if session is not None and not session.close_on_finish:
            req = session.create_req(t, tokenizer=None, vocab_size=VOCAB)
            return self._queued(op, req, streaming=True, rejected=req.to_finish is not None)
        # session closing (or unknown): a plain Req aborted at once, no session attached
        from sglang.srt.managers.schedule_batch import Req
        req = Req(str(op.rid), None, t.input_ids, t.sampling_params, vocab_size=VOCAB)
        req.tokenizer = None
        req.set_finish_with_abort(f"Invalid request: close was requested for session {sid}"
                                  if session is not None else
                                  f"Invalid request: session id {sid} does not exist")
        return self._queued(op, req, streaming=False, rejected=True)

    def _op_submit_request(self, op):
        from sglang.srt.managers.schedule_batch import Req
        t = self._tokenized(op.rid, op.tokens, op.max_new_tokens, None,
                            logprob_start_len=op.logprob_start_len, priority=self._priority(op))
        if self.entry:
            return self._submit(op, t)
        req = Req(str(op.rid), None, t.input_ids, t.sampling_params, vocab_size=VOCAB,
                  return_logprob=op.logprob_start_len is not None)
        req.tokenizer = None
        # handle_generate_request's logprob_start_len resolution (glue); upstream's own
        # init_next_round_input then caps the prefix match with it
        req.logprob_start_len = resolve_logprob_start(op.logprob_start_len, len(op.tokens))
        return self._queued(op, req, streaming=False, rejected=False)

    def _enqueue(self, L, priority=None) -> None:
        """Under priority scheduling, `_add_request_to_queue`: the priority
        `_set_or_validate_priority` leaves (the client's, sent explicitly) and the entry
        (`set_wait_queue_entry_time`), on the adapter's own clock: `_RunningBatch` hands
        it to `time_stats` for the calls that read it."""
        if not self.cfg.enable_priority_scheduling:
            return
        if priority is not None:
            L.req.priority = priority
        self.entries += 1
        L.entered = self.entries


    def _op_prefill_chunk(self, op):
        """The chunked request's next round: cache_unfinished_req(chunked=True) (0.5.23:
        stash_chunked_request), then get_new_batch_prefill's init_next_round_input() (no
        re-match; its refresh_fill_ids) and PrefillAdder.add_chunked_req, which sizes the
        chunk by the fill array, `len(req.full_untruncated_fill_ids)`; then the chunk's
        prepare_for_extend. The fill array is upstream's own: under U1/U2 a later turn's
        create_req rewrites a live turn's arrays in place (_share_token_arrays)."""
        L = self.live[op.rid]
        prefix, input_len = self._checkpoint_chunk(L)
        end = chunk_end(prefix, input_len, self.cfg.chunk_size, self.P)
        if not self._can_alloc_extend(prefix, end):
            return "oom"
        self._extend(L, prefix, end)
        if end == input_len:
            self._prefill_result(L)
        return "ok"

    def _checkpoint_chunk(self, L) -> tuple:
        """cache_unfinished_req(chunked=True) (0.5.23: stash_chunked_request), then
        init_next_round_input() (no re-match; its refresh_fill_ids): (prefix, the fill
        array's length, which add_chunked_req sizes the chunk by)."""
        self._cache_unfinished(L, chunked=True)
        L.req.init_next_round_input()
        return self._chunk_prefix(L), len(L.req.full_untruncated_fill_ids)

    def _op_decode(self, op):
        """prepare_for_decode (alloc_for_decode of the last sampled token's slot), the
        forward writes that token's KV, then the result appends the sampled token."""
        L = self.live[op.rid]
        req = L.req
        pos = self._lens(req)[0]
        if not self._can_alloc_decode(pos):
            return "oom"
        self._filter_batch()
        self._prepare_for_decode(L)
        self._write_shadow(req, pos, pos + 1)
        req.output_ids.append(op.token)
        self._check_finished(L)
        return "ok"

    def _check_finished(self, L) -> None:
        """Result processing: a request whose output reaches max_new_tokens finishes in
        the same step (Req.check_finished -> release_kv_cache)."""
        if len(L.req.output_ids) >= L.req.sampling_params.max_new_tokens:
            self._finish(L)

    def _op_spec_decode(self, op):
        """Emulated speculative step (the fidelity boundary: upstream's EAGLE worker is
        not run): over-allocate [allocated, committed + 2*(drafts+1)) like an extend,
        then accept `accepted` drafts plus the bonus token."""
        L = self.live[op.rid]
        req = L.req
        committed, allocated, _ = self._lens(req)
        need = committed + 2 * (op.drafts + 1)
        if need > allocated:
            if not self._can_alloc_extend(allocated, need):
                return "oom"
            self._alloc_range(req, allocated, need)
            self._set_lens(req, allocated=need)
        self._filter_batch()
        self._swa_decode_step(L)
        req.output_ids.extend([op.token] * (op.accepted + 1))
        self._set_lens(req, committed=committed + op.accepted + 1)
        self._write_shadow(req, committed, committed + op.accepted + 1)
        self._check_finished(L)
        return "ok"

    def _op_finish(self, op):
        """process_batch_result_decode for a finished request: the finish reason, then
        release_kv_cache."""
        self._finish(self.live[op.rid])
        return "ok"

    def _finish(self, L) -> None:
        """Result processing of a finished request (check_finished), then release."""
        from sglang.srt.managers.schedule_batch import FINISH_LENGTH, FINISH_MATCHED_TOKEN
        req = L.req
        self._lookahead(L)
        max_new = req.sampling_params.max_new_tokens
        if len(req.output_ids) >= max_new:
            req.finished_reason = FINISH_LENGTH(length=max_new)
        else:
            req.finished_reason = FINISH_MATCHED_TOKEN(matched=req.output_ids[-1])
        req.finished_len = min(len(req.output_ids), max_new)
        self._release(L)

    def _op_abort_queued(self, op):
        return self._abort_queued(op.rid)

    def _abort_queued(self, rid: int) -> str:
        """Scheduler.abort_request, waiting-queue branch: the request is popped."""
        if self.entry:          # upstream's own abort_request over the waiting queue
            L = self.live[rid]
            queued = [M.req for M in self.live.values() if M.phase == "queued"]
            popped = self.entry.abort(rid, queued)
            if popped != [L.req]:
                raise RuntimeError(f"abort_request popped {len(popped)} requests for {rid}")
            del self.live[rid]
            return "ok"
        L = self.live.pop(rid)
        if self.api == "borrow":
            self._abort_queued_borrow(L)
        if self.cfg.mamba_slots:            # "For mamba radix cache"
            hybrid.release_queued_mamba(L.req, self.cache)
        return "ok"

    def _op_queue_reject(self, op):
        """Scheduler._add_request_to_queue refuses the request (_set_or_validate_priority
        or _abort_on_queued_limit): 0.5.15 returns with no cache or session call;
        0.5.22+ calls _release_aborted_request, as the waiting-queue abort does."""
        if self.entry and self.api == "borrow":     # upstream's own _release_aborted_request
            L = self.live.pop(op.rid)
            self.entry.sch._release_aborted_request(L.req)
            if self.cfg.mamba_slots:
                hybrid.release_queued_mamba(L.req, self.cache)
            return "ok"
        return self._abort_queued(op.rid)

    def _op_pre_abort(self, op):
        """A fresh request: upstream's own `Req.set_finish_with_abort` (the validation
        aborts of handle_generate_request; one-token prompt). A retracted one: abort
        method 3 (`to_finish` only) landed in the iteration that retracted it."""
        from sglang.srt.managers.schedule_batch import FINISH_ABORT
        req = self.live[op.rid].req
        if req.is_retracted:
            req.to_finish = FINISH_ABORT()
        else:
            req.set_finish_with_abort("kvcheck: pre_abort")
        return "ok"

    def _op_abort_running(self, op):
        """abort_request on a running request: to_finish, promoted by
        update_finish_state at result processing, then release_kv_cache."""
        from sglang.srt.managers.schedule_batch import FINISH_ABORT
        L = self.live[op.rid]
        L.req.to_finish = FINISH_ABORT()
        L.req.update_finish_state()
        self._release(L)
        return "ok"

    def _op_retract(self, op):
        """ScheduleBatch.retract_decode for one request; it re-enters the queue."""
        L = self.live[op.rid]
        self._retract(L)
        self._enqueue(L)
        return "ok"

    def _retract(self, L) -> None:
        """release_req (the real module-level function: release_kv_cache(is_insert=False),
        evict, reset_for_retract); the request goes back to the waiting queue."""
        self._lookahead(L)
        self._release_req(L)
        self._retracted(L)

    def _retracted(self, L) -> None:
        """The scheduler's view of a retracted request: waiting again, nothing held, out
        of the running batch."""
        L.phase = "queued"
        L.locked = False
        L.batch = None
        if L in self.running:
            self.running.remove(L)


    def _op_close_session(self, op):
        from sglang.srt.managers.io_struct import CloseSessionReqInput
        sid = self._sid(op.sid)
        known = self.ctrl.get(sid) is not None
        if self.entry:          # Scheduler.close_session
            self.entry.close_session(sid)
        else:
            self.ctrl.close(CloseSessionReqInput(session_id=sid))
        if not known:                   # "session id ... does not exist, cannot delete"
            return "refused"
        s = self.ctrl.get(sid)
        return "deferred" if s is not None and s.close_on_finish else "ok"

    def _op_evict(self, op):
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams
        self.cache.evict(EvictParams(num_tokens=op.num_tokens))
        return "ok"

    # -- era-specific glue -------------------------------------------------------------

    def _lock(self, L) -> None:
        req = L.req
        if self.api == "flat":
            result = self.cache.inc_lock_ref(req.last_node)
            if self.cfg.swa_window:     # PrefillAdder._req_inc_lock_ref (is_hybrid_swa)
                req.swa_uuid_for_lock = result.swa_uuid_for_lock
        else:
            req.lock = self.cache.lock(req.last_node)
        L.locked = True

    def _unlock(self, L) -> None:
        req = L.req
        if self.api == "flat" and self.cfg.swa_window:
            from sglang.srt.mem_cache.base_prefix_cache import DecLockRefParams
            self.cache.dec_lock_ref(req.last_node,
                                    DecLockRefParams(swa_uuid_for_lock=req.swa_uuid_for_lock))
        elif self.api == "flat":
            self.cache.dec_lock_ref(req.last_node)
        else:
            lock = req.lock
            req.lock = None
            self.cache.unlock(lock)
        L.locked = False

    def _extend(self, L, prefix: int, end: int) -> None:
        """set_extend_range / extend_end, then ScheduleBatch.prepare_for_extend
        (alloc_for_extend: row, evict, allocator, write_cache_indices)."""
        req = L.req
        self._set_extend_range(req, prefix, end)
        L.batch = self._prepare_for_extend([req])
        self._write_shadow(req, prefix, end, list(req.get_fill_ids()))

    def _set_extend_range(self, req, prefix: int, end: int) -> None:
        """What PrefillAdder records for the chunk: set_extend_range / extend_end."""
        if self.api == "flat" and hasattr(req, "set_extend_range"):
            req.set_extend_range(prefix, end)
        elif self.api == "flat":    # 0.5.11-0.5.14: PrefillAdder's fill_len + extend_input_len
            req.set_extend_input_len(end - prefix)
            req.fill_len = end
        else:
            req.extend_end = end

    def _prepare_for_extend(self, reqs: list):
        """ScheduleBatch.init_new(reqs).prepare_for_extend(), as get_new_batch_prefill."""
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
        batch = ScheduleBatch.init_new(reqs, self.pool, self.alloc, self.cache,
                                       self.model_config, False, SpeculativeAlgorithm.NONE)
        batch.prepare_for_extend()
        if self.cfg.prefill_aware_swa:  # get_new_batch_prefill: model_runner.prefill_aware_swa
            for req in reqs:
                req.kv.swa_evict_floor = req.extend_end
        return batch

    def _extend_batch(self, batch: list) -> None:
        """The round's batch through upstream's own `ScheduleBatch.init_new(reqs)
        .prepare_for_extend()` (alloc_for_extend: rows, one eviction, the allocation,
        write_cache_indices, each request's session hook); then each request gets a
        batch of its own (`filter_batch`, upstream's) for the steps after it."""
        if len(batch) == 1:
            L, prefix, end, _ = batch[0]
            self._extend(L, prefix, end)
            return
        for L, prefix, end, _ in batch:
            self._set_extend_range(L.req, prefix, end)
        whole = self._prepare_for_extend([L.req for L, *_ in batch])
        for i, (L, prefix, end, _) in enumerate(batch):
            one = self._batch_copy(whole)
            one.filter_batch(keep_indices=[i])
            L.batch = one
            self._write_shadow(L.req, prefix, end, list(L.req.get_fill_ids()))

    def _chunk_prefix(self, L) -> int:
        return self._prefix_len(L.req)

    def _prefill_result(self, L) -> None:
        """process_batch_result_prefill: a pre-aborted request finishes here; otherwise
        one token is sampled and the prompt is cached (cache_unfinished_req)."""
        req = L.req
        if req.to_finish is not None:
            req.update_finish_state()
            self._release(L)
            return
        req.output_ids.append(SAMPLED_TOKEN)
        if len(req.output_ids) >= req.sampling_params.max_new_tokens:
            self._finish(L)         # check_finished: released before any cache_unfinished_req
            return
        self._cache_unfinished(L, chunked=False)
        L.phase = "decode"
        if self.cfg.enable_priority_scheduling or self.cfg.admission != "pages":
            self.running.append(L)      # merged into the running batch, which they read

    def _cache_unfinished(self, L, chunked: bool) -> None:
        from sglang.srt.mem_cache import common
        if self.api == "flat":
            if chunked:
                common.maybe_cache_unfinished_req(L.req, self.cache, chunked=True)
            else:
                common.maybe_cache_unfinished_req(L.req, self.cache)
        else:
            common.checkpoint_kv_cache(L.req, self.cache)

    def _release(self, L) -> None:
        """release_kv_cache; the request leaves the scheduler."""
        from sglang.srt.mem_cache.common import release_kv_cache
        if self.api == "flat":
            release_kv_cache(L.req, self.cache)
        else:
            release_kv_cache(L.req, self.cache, checkpoint=True)
        L.locked = False
        self.live.pop(L.rid, None)

    def _release_req(self, L) -> None:
        from sglang.srt.managers import schedule_batch as sb
        from sglang.srt.server_args import get_global_server_args
        import inspect
        params = inspect.signature(sb.release_req).parameters
        kwargs = dict(req=L.req, remaing_req_count=0, req_to_token_pool=self.pool,
                      token_to_kv_pool_allocator=self.alloc, tree_cache=self.cache)
        if "server_args" in params:      # 0.5.15; retired (raises) in 0.5.23
            kwargs["server_args"] = get_global_server_args()
        if "hisparse_coordinator" in params:
            kwargs["hisparse_coordinator"] = None
        sb.release_req(**kwargs)

    def _abort_queued_borrow(self, L) -> None:
        """0.5.22+ Scheduler.abort_request, waiting-queue branch: the popped request
        goes through _release_aborted_request, whose session part is
        `req.session.abort_req()` (unconditional) for a streaming request."""
        req = L.req
        if req.session is not None and getattr(req.session, "streaming", True):
            req.session.abort_req()

    def _set_lens(self, req, committed=None, allocated=None) -> None:
        target = req if self.api == "flat" and not self.shared else req.kv
        if committed is not None:
            target.kv_committed_len = committed
        if allocated is not None:
            (self._flat_record(req) if self.api == "flat" else target).kv_allocated_len = allocated

    def _sync_batch(self, L) -> None:
        """The scheduler's merge/filter keeps the running batch's per-request tensors in
        step with the request; one batch per request here, so re-derive them."""
        import torch
        b, req = L.batch, L.req
        committed = self._lens(req)[0]
        b.seq_lens = torch.tensor([committed], dtype=torch.int64)
        b.seq_lens_cpu = torch.tensor([committed], dtype=torch.int64)
        b.orig_seq_lens = torch.tensor([committed], dtype=torch.int32)
        b.req_pool_indices = torch.tensor([self._row(req)], dtype=torch.int64)
        if hasattr(b, "req_pool_indices_cpu"):
            b.req_pool_indices_cpu = torch.tensor([self._row(req)], dtype=torch.int64)

    def _prepare_for_decode(self, L) -> None:
        self._sync_batch(L)
        self._stamp_forward_iter(L)
        L.batch.prepare_for_decode()

    def _stamp_forward_iter(self, L) -> None:
        """The scheduler's forward counter on the batch (`maybe_evict_swa`'s maintenance
        step, `forward_iter % SGLANG_SWA_EVICTION_INTERVAL`): one per decode step."""
        self.forward_iter = getattr(self, "forward_iter", -1) + 1
        L.batch.forward_iter = self.forward_iter

    def _swa_decode_step(self, L) -> None:
        """The emulated speculative step's share of prepare_for_decode under SWA:
        upstream's `ScheduleBatch.maybe_evict_swa` in decode mode, then
        `decode_batch_idx += 1`."""
        if not self.cfg.swa_window:
            return
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
        self._sync_batch(L)
        self._stamp_forward_iter(L)
        L.batch.forward_mode = ForwardMode.DECODE
        L.batch.maybe_evict_swa()
        L.req.decode_batch_idx += 1

    def _alloc_range(self, req, start: int, end: int) -> None:
        """Allocate row positions [start, end) with upstream's helpers (alloc_token_slots
        / alloc_paged_token_slots_extend) and write them into req_to_token."""
        import torch
        try:    # 0.5.16+: the allocation helpers moved to mem_cache.allocation
            from sglang.srt.mem_cache import allocation as common
        except ImportError:
            from sglang.srt.mem_cache import common
        row = self._row(req)
        n = end - start
        if self.P == 1:
            out = common.alloc_token_slots(self.cache, n)
        else:
            last = self.pool.req_to_token[row, start - 1:start].to(torch.int64) if start > 0 \
                else torch.tensor([-1], dtype=torch.int64)
            pl = torch.tensor([start], dtype=torch.int64)
            sl = torch.tensor([end], dtype=torch.int64)
            out = common.alloc_paged_token_slots_extend(
                tree_cache=self.cache, prefix_lens=pl, prefix_lens_cpu=pl, seq_lens=sl,
                seq_lens_cpu=sl, last_loc=last, extend_num_tokens=n)
        self.pool.write((row, slice(start, end)), out.to(torch.int32))

    def _lookahead(self, L) -> None:
        """Overlap scheduling (and a speculative verify in flight): the step after the
        last one is already prepared, so the last token's KV exists at finish/retract."""
        req = L.req
        if not (self.cfg.overlap or self.cfg.spec_enabled):
            return
        committed, allocated, _ = self._lens(req)
        seqlen = len(req.origin_input_ids) + len(req.output_ids)
        if committed >= seqlen:
            return
        if committed >= allocated:
            if not self._can_alloc_decode(committed):
                return
            self._prepare_for_decode(L)
        else:
            self._set_lens(req, committed=committed + 1)
        self._write_shadow(req, committed, committed + 1)

    # -- observation ------------------------------------------------------------------
