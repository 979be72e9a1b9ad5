"""SglangBackend's operations: each kvcheck operation carried out through upstream's own
scheduler glue (match, admit, allocate, prefill, decode, finish, abort, retract, close,
evict)."""
from __future__ import annotations

import copy

from kvcheck.spec.model import resolve_logprob_start
from kvcheck.spec.pages import ceil_align, chunk_end, pages_needed_extend

from kvcheck.adapters.sglang import hybrid, swa_tree
from kvcheck.adapters.sglang.release import SAMPLED_TOKEN, VOCAB, _Live

class _RoundKV:
    """What the spec's admission reads beside upstream's PrefillAdder (kvcheck's glue, as
    spec/admission.py `_Budget`): the rows left and the KV tokens the admitted requests
    reserve (their page-ceiled new pages). Upstream's own budget (`PrefillBudget` /
    `rem_total_tokens`) also reserves each request's max_new_tokens and a page, and the
    running batch's remaining output; the spec does not (adapters/sglang/README.md)."""

    def __init__(self, rows: int):
        self.rows, self.reserved = rows, 0

    def charge(self, prefix: int, end: int, new_row: bool, P: int) -> None:
        self.reserved += pages_needed_extend(prefix, end, P) * P
        self.rows -= new_row


class _RetractHook:
    """The running batch's `release_req` during `retract_decode`: the victim's overlap
    lookahead (`Drive._lookahead`, the step already prepared under overlap scheduling),
    then upstream's own `ScheduleBatch.release_req`."""

    def __init__(self, drive, batch, by_req: dict):
        self.drive, self.batch, self.by_req = drive, batch, by_req

    def __call__(self, idx, *args, **kwargs):
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        self.drive._lookahead(self.by_req[id(self.batch.reqs[idx])])
        return ScheduleBatch.release_req(self.batch, idx, *args, **kwargs)


class _RunningBatch:
    """The running batch as `PrefillAdder.preempt_to_schedule` reads it: its requests in
    merge order (a finished one still there unless filtered), `release_req` of one of them
    (`Drive._retract`: the victim's overlap lookahead, upstream's module-level
    `release_req`, waiting again) and `filter_batch(keep_indices)` over the list. kvcheck's glue: the adapter keeps one
    batch per request, so the merged batch's tensors are not built."""

    def __init__(self, drive, lives: list):
        self.drive, self.lives = drive, list(lives)
        self.reqs = [L.req for L in self.lives]
        for L in self.lives:        # the entry order preempt_to_schedule sorts by
            L.req.time_stats.wait_queue_entry_time = float(L.entered)

    def release_req(self, idx, remaining, *args, **kwargs):
        self.drive._retract(self.lives[idx])
        return True

    def filter_batch(self, keep_indices=None, **kwargs):
        self.lives = [self.lives[i] for i in keep_indices]
        self.reqs = [L.req for L in self.lives]


class Drive:
    """The operations of SglangBackend (adapters/sglang/backend.py)."""

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
        rejected = req.to_finish is not None
        self.live[op.rid] = _Live(op.rid, req, streaming=req.session is not None,
                                  rejected=rejected)
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
            stub = req.to_finish is not None
            self.live[op.rid] = _Live(op.rid, req, streaming=True, rejected=stub)
            self._enqueue(self.live[op.rid], op.priority)
            return "stub" if stub else "ok"
        # session closing (or unknown): a plain Req aborted at once, no session attached
        from sglang.srt.managers.schedule_batch import Req
        req = Req(str(op.rid), None, t.input_ids, t.sampling_params, vocab_size=VOCAB)
        req.tokenizer = None
        req.set_finish_with_abort(f"Invalid request: close was requested for session {sid}"
                                  if session is not None else
                                  f"Invalid request: session id {sid} does not exist")
        self.live[op.rid] = _Live(op.rid, req, streaming=False, rejected=True)
        self._enqueue(self.live[op.rid], op.priority)
        return "stub"

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
        self.live[op.rid] = _Live(op.rid, req, streaming=False, rejected=False)
        self._enqueue(self.live[op.rid], op.priority)
        return "ok"

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

    def _op_schedule(self, op):
        """get_new_batch_prefill for one waiting request: the round of one."""
        return self._round([op.rid], None if op.admit else 0)

    def _op_schedule_round(self, op):
        return self._round(list(op.rids), op.limit)

    def _round(self, rids: list, limit) -> str:
        """get_new_batch_prefill: upstream's own `PrefillAdder` holds the round (its
        `rem_chunk_tokens` and `rem_input_tokens`, `can_run_list`, `new_chunked_req`, the
        lock it takes, `_update_prefill_budget`'s charge, `budget_state()`'s verdict after
        each request); the chunked request first (`add_chunked_req`), then each waiting
        request's `init_next_round_input` (match_prefix) and admission, until one is
        refused or the verdict is OTHER; then `ScheduleBatch.init_new(can_run_list)
        .prepare_for_extend()` allocates rows and KV for the whole batch and runs the
        session hooks, and its result is processed request by request."""
        if self.cfg.filter_before_prefill:
            self._filter_batch()
        adder = self._prefill_adder()
        kv = _RoundKV(self.pool.available_size())
        batch, preempted = [], []
        for i, rid in enumerate(rids):
            if self._budget_spent(adder):
                break
            L = self.live[rid]
            refused = limit is not None and i >= limit
            if L.phase == "prefill":
                item = self._add_chunked_req(adder, L, kv, refused)
            else:
                if self.cfg.enable_priority_scheduling and kv.rows <= 0 and \
                        not self._preempt_to_schedule(adder, L, kv, preempted):
                    break           # batch_is_full, and nothing to preempt for it
                item = self._add_one_req(adder, L, kv, refused)
                if item is None:
                    break
            if item is not None:
                batch.append(item)
        for L in sorted(preempted, key=lambda L: (L.req.priority, -L.entered)):
            self._enqueue(L)            # the preempted re-enter the waiting queue
        if batch:
            self._extend_batch(batch)
            for L, _, end, input_len in batch:
                L.phase = "prefill"
                if end == input_len:
                    self._prefill_result(L)
        return "ok" if len(batch) == len(rids) else "rejected"

    def _preempt_to_schedule(self, adder, L, kv, preempted: list) -> bool:
        """Upstream's own `PrefillAdder.preempt_to_schedule(req)` over the running batch
        (`_RunningBatch`): its victims, their order and its token test. The adapter's
        adder is built without the running batch (the spec's admission does not reserve
        its output), so for the call its budget carries the running requests' remaining
        output, as the scheduler's adder does; afterwards the budget is as before less the
        victims' (upstream subtracts those itself). The victims wait again; the rows they
        freed count for the rest of the round (`get_num_allocatable_reqs`)."""
        from sglang.srt.server_args import get_global_server_args
        running = list(self.running)        # its victims leave self.running as released
        batch = _RunningBatch(self, running)
        offsets = sum(adder._get_running_request_total_token_offset(r) for r in batch.reqs)
        budget, field = (adder.memory_budget, "total_offset") if hasattr(adder, "memory_budget") \
            else (adder, "rem_total_token_offset")
        setattr(budget, field, getattr(budget, field) + offsets)
        adder.running_batch = batch
        adder.priority_scheduling_preemption_threshold = \
            self.cfg.priority_scheduling_preemption_threshold   # the scheduler passes its flag
        rows, before = self.pool.available_size(), len(adder.preempt_list)
        args = (get_global_server_args(),) if self.api == "flat" else ()
        try:
            ok = adder.preempt_to_schedule(L.req, *args)
        finally:
            adder.running_batch = None
            left = sum(adder._get_running_request_total_token_offset(r) for r in batch.reqs)
            setattr(budget, field, getattr(budget, field) - left)
        by_req = {id(x.req): x for x in running}
        preempted += [by_req[id(req)] for req in adder.preempt_list[before:]]
        kv.rows += self.pool.available_size() - rows
        return ok

    def _filter_batch(self) -> None:
        """filter_batch: the finished requests leave the running batch."""
        self.running = [L for L in self.running if not L.req.finished()]

    @staticmethod
    def _budget_spent(adder) -> bool:
        """`budget_state()`'s OTHER verdict, read from upstream's own PrefillAdder
        budgets: `rem_input_tokens` or `rem_chunk_tokens` spent. (Its NO_TOKEN verdict is
        upstream's reservation of max_new_tokens and a page per request, which the spec
        does not model, and which budget_state checks first.)"""
        return adder.rem_input_tokens <= 0 or \
            (adder.rem_chunk_tokens is not None and adder.rem_chunk_tokens <= 0)

    def _prefill_adder(self):
        """The round's `PrefillAdder`, as `_get_new_batch_prefill_raw` builds it: no
        running batch (its reservation is not modelled), `max_prefill_tokens` unbounded,
        `chunked_prefill_size` the config's."""
        from sglang.srt.managers.schedule_policy import PrefillAdder
        return PrefillAdder(self.P, self.cache, self.alloc, None, 1.0, 1 << 30,
                            self.cfg.chunk_size)

    def _add_one_req(self, adder, L, kv, refused: bool):
        """init_next_round_input, then PrefillAdder.add_one_req: under upstream's own
        temporary lock (`_lock_node`) the spec's admission test (`_admits`), then
        upstream's commit (`_commit`): extend range, persistent lock, `can_run_list`,
        `new_chunked_req`, the budget charge. (L, prefix, end, input_len), or None when
        the request is refused."""
        req = L.req
        req.init_next_round_input(self.cache)                 # match_prefix
        if self.shared:
            self._note_slot_copies(restored=req)
        prefix = self._prefix_len(req)
        input_len = len(req.origin_input_ids) + len(req.output_ids)
        end = chunk_end(prefix, input_len, adder.rem_chunk_tokens, self.P)
        if refused or end <= prefix < input_len:
            self._rejected(req)
            return None
        with adder._lock_node(req.last_node):
            fits = self._admits(L, kv, prefix, end, waiting=True)
        if not fits:
            self._rejected(req)
            return None
        kv.charge(prefix, end, self._row(req) is None, self.P)
        self._commit(adder, L, prefix, end, input_len)
        return L, prefix, end, input_len

    def _admits(self, L, kv, prefix: int, end: int, waiting: bool) -> bool:
        """The spec's admission test (spec/admission.py `_add_one_req`, kvcheck's glue in place
        of `PrefillBudget.check_prefill` / `rem_total_tokens`): a row, the Mamba slots, the
        round's new pages against available + evictable, the SWA budget."""
        req = L.req
        need = pages_needed_extend(prefix, end, self.P) * self.P + kv.reserved
        if need > self.alloc.available_size() + swa_tree.tree_sizes(self.cache)[0]:
            return False
        if not waiting:
            return True
        # rows: under priority scheduling only the round's batch_is_full test, before the
        # match and preemption, counts them (upstream's add_one_req does not)
        rows_short = self._row(req) is None and kv.rows < 1 and \
            not self.cfg.enable_priority_scheduling
        return not (rows_short or
                    hybrid.mamba_short(self.pool, req, self.cache if self.cfg.mamba_tree else None) or
                    (self.cfg.swa_window and need > swa_tree.swa_budget(self.cache, self.alloc)))

    def _commit(self, adder, L, prefix: int, end: int, input_len: int) -> None:
        """What add_one_req does once a request is admitted: 0.5.22+
        `_commit_prefill_admission` itself; the flat API the same steps of its
        `add_one_req` (0.5.15 schedule_policy.py l.1085-1135): `set_extend_range`,
        `can_run_list`, `new_chunked_req`, `_req_inc_lock_ref`, `_update_prefill_budget`."""
        req = L.req
        chunked = end < input_len
        max_new = 0 if chunked else req.sampling_params.max_new_tokens
        if self.api == "borrow":
            from sglang.srt.managers.schedule_policy import _PrefillAdmission
            shape = dict(prefix_len=prefix, extend_len=end - prefix, max_new_tokens=max_new,
                         is_chunked=chunked)
            if "replay_len" in _PrefillAdmission.__dataclass_fields__:
                shape["replay_len"] = 0     # 0.5.23: encoder replay's recomputed rows
            adder._commit_prefill_admission(req, _PrefillAdmission(**shape), 0)
        else:
            self._set_extend_range(req, prefix, end)
            adder.can_run_list.append(req)
            if chunked:
                adder.new_chunked_req = req
            adder._req_inc_lock_ref(req)
            adder._update_prefill_budget(prefix, end - prefix, max_new, req.retracted_stain)
        L.locked = True

    def _add_chunked_req(self, adder, L, kv, refused: bool):
        """The chunked request's next round: its checkpoint (`_checkpoint_chunk`), then,
        when the spec's KV test takes the chunk, upstream's own
        `PrefillAdder.add_chunked_req` (it sizes the chunk by `rem_chunk_tokens`, sets
        the extend range and charges the budget). None when the chunk is not taken."""
        prefix, input_len = self._checkpoint_chunk(L)
        end = chunk_end(prefix, input_len, adder.rem_chunk_tokens, self.P)
        if refused or end <= prefix or not self._admits(L, kv, prefix, end, waiting=False):
            return None
        adder.add_chunked_req(L.req)
        kv.charge(prefix, end, False, self.P)
        return L, prefix, self._extend_end(L.req), input_len

    def _extend_end(self, req) -> int:
        """Where the extend the PrefillAdder recorded ends (`_set_extend_range`'s field)."""
        if self.api == "borrow":
            return req.extend_end
        return req.extend_range.end if hasattr(req, "set_extend_range") else req.fill_len

    def _rejected(self, req) -> str:
        """A request the round does not add (0.5.23 `get_new_batch_prefill`, "revert
        matched mamba idx"): the staged copy-on-write is dropped and a request without a
        session gives its copy-on-write slot back."""
        if self.cfg.mamba_tree:
            hybrid.revert_cow(self.pool, req)
        return "rejected"

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
            popped = self.entry.abort(rid, queued, running=[])
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

    def _op_decode_round(self, op):
        """update_running_batch and a decode step over the running batch, all upstream's:
        the batch merged from the requests' own (`merge_batch`), its `check_decode_mem`,
        `retract_decode` when that fails (each victim through `_RetractHook`), then the
        batch's `prepare_for_decode` (one eviction and `alloc_for_decode` for the whole
        batch); the forward's KV and the result in batch order."""
        lives = [self.live[rid] for rid in op.rids]
        self._filter_batch()
        batch = self._merged_batch(lives)
        out = "ok"
        if not batch.check_decode_mem():
            lives = self._retract_decode(batch, lives)
            out = "oom"
        if lives:
            pos = [self._lens(L.req)[0] for L in lives]
            self.forward_iter = getattr(self, "forward_iter", -1) + 1
            batch.forward_iter = self.forward_iter
            batch.prepare_for_decode()
            for L, p in zip(lives, pos):
                self._write_shadow(L.req, p, p + 1)
        for L in lives:
            L.req.output_ids.append(SAMPLED_TOKEN)
        for L in lives:
            self._check_finished(L)
        return out

    def _merged_batch(self, lives: list):
        """The running batch: each request's own batch (tensors re-derived,
        `_sync_batch`) merged into one by upstream's `merge_batch`, as the scheduler's
        running batch grows by each prefill batch."""
        for L in lives:
            self._sync_batch(L)
        whole = self._batch_copy(lives[0].batch)
        for L in lives[1:]:
            whole.merge_batch(L.batch)
        return whole

    @staticmethod
    def _batch_copy(batch):
        """A batch that merge_batch / filter_batch may rebind or extend (0.5.15's
        `merge_batch` extends its lists in place) without touching `batch`."""
        one = copy.copy(batch)
        one.sampling_info = copy.copy(batch.sampling_info)
        for name, value in vars(batch).items():
            if isinstance(value, list):
                setattr(one, name, list(value))
        return one

    def _retract_decode(self, batch, lives: list) -> list:
        """Upstream's `ScheduleBatch.retract_decode` (0.5.15 `schedule_batch.py` l.2470,
        0.5.23 l.3451): its victim order, victims until the rest fits, the last one
        aborted; each victim's release goes through `_RetractHook`. The requests left, in
        the order upstream's `filter_batch` keeps them."""
        from sglang.srt.server_args import get_global_server_args
        by_req = {id(L.req): L for L in lives}
        batch.release_req = _RetractHook(self, batch, by_req)
        args = (get_global_server_args(),) if self.api == "flat" else ()
        retracted, _, aborted = batch.retract_decode(*args)
        for req in retracted + aborted:
            self._retracted(by_req[id(req)])
        for req in retracted:       # update_running_batch re-queues them
            self._enqueue(by_req[id(req)])
        for req in aborted:         # FINISH_ABORT: only an abort output is sent
            self.live.pop(by_req[id(req)].rid)
        return [by_req[id(req)] for req in batch.reqs]

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
        if self.cfg.enable_priority_scheduling:     # merged into the running batch
            self.running.append(L)

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
