"""Planted faults in the scheduling round's own code: PrefillAdder (schedule_policy),
alloc_for_extend, and ScheduleBatch's decode round and retraction."""
from __future__ import annotations

from kvcheck.adapters.sglang.faults_patch import _patch

POLICY = "sglang.srt.managers.schedule_policy"
BATCH = "sglang.srt.managers.schedule_batch"


def _allocation_module(version: str) -> str:
    """Where alloc_for_extend and alloc_req_slots live: 0.5.16+ `mem_cache.allocation`,
    0.5.14-0.5.15 `mem_cache.common`."""
    return "sglang.srt.mem_cache.common" if version == "0.5.15" else \
        "sglang.srt.mem_cache.allocation"


def _round_charge_leak(version: str) -> None:
    # PrefillAdder._update_prefill_budget charges each admitted request's page-ceiled
    # extend to rem_chunk_tokens (and the input and memory budgets) so that the next
    # candidate of the round sees what is left. Skip the charge of a round's first
    # admitted request: the chunk budget leaks across the round.
    def make(orig):
        def _update_prefill_budget(self, *args, **kwargs):
            if len(self.can_run_list) == 1:
                return None
            return orig(self, *args, **kwargs)
        return _update_prefill_budget
    _patch(POLICY, "PrefillAdder", "_update_prefill_budget", make)


def _admission_lock_dropped(version: str) -> None:
    # add_one_req takes the admitted request's persistent tree lock (0.5.15
    # _req_inc_lock_ref; 0.5.23 _commit_prefill_admission's `req.lock =
    # tree_cache.lock(req.last_node)`), held until the request is cached or released.
    # Give it back at once: the matched prefix is unlocked while the request runs on it.
    if version == "0.5.15":
        def make(orig):
            def _req_inc_lock_ref(self, req):
                out = orig(self, req)
                self.tree_cache.dec_lock_ref(req.last_node)
                return out
            return _req_inc_lock_ref
        _patch(POLICY, "PrefillAdder", "_req_inc_lock_ref", make)
        return

    def make23(orig):
        def _commit_prefill_admission(self, req, *args, **kwargs):
            out = orig(self, req, *args, **kwargs)
            if req.lock is not None:
                self.tree_cache.unlock(req.lock)
                req.lock = None
            return out
        return _commit_prefill_admission
    _patch(POLICY, "PrefillAdder", "_commit_prefill_admission", make23)


def _admission_pin_kept(version: str) -> None:
    # add_one_req reads the budget under a temporary pin of the matched prefix
    # (`_lock_node`: "The temporary pin excludes this prefix from the evictable budget"),
    # released when the selection is done. Take the pin once more after it: the prefix
    # stays locked after the round.
    from contextlib import contextmanager

    def make(orig):
        @contextmanager
        def _lock_node(self, last_node, **kwargs):
            with orig(self, last_node, **kwargs):
                yield None
            if version == "0.5.15":
                self.tree_cache.inc_lock_ref(last_node)
            else:
                self.tree_cache.lock(last_node)
        return _lock_node
    _patch(POLICY, "PrefillAdder", "_lock_node", make)


def _retract_keeps_least_preferred(version: str) -> None:
    # 0.5.23 ScheduleBatch._get_decode_retraction_order: "indices ordered from
    # most-preferred to least-preferred to keep. The retraction loop pops from the end"
    # (most output tokens, then the shortest prompt, kept). Reverse it: the request
    # with the most progress is retracted first.
    def make(orig):
        def _get_decode_retraction_order(reqs):
            return list(reversed(orig.__func__(reqs)))
        return staticmethod(_get_decode_retraction_order)
    _patch(BATCH, "ScheduleBatch", "_get_decode_retraction_order", make)


def _decode_mem_one_page(version: str) -> None:
    # new_tokens_required_next_decode: a page for every request whose next token starts
    # one (`r.kv_committed_len % page_size == 0`), what prepare_for_decode then
    # allocates for the whole batch. Count at most one page for the batch:
    # check_decode_mem passes while the batch is short, and no request is retracted.
    def make(orig):
        def new_tokens_required_next_decode(self, selected_indices=None):
            return min(orig(self, selected_indices),
                       self.token_to_kv_pool_allocator.page_size)
        return new_tokens_required_next_decode
    _patch(BATCH, "ScheduleBatch", "new_tokens_required_next_decode", make)


def _extend_rows_swapped(version: str) -> None:
    # alloc_for_extend takes the batch's rows from alloc_req_slots, one per request in
    # batch order, and writes each request's prefix and new KV indices into its row
    # (write_cache_indices). Hand the rows back in reverse order for a batch of two or
    # more: each request's pages are written into another request's row.
    def make(orig):
        def alloc_req_slots(req_to_token_pool, reqs, *args, **kwargs):
            rows = orig(req_to_token_pool, reqs, *args, **kwargs)
            return list(reversed(rows)) if len(rows) > 1 else rows
        return alloc_req_slots
    _patch(_allocation_module(version), None, "alloc_req_slots", make)


def _preempt_takes_finished(version: str) -> None:
    # preempt_to_schedule's NOTE: "A request finishes in two phases ... Preemption runs
    # between these two phases ... so running_batch may still contain requests whose KV
    # cache is already freed. We must skip them here to avoid a double-free on
    # release_req." Hide that they finished for the call.
    def make(orig):
        def preempt_to_schedule(self, req, *args, **kwargs):
            done = [r for r in self.running_batch.reqs if r.finished()]
            for r in done:
                r.finished = _not_finished
            try:
                return orig(self, req, *args, **kwargs)
            finally:
                for r in done:
                    del r.finished
        return preempt_to_schedule
    _patch(POLICY, "PrefillAdder", "preempt_to_schedule", make)


def _not_finished() -> bool:
    return False


def _preempt_oldest_first(version: str) -> None:
    # preempt_to_schedule sorts its candidates by priority, then
    # `-x.time_stats.wait_queue_entry_time`: the latest to enter the queue is preempted
    # first. Negate the entry times for the call: the earliest is.
    def make(orig):
        def preempt_to_schedule(self, req, *args, **kwargs):
            reqs = list(self.running_batch.reqs)
            for r in reqs:
                r.time_stats.wait_queue_entry_time *= -1
            try:
                return orig(self, req, *args, **kwargs)
            finally:
                for r in reqs:
                    r.time_stats.wait_queue_entry_time *= -1
        return preempt_to_schedule
    _patch(POLICY, "PrefillAdder", "preempt_to_schedule", make)


def _running_output_unreserved(version: str) -> None:
    # The PrefillAdder built over the running batch reserves each running request's
    # remaining output (`_get_running_request_total_token_offset`, "Estimate the offset in
    # the remaining token space"), so a round does not admit into the decode headroom the
    # running requests were promised. Reserve nothing for them.
    def make(orig):
        def _get_running_request_total_token_offset(self, req):
            return 0
        return _get_running_request_total_token_offset
    _patch(POLICY, "PrefillAdder", "_get_running_request_total_token_offset", make)


def _admission_not_strict(version: str) -> None:
    # add_one_req admits a request only when its reservation is strictly below what is
    # left (0.5.15 `total_tokens >= self.rem_total_tokens` -> NO_TOKEN; 0.5.23
    # `PrefillBudget.check_prefill`'s `total_tokens < self.remaining_total`). Admit one
    # that exactly fills it: one token more is left for the call, and given back after.
    def make(orig):
        def add_one_req(self, req, *args, **kwargs):
            budget, field = (self.memory_budget, "total_offset") \
                if hasattr(self, "memory_budget") else (self, "rem_total_token_offset")
            setattr(budget, field, getattr(budget, field) - 1)
            try:
                return orig(self, req, *args, **kwargs)
            finally:
                setattr(budget, field, getattr(budget, field) + 1)
        return add_one_req
    _patch(POLICY, "PrefillAdder", "add_one_req", make)


def _calc_priority_ignores_priority(version: str) -> None:
    # Under priority scheduling calc_priority sorts the waiting queue by priority, then
    # entry (`_sort_by_priority_and_fcfs`, key `(priority * priority_sign,
    # wait_queue_entry_time)`). Call it with a sign of 0: the queue keeps its entry order.
    def make(orig):
        def _sort_by_priority_and_fcfs(waiting_queue, priority_sign):
            return orig(waiting_queue, 0)
        return staticmethod(_sort_by_priority_and_fcfs)
    _patch(POLICY, "SchedulePolicy", "_sort_by_priority_and_fcfs", make)
