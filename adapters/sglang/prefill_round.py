"""A prefill round of SglangBackend (`schedule`, `schedule_round`): upstream's own
PrefillAdder over the waiting requests named, with kvcheck's admission glue beside it
(`_RoundKV`, `_admits`) and, under priority scheduling, upstream's preempt_to_schedule over
the running batch (`_RunningBatch`). adapters/sglang/README.md ("Fidelity boundary")."""
from __future__ import annotations

from kvcheck.spec.pages import chunk_end, pages_needed_extend

from kvcheck.adapters.sglang import hybrid, swa_tree


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


class PrefillRound:
    """The prefill round's operations and steps (a mixin of Drive)."""

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
        rids = self._calc_priority(rids)
        if self.cfg.admission != "pages":
            return self._upstream_round(rids, limit)
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
        return self._run_round(rids, batch, preempted)

    def _calc_priority(self, rids: list) -> list:
        """Upstream's own `SchedulePolicy.calc_priority` (the server's default policy,
        "fcfs") over the waiting requests the round names, their queue entries the
        adapter's clock: under priority scheduling it sorts them by priority, then entry;
        otherwise it leaves their order be. The chunked request, not in the waiting
        queue, stays first. The round runs in the order it returns, so a spec that
        ordered them otherwise diverges."""
        from sglang.srt.managers.schedule_policy import SchedulePolicy
        policy = SchedulePolicy("fcfs", self.cache, False, self.cfg.enable_priority_scheduling,
                                False)
        chunked = [rid for rid in rids if self.live[rid].phase == "prefill"]
        queue = [self.live[rid] for rid in rids if self.live[rid].phase != "prefill"]
        for L in queue:
            L.req.time_stats.wait_queue_entry_time = float(L.entered)
        reqs = [L.req for L in queue]
        policy.calc_priority(reqs)
        rid_of = {id(L.req): L.rid for L in queue}
        return chunked + [rid_of[id(req)] for req in reqs]

    def _run_round(self, rids: list, batch: list, preempted: list) -> str:
        """The round's end: the preempted wait again, one `prepare_for_extend` allocates the
        batch, and each request's prefill result is processed."""
        for L in sorted(preempted, key=lambda L: (L.req.priority, -L.entered)):
            self._enqueue(L)            # the preempted re-enter the waiting queue
        if batch:
            self._extend_batch(batch)
            for L, _, end, input_len in batch:
                L.phase = "prefill"
                if end == input_len:
                    self._prefill_result(L)
        return "ok" if len(batch) == len(rids) else "rejected"

    def _upstream_round(self, rids: list, limit) -> str:
        """`config.admission` 'reserve' / 'reserve-held-rows': the round as
        `_get_new_batch_prefill_raw` runs it (0.5.15 `scheduler.py` l.2800-2936, 0.5.22
        l.4050-4160, 0.5.23 l.4153-4330), every admission decision upstream's own: the
        PrefillAdder built over the running batch (its remaining output reserved),
        `add_chunked_req` for the chunked request, then per waiting request the rows check
        (`_rows_full`), `init_next_round_input` and `add_one_req` until its verdict is not
        CONTINUE (0.5.23 also ends the round before a match on `budget_state()` OTHER)."""
        from sglang.srt.managers.schedule_policy import AddReqResult
        running = _RunningBatch(self, list(self.running))
        adder = self._prefill_adder(running)
        adder.priority_scheduling_preemption_threshold = \
            self.cfg.priority_scheduling_preemption_threshold
        batch, preempted, chunked = [], [], False
        for i, rid in enumerate(rids):
            L, refused = self.live[rid], limit is not None and i >= limit
            if L.phase == "prefill":
                prefix, input_len = self._checkpoint_chunk(L)
                chunked = True
                if not refused:
                    adder.add_chunked_req(L.req)
                    batch.append((L, prefix, self._extend_end(L.req), input_len))
                continue
            if self.cfg.admission == "reserve-held-rows" and \
                    adder.budget_state() == AddReqResult.OTHER:
                break
            if self._rows_full(adder) and not (self.cfg.enable_priority_scheduling and
                                               self._preempt(adder, running, L, preempted)):
                break           # batch_is_full, and nothing to preempt for it
            req = L.req
            req.init_next_round_input(self.cache)             # match_prefix
            if self.shared:
                self._note_slot_copies(restored=req)
            prefix, input_len = self._prefix_len(req), len(req.origin_input_ids) + len(req.output_ids)
            res = AddReqResult.OTHER if refused else \
                adder.add_one_req(req, has_chunked_req=chunked, truncation_align_size=None)
            if not (adder.can_run_list and adder.can_run_list[-1] is req):
                self._rejected(req)
                break
            L.locked = True
            batch.append((L, prefix, self._extend_end(req), input_len))
            if res != AddReqResult.CONTINUE:
                break
        return self._run_round(rids, batch, preempted)

    def _rows_full(self, adder) -> bool:
        """The scheduler's row check before each match, `len(can_run_list) >=
        get_num_allocatable_reqs(running_bs)` (kvcheck's glue: `pp_max_micro_batch_size`
        unbounded): the free rows (0.5.15 `scheduler.py` l.2728-2731, 0.5.22 l.3907-3925),
        0.5.23 adding back the rows the admitted requests hold (l.4027-4050, `num_held_rows`
        l.4225)."""
        rows = self.pool.available_size()
        if self.cfg.admission == "reserve-held-rows":
            rows += sum(self._row(r) is not None for r in adder.can_run_list)
        return len(adder.can_run_list) >= rows

    def _preempt(self, adder, running, L, preempted: list) -> bool:
        """Upstream's own `preempt_to_schedule(req)` over the adder's running batch
        (`running`, a `_RunningBatch`): its victims, mapped back before its `filter_batch`
        drops them, wait again after the round."""
        from sglang.srt.server_args import get_global_server_args
        before = len(adder.preempt_list)
        args = (get_global_server_args(),) if self.api == "flat" else ()
        by_req = {id(x.req): x for x in running.lives}      # before filter_batch drops them
        ok = adder.preempt_to_schedule(L.req, *args)
        preempted += [by_req[id(req)] for req in adder.preempt_list[before:]]
        return ok

    def _preempt_to_schedule(self, adder, L, kv, preempted: list) -> bool:
        """Upstream's own `PrefillAdder.preempt_to_schedule(req)` over the running batch
        (`_RunningBatch`): its victims, their order and its token test. The adapter's
        adder is built without the running batch (the spec's admission does not reserve
        its output), so for the call its budget carries the running requests' remaining
        output, as the scheduler's adder does; afterwards the budget is as before less the
        victims' (upstream subtracts those itself). The victims wait again; the rows they
        freed count for the rest of the round (`get_num_allocatable_reqs`)."""
        batch = _RunningBatch(self, list(self.running))   # its victims leave self.running
        offsets = sum(adder._get_running_request_total_token_offset(r) for r in batch.reqs)
        budget, field = (adder.memory_budget, "total_offset") if hasattr(adder, "memory_budget") \
            else (adder, "rem_total_token_offset")
        setattr(budget, field, getattr(budget, field) + offsets)
        adder.running_batch = batch
        adder.priority_scheduling_preemption_threshold = \
            self.cfg.priority_scheduling_preemption_threshold   # the scheduler passes its flag
        rows = self.pool.available_size()
        try:
            ok = self._preempt(adder, batch, L, preempted)
        finally:
            adder.running_batch = None
            left = sum(adder._get_running_request_total_token_offset(r) for r in batch.reqs)
            setattr(budget, field, getattr(budget, field) - left)
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

    def _prefill_adder(self, running=None):
        """The round's `PrefillAdder`, as `_get_new_batch_prefill_raw` builds it:
        `max_prefill_tokens` unbounded, `chunked_prefill_size` the config's,
        `new_token_ratio` 1; the running batch only under `config.admission` 'reserve'
        (the 'pages' rule does not reserve its output)."""
        from sglang.srt.managers.schedule_policy import PrefillAdder
        return PrefillAdder(self.P, self.cache, self.alloc, running, 1.0, 1 << 30,
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
