"""The prefill round (`get_new_batch_prefill`): each request's prefix match (slot restore or
radix match), the PrefillAdder's budgets and admission, and priority preemption
(0.5.23 schedule_policy.py l.1707-1777).
"""
from __future__ import annotations

from kvcheck.spec import mamba_pool, mamba_tree, swa_pool, swa_tree
from kvcheck.spec.allocator import NO_ROW, available_size
from kvcheck.spec.finish import (CLIP_MAX_NEW_TOKENS, _retract, counts_running_output,
                                 enter_waiting_queue, preemption_order, running_batch,
                                 running_offset, update_running_batch)
from kvcheck.spec.forward import _checkpoint_chunk, _prepare_for_extend, _process_prefill_result
from kvcheck.spec.pages import (ceil_align, chunk_end, pages_needed_extend, reserve_chunk_end,
                                restore_prefix_len)
from kvcheck.spec.radix_cache import _walk, dec_lock_ref, evict_mamba, inc_lock_ref, match_prefix
from kvcheck.spec.sessions import _free_tail, _restore_to_req, accepts, find_active_slot
from kvcheck.spec.state import ROOT, Req, State
from kvcheck.spec.token_arrays import refresh_fill
from kvcheck.spec.violations import ModelError


def _key_limit(req: Req) -> int:
    """`_compute_max_prefix_len` (0.5.15 `schedule_batch.py` l.1225-1230, 0.5.23
    l.1768-1780): input_len - 1 (the one-token logit reserve), capped at the request's
    `logprob_start_len` when it returns logprobs from there."""
    limit = req.seqlen - 1
    if req.logprob_start >= 0:
        limit = min(limit, req.logprob_start)
    return max(limit, 0)


def resolve_logprob_start(logprob_start_len, prompt_len: int) -> int:
    """`handle_generate_request` (0.5.15 `scheduler.py` l.2213-2235, 0.5.23 l.3256-3279):
    no logprobs -> -1; logprobs with the default -1 -> the prompt length (output-token
    logprobs only); else the given start."""
    if logprob_start_len is None:
        return -1
    return prompt_len if logprob_start_len == -1 else logprob_start_len


def _match(s: State, req: Req) -> int:
    """`init_next_round_input` -> `match_prefix`: slot restore or radix match.
    Returns prefix_len."""
    refresh_fill(s, req)
    slot = find_active_slot(s, req)
    if slot is not None:
        _restore_to_req(slot, req)
        prefix_len = restore_prefix_len(req.committed, req.seqlen)
        if prefix_len < slot.protected:
            raise ModelError(f"streaming session prefix shrank: prefix_len={prefix_len} "
                             f"< slot.cache_protected_len={slot.protected}")
        prefix_len = swa_pool.swa_aligned_rewind(s, req, prefix_len)
        _free_tail(s, slot, req, prefix_len)
        req.last_node = ("virtual", req.session)
        req.protected = slot.protected
        req.prefix_len = prefix_len
        req.swa_branching_seqlen = None     # `try_match_prefix`'s MatchResult carries none
        return prefix_len
    if mamba_tree.on(s):
        nid, pages = _match_mamba_tree(s, req)
        req.last_node = ("node", nid)
        req.protected = req.prefix_len = len(pages)
        req.prefix_pages = tuple(pages)
        return req.prefix_len
    swa = swa_pool.swa_on(s)
    nid, pages = match_prefix(s, req.fill[:_key_limit(req)], stamp=not swa)
    usable = swa_tree.swa_match_len(s, pages)
    req.swa_branching_seqlen = swa_tree.swa_branching_seqlen(s, len(pages) * s.cfg.page_size, usable)
    if usable < len(pages) * s.cfg.page_size or swa:
        # SWARadixCache `_match_post_processor` (0.5.23's too: it stamps `best_match_node`
        # and its ancestors, the SWA validator's last valid node): only the usable node
        # and its parents are touched (`reset_node_and_parents_mru`), after the walk's splits
        nid, pages = match_prefix(s, req.fill[:usable])
        swa_tree.swa_refresh(s, nid)          # 0.5.23: MATCH_END from `best_match_node`
    req.last_node = ("node", nid)
    req.protected = len(pages) * s.cfg.page_size
    req.prefix_len = req.protected
    req.prefix_pages = tuple(pages)    # prefix_indices, written into the row at alloc
    return req.prefix_len


def _match_mamba_tree(s: State, req: Req) -> tuple[int, list]:
    """0.5.23 `_match_tree` with a Mamba component (P = 1): the walk splits but stamps
    nothing; the match ends at the deepest node with a state, which `_match_post_processor`
    stamps with its ancestors and moves to the Mamba MRU end; `finalize_match_result_in_cache`
    copies its state into a fresh slot for a request that holds none (evicting one state
    with the node locked when the pool is empty)."""
    last, _, pages = _walk(s, req.fill[:_key_limit(req)], stamp=False)
    best = mamba_tree.best_node(s, last)
    _match_post_stamp(s, best)
    if best == ROOT:
        return ROOT, []
    node = s.nodes[best]
    if req.mamba_pool_idx is None:
        if not s.mamba_free_slots:
            inc_lock_ref(s, ("node", best))
            evict_mamba(s, 1)
            dec_lock_ref(s, ("node", best))
        m = mamba_tree.alloc_slot(s)
        if m is None:
            raise ModelError("finalize_match_result_in_cache: Can not alloc mamba cache")
        req.mamba_pool_idx = m
    return best, pages[:len(node.path)]


def _match_post_stamp(s: State, best: int) -> None:
    """`_match_post_processor`'s touches: best and its ancestors get one access tick; the
    Mamba LRU takes best's state to the MRU end (0.5.23 `refresh_lru` MATCH_END), every
    state on its path (0.5.15 `reset_node_and_parents_mru`)."""
    s.tick += 1
    nid = best
    while nid != ROOT:
        n = s.nodes[nid]
        n.tick = s.tick
        nid = n.parent
    if best == ROOT:
        return
    if mamba_tree.wrapper_rules(s):
        mamba_tree.touch_path(s, best)
    else:
        mamba_tree.touch(s, s.nodes[best])


def _mamba_revert_cow(s: State, req: Req) -> None:
    """A request the round does not add: `get_new_batch_prefill` frees the copy-on-write
    slot of a request without a session ("revert matched mamba idx")."""
    if mamba_tree.on(s) and req.session is None and req.mamba_pool_idx is not None:
        mamba_pool.free_mamba(s, req)


def _new_tokens_needed(s: State, prefix: int, end: int) -> int:
    P = s.cfg.page_size
    return pages_needed_extend(prefix, end, P) * P


def _schedule(s: State, req: Req, admit: bool) -> str:
    """`schedule(rid, admit)`: the prefill round of one request."""
    return _schedule_round(s, [req], None if admit else 0)


def _schedule_round(s: State, reqs: list, limit) -> str:
    """`Scheduler._get_new_batch_prefill_raw` (0.5.15 `scheduler.py` l.2753, 0.5.23
    l.4079-4330): the PrefillAdder loop admits a
    batch, one `prepare_for_extend` allocates it, then the result is processed request by
    request. "ok" when every request named was admitted, else "rejected"."""
    batch = _admit_round(s, reqs, limit)
    if batch:
        _prepare_for_extend(s, batch)
        _process_prefill_result(s, batch)
    return "ok" if len(batch) == len(reqs) else "rejected"


NO_TOKEN, OTHER, CONTINUE = "NO_TOKEN", "OTHER", "CONTINUE"
"""`AddReqResult`'s verdicts, as `PrefillAdder.budget_state()` gives them."""


class _Budget:
    """What one PrefillAdder has left while it admits a round: rows, KV tokens (beyond
    what the live `available + evictable` shows: the admitted requests' page-ceiled
    extends) and the chunk (`rem_chunk_tokens`, None: no chunked prefill). Under priority
    scheduling or `config.admission` 'reserve' also `memory_budget.total_offset` (the
    running batch's remaining output, then each admitted request's charge) and, under
    'reserve', `current_offset` (each admitted request's extend and page)."""

    def __init__(self, s: State):
        self.rows = len(s.free_rows)
        self.new_rows = 0               # admitted requests that take a row
        self.admitted = 0               # len(can_run_list)
        self.reserved = 0
        self.chunk = s.cfg.chunk_size
        self.offset = sum(s.unfiltered) + sum(map(running_offset, running_batch(s))) \
            if counts_running_output(s) else 0
        self.current = 0
        self.preempted: list = []

    def spent(self) -> bool:
        """`budget_state() == OTHER` for the chunk: the next request is not considered."""
        return self.chunk is not None and self.chunk <= 0

    def remaining_total(self, s: State) -> int:
        """`rem_total_tokens`: available + evictable less the reservations."""
        return available_size(s) + s.evictable_size - self.offset

    def state(self, s: State) -> str:
        """`budget_state()`: NO_TOKEN once the reservations reach available + evictable,
        OTHER once the chunk is spent."""
        room = available_size(s) + s.evictable_size
        if room - self.offset <= 0 or room - self.current <= 0:
            return NO_TOKEN
        return OTHER if self.spent() else CONTINUE

    def rows_full(self, s: State) -> bool:
        """`len(can_run_list) >= get_num_allocatable_reqs(...)`, before the next match:
        'pages' and 0.5.23 ('reserve-held-rows') count the rows the admitted requests
        take; 0.5.14-0.5.22 ('reserve') every admitted request against the free rows."""
        if s.cfg.admission == "reserve":
            return self.admitted >= self.rows + self.new_rows
        return self.rows <= 0

    def charge(self, s: State, req: Req, prefix: int, end: int) -> None:
        """`_update_prefill_budget`: the page-ceiled extend from the chunk and KV budgets."""
        P = s.cfg.page_size
        extend = ceil_align(end - prefix, P)
        self.reserved += _new_tokens_needed(s, prefix, end)
        self.admitted += 1
        if req.row is None:
            self.rows -= 1
            self.new_rows += 1
        if self.chunk is not None:
            self.chunk -= extend
        if counts_running_output(s):    # PrefillBudget.reserve: the page-ceiled extend and
            self.current += extend + P  # a page, and to the total max_new_tokens unless cut
            self.offset += extend + P + \
                (min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS) if end == req.seqlen else 0)


def reserves(s: State) -> bool:
    """Whether the round runs upstream's own PrefillAdder budget (`config.admission`)."""
    return s.cfg.admission != "pages"


def _admit_round(s: State, reqs: list, limit) -> list:
    """The PrefillAdder loop: the chunked request first (`add_chunked_req`), then each
    waiting request matched and admitted in order (`add_one_req`) until one is refused
    or the chunk budget is spent. Returns the batch: (req, prefix_len, extend end)."""
    if s.cfg.filter_before_prefill:
        update_running_batch(s)
    budget = _Budget(s)
    batch = []
    for i, req in enumerate(reqs):
        if _ends_before_match(s, budget):
            break
        if req.phase == "prefill":
            item = _add_chunked_req(s, req, budget, refused=limit is not None and i >= limit)
        else:
            if (reserves(s) or s.cfg.enable_priority_scheduling) and budget.rows_full(s) and \
                    not (s.cfg.enable_priority_scheduling and preempt_to_schedule(s, req, budget)):
                break           # batch_is_full, and nothing to preempt for it
            item = _add_one_req(s, req, budget, refused=limit is not None and i >= limit)
            if item is None:
                break
        if item is not None:
            batch.append(item)
            budget.charge(s, *item)
            if reserves(s):
                if req.phase != "prefill" and budget.state(s) != CONTINUE:
                    break       # add_one_req returns budget_state()
            elif item[2] < item[0].seqlen and req.phase != "prefill":
                break           # the new chunked request: rem_chunk_tokens is spent
    for victim in budget.preempted:     # the preempted re-enter the waiting queue
        enter_waiting_queue(s, victim)
    return batch


def _ends_before_match(s: State, budget: _Budget) -> bool:
    """The round's check before the next waiting request: 'pages', the chunk budget spent;
    0.5.23 ('reserve-held-rows'), `budget_state() == OTHER` (scheduler.py l.4207); 0.5.14-
    0.5.22 ('reserve') none: their loop reads the budget only from add_one_req."""
    if not reserves(s):
        return budget.spent()
    return s.cfg.admission == "reserve-held-rows" and budget.state(s) == OTHER


def preempt_to_schedule(s: State, req: Req, budget: _Budget) -> bool:
    """`PrefillAdder.preempt_to_schedule`, when the round's rows are spent: running
    requests whose priority is lower by more than the threshold, in `preemption_order`, until their remaining output
    covers what `req` needs beyond `rem_total_tokens` (its fill as last built, less its
    last match, plus max_new_tokens). Finished requests still in the batch are skipped
    (the two-phase finish: their KV is already released). True when that many were
    found: each is released as a retraction (`release_req`) and re-enters the waiting
    queue after the round; their rows count for the rest of the round."""
    short = len(req.fill) - req.prefix_len + min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS) \
        - (available_size(s) + s.evictable_size - budget.offset)
    victims = []
    for r in preemption_order(running_batch(s)):
        if req.priority - r.priority <= s.cfg.priority_scheduling_preemption_threshold:
            break
        victims.append(r.rid)
        short -= running_offset(r)
        if short <= 0:
            break
    if not victims or short > 0:
        return False
    victims = [s.reqs[rid] for rid in victims]     # this state's own copies, to change
    rows = len(s.free_rows)
    for r in victims:
        budget.offset -= running_offset(r)
        _retract(s, r)
    budget.rows += len(s.free_rows) - rows
    budget.preempted += victims
    return True


def _add_one_req(s: State, req: Req, budget: _Budget, refused: bool):
    """`init_next_round_input` (the match) and `add_one_req`: the admission lock, then the
    row, Mamba, KV (available + evictable less the round's reservations), SWA and chunk
    budgets ('reserve': upstream's own test, `_reserve_fits`); a refused request gives its
    lock back. None when it is refused."""
    prefix = _match(s, req)
    end = reserve_chunk_end(prefix, req.seqlen, budget.chunk, s.cfg.page_size) if reserves(s) \
        else chunk_end(prefix, req.seqlen, budget.chunk, s.cfg.page_size)
    if refused or end <= prefix < req.seqlen:
        _mamba_revert_cow(s, req)
        return None
    inc_lock_ref(s, req.last_node)
    was_locked, req.locked = req.locked, True   # the budget is read under the lock
    swa_tree.note_swa_lock(s, req)                # (its SWA part too: `_lock_node`)
    need = _new_tokens_needed(s, prefix, end)
    if req.row is None and budget.rows < 1 and budget.preempted and accepts(s, "U9"):
        raise ModelError(f"{NO_ROW}: req {req.rid} is admitted after preempting "
                         f"{[r.rid for r in budget.preempted]}, whose rows their session slots "
                         f"keep", upstream=(NO_ROW,))
    # FIX(U9): the rows are checked again after a preemption (a preempted streaming
    # turn's row stays with its session's slot)
    if reserves(s):
        fits = _reserve_fits(s, req, budget, prefix) and \
            not (req.row is None and budget.rows < 1 and budget.preempted)
    else:
        fits = not ((req.row is None and budget.rows < 1) or mamba_pool.mamba_short(s, req) or
                    need + budget.reserved > available_size(s) + s.evictable_size or
                    swa_tree.swa_admission_short(s, need + budget.reserved))
    if not fits:
        dec_lock_ref(s, req.last_node)
        req.locked = was_locked
        _mamba_revert_cow(s, req)
        return None
    if s.cfg.era == "borrow" and req.last_node == ("virtual", req.session):
        req.locked = False              # cache.lock(virtual node) is None: nothing held
    return req, prefix, end


def _reserve_fits(s: State, req: Req, budget: _Budget, prefix: int) -> bool:
    """`add_one_req`'s memory test under its lock (0.5.15 `schedule_policy.py`
    l.1013 and l.1035, 0.5.23 l.1404-1431 and `prefill_budget.py` l.114-131): the whole
    remaining input, the remaining output (clipped) and a page, strictly below
    `rem_total_tokens`. (A chunk cut to nothing, OTHER, was refused before the lock:
    the state after either refusal is the same.)"""
    out = min(max(req.max_new_tokens - len(req.output), 0), CLIP_MAX_NEW_TOKENS)
    total = req.seqlen - prefix + out + s.cfg.page_size
    return total < budget.remaining_total(s)


def _add_chunked_req(s: State, req: Req, budget: _Budget, refused: bool):
    """The chunked request's next round: its last chunk is checkpointed
    (`cache_unfinished_req(chunked=True)`), `init_next_round_input()` refreshes its fill
    without a match, and `add_chunked_req` sizes the chunk by what the round has left.
    'pages': None when the KV budget does not take it (it stays the chunked request);
    'reserve': always taken, cut to `min(rem_chunk_tokens, rem_total_tokens)`, or to the
    whole chunk when nothing is left (0.5.15 l.797-836, 0.5.23 l.1140-1222: "otherwise,
    it will cause a memory leak")."""
    _checkpoint_chunk(s, req)
    prefix = req.extend_end
    if refused:
        return None
    if reserves(s):
        room = min(budget.chunk, budget.remaining_total(s))
        return req, prefix, prefix + min(req.seqlen - prefix, room if room > 0 else budget.chunk)
    end = chunk_end(prefix, req.seqlen, budget.chunk, s.cfg.page_size)
    if end <= prefix or \
            _new_tokens_needed(s, prefix, end) + budget.reserved > available_size(s) + s.evictable_size:
        return None
    return req, prefix, end
