"""The running batch's upkeep (upstream ScheduleBatch and the result processing): a round's
extend and its result, the decode step's memory check and retraction, the SWA window, finishing."""
from __future__ import annotations

from kvcheck.impl import common, faults
from kvcheck.impl.schedule_batch import FINISH_LENGTH, Req
from kvcheck.impl.swa import free_swa_out_of_window_slots, set_swa_evict_floor, swa_eviction_due


class RunningBatchMixin:
    """The Scheduler's running batch: what happens to the requests a round admitted (a
    mixin of impl/scheduler.py `Scheduler`, whose pools, tree and requests it reads)."""

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
                raise RuntimeError(f"Prefill out of memory (alloc_for_extend after admission, "
                                   f"req {req.rid})")
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

    def _finish_req(self, req: Req) -> None:
        self._overlap_lookahead(req)
        req.finished_reason = FINISH_LENGTH
        req.finished_len = min(len(req.output_ids), req.max_new_tokens)
        common.release_kv_cache(self, req)
        self._retire(req)

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
