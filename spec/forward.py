"""The batches' forwards: `prepare_for_extend` and the prefill result (chunks, the borrow
era's slot hand-over and checkpoints), the decode steps (single, round, speculative) and
`retract_decode`.
"""
from __future__ import annotations

from kvcheck.spec import mamba_pool, mamba_tree, swa_pool
from kvcheck.spec.allocator import REUSED_ROW_014, REUSED_ROW_019, _write_kv, available_size
from kvcheck.spec.caching import (_alloc_decode, _alloc_extend, cache_unfinished_req_inner,
                                  evict_from_tree_cache)
from kvcheck.spec.finish import (_abort_queued, _check_finished, _finished, _retract,
                                 enter_waiting_queue, retraction_order, update_running_batch)
from kvcheck.spec.pages import chunk_end
from kvcheck.spec.radix_cache import evict_mamba
from kvcheck.spec.sessions import _is_streaming, accepts, release_kv_cache
from kvcheck.spec.state import Req, Slot, State
from kvcheck.spec.token_arrays import refresh_fill
from kvcheck.spec.violations import ModelError

SAMPLED_TOKEN = 1
"""The token the prefill forward samples (the first output token)."""


def _checkpoint_chunk(s: State, req: Req) -> None:
    """Before a chunked request's next chunk: `cache_unfinished_req(chunked=True)`
    (borrow era: `checkpoint_kv_cache`), then `init_next_round_input()` (no re-match)."""
    if s.cfg.era == "borrow":
        _checkpoint_borrow(s, req)
    elif not _is_streaming(req):
        cache_unfinished_req_inner(s, req)      # cache_unfinished_req(chunked=True)
    refresh_fill(s, req)


PREFILL_OOM = "Prefill out of memory"
"""`alloc_paged_token_slots_extend` / `alloc_token_slots` when the batch's extend does not
fit after the eviction (0.5.15 `mem_cache/common.py` l.389, 0.5.23 `allocation.py` l.239):
the scheduler raises. The 'pages' admission never lets it happen; under 'reserve' the
chunked request always continues, whatever is free."""


def _prepare_for_extend(s: State, batch: list) -> None:
    """`ScheduleBatch.init_new(can_run_list).prepare_for_extend()` -> `alloc_for_extend`
    for the whole batch: `alloc_req_slots` (rows; a held row is reused), one eviction for
    the batch's extend tokens (+ a page a request when P > 1), one allocation taking each
    request's pages in batch order, `write_cache_indices`; then per request the forward's
    KV, committed = allocated = the extend end, and the session hook
    (`maybe_hand_to_session`, borrow era)."""
    for req, prefix, _ in batch:
        req.is_retracted = False
        if req.row is None:
            req.row = s.free_rows.pop(0)
            s.rows[req.row][:prefix // s.cfg.page_size] = req.prefix_pages
        elif not (req.committed > 0):
            raise ModelError(f"ReqToTokenPool.alloc: req {req.rid} reuses row {req.row} "
                             f"with kv_committed_len=0 and no chunk in flight",
                             upstream=(REUSED_ROW_014, REUSED_ROW_019))
        if mamba_tree.on(s):            # `allocation.ensure_mamba_capacity` (0.5.23),
            short = mamba_tree.alloc_req_slots_evict(s) if mamba_tree.wrapper_rules(s) else \
                mamba_pool.mamba_needed(s, req) - len(s.mamba_free_slots)   # `alloc_req_slots`
            if short > 0:
                evict_mamba(s, short)
        mamba_pool.alloc_mamba(s, req)
    P = s.cfg.page_size
    evict_from_tree_cache(s, sum(end - prefix for _, prefix, end in batch)
                          + (len(batch) * P if P > 1 else 0))
    for req, prefix, end in batch:
        if not _alloc_extend(s, req.row, prefix, end, evict=False):
            raise ModelError(f"{PREFILL_OOM} (alloc_for_extend after admission, req {req.rid})",
                             upstream=(PREFILL_OOM,))
    for req, prefix, end in batch:
        _write_kv(s, req.row, prefix, end, req.fill)     # the forward's input: get_fill_ids()
        req.committed = req.allocated = req.extend_end = end
        swa_pool.set_swa_evict_floor(s, req)
        if s.cfg.era == "borrow":
            _take(s, req)


def _process_prefill_result(s: State, batch: list) -> None:
    """`process_batch_result_prefill`, in batch order: a request whose prompt is done
    samples its first token (or finishes); the chunked request waits for its next round."""
    for req, _, end in batch:
        req.phase = "prefill"
        if end == req.seqlen:
            _prefill_done(s, req)


def _take(s: State, req: Req) -> None:
    """Borrow era `StreamingSession.take` (alloc_for_extend's maybe_hand_to_session): a
    streaming turn's first row allocation hands its record and admission lock to a new
    slot that publishes the prompt; the turn borrows the record from then on."""
    if not _is_streaming(req):
        return
    slot = s.slots.get(req.session)
    if slot is not None:
        if slot.row != req.row and accepts(s, "U7"):
            raise ModelError(f"StreamingSession.take: session_id={str(req.session)!r} already "
                             f"has a slot (req {req.rid} matched before its session's turn "
                             f"took it in this round)", upstream=("already has a slot",))
        return          # FIX(U7): a request not on its session's slot leaves it alone
    s.slots[req.session] = Slot(row=req.row, committed=req.committed, allocated=req.allocated,
                                protected=req.protected,
                                last_node=req.last_node if req.locked else None, publishes=True,
                                swa_uuid_for_lock=req.swa_uuid_for_lock if req.locked else None)
    mamba_pool.move_mamba(s.slots[req.session], req, clear_src=False)  # one record: Mamba refs too
    req.locked = False
    req.last_node = ("virtual", req.session)


def _checkpoint_borrow(s: State, req: Req) -> None:
    """Borrow era `checkpoint_kv_cache` (after a chunk and after the prefill): a plain
    request publishes into the tree; a turn publishes only while its slot publishes the
    prompt (`try_checkpoint`: the slot's lock goes to the insert and comes back moved)."""
    slot = s.slots.get(req.session) if _is_streaming(req) else None
    if slot is None:
        cache_unfinished_req_inner(s, req)
        return
    if not slot.publishes:
        return
    req.last_node, req.locked = slot.last_node, slot.last_node is not None
    slot.last_node = None
    cache_unfinished_req_inner(s, req)
    slot.last_node, req.locked = req.last_node, False
    slot.swa_uuid_for_lock = req.swa_uuid_for_lock      # the SWA boundary moves with the lock
    req.last_node = ("virtual", req.session)
    slot.protected = req.protected


def _sync_borrowed(s: State, acting=()) -> None:
    """Borrow era: a turn runs on its slot's record (`req.kv is slot.kv`), so the slot's
    lengths are the turn's while it borrows it. Two turns on one slot (only after an
    accepted U1) share that one record: the operation's own turns (`acting`: their rids)
    wrote it last, or, if that turn no longer borrows it (finished, retracted), the slot
    holds what it wrote. A
    turn detached from its session after it borrowed (a second `finish_req` under
    accepted U2) still holds the record: its virtual anchor names the slot."""
    borrowers = []
    for rid, r in list(dict.items(s.reqs)):     # read first: only borrowers are copied
        sid = r.last_node[1] if r.last_node and r.last_node[0] == "virtual" else None
        slot = dict.get(s.slots, sid)
        if slot is not None and r.row is not None and r.row == slot.row:
            r, slot = s.reqs[rid], s.slots[sid]
            if r.rid in acting:
                slot.committed, slot.allocated, slot.protected = r.committed, r.allocated, r.protected
                swa_pool.sync_borrowed(slot, r, acting=True)
            borrowers.append((r, slot))
    for r, slot in borrowers:
        r.committed, r.allocated, r.protected = slot.committed, slot.allocated, slot.protected
        swa_pool.sync_borrowed(slot, r, acting=False)


def _prefill_done(s: State, req: Req) -> None:
    """The last chunk's result: a pre-aborted request finishes; otherwise a token is
    sampled. If that token reaches max_new_tokens, `check_finished` finishes the
    request right here, before any `cache_unfinished_req`: a first turn then hands the
    slot its admission lock and match length (DOMAIN.md 4.3). Otherwise
    `cache_unfinished_req(req)` publishes the prompt."""
    if req.to_finish:
        _finished(s, req, "abort")
        release_kv_cache(s, req)
        del s.reqs[req.rid]
        return
    req.output.append(SAMPLED_TOKEN)
    if len(req.output) >= req.max_new_tokens:
        _check_finished(s, req)
        return
    if s.cfg.era == "borrow":
        _checkpoint_borrow(s, req)
    elif not (_is_streaming(req) and req.session in s.slots):
        cache_unfinished_req_inner(s, req)
    req.phase = "decode"


def _prefill_chunk(s: State, req: Req) -> str:
    _checkpoint_chunk(s, req)
    prefix = req.extend_end
    end = chunk_end(prefix, req.seqlen, s.cfg.chunk_size, s.cfg.page_size)
    if not _alloc_extend(s, req.row, prefix, end, mamba_evict=mamba_tree.wrapper_rules(s)):
        return "oom"
    _write_kv(s, req.row, prefix, end, req.fill)     # the forward's input: get_fill_ids()
    req.committed = req.allocated = req.extend_end = end
    swa_pool.set_swa_evict_floor(s, req)
    if end == req.seqlen:
        _prefill_done(s, req)
    return "ok"


def _decode(s: State, req: Req, token: int) -> str:
    pos = req.committed
    if not _alloc_decode(s, req.row, pos):
        return "oom"
    update_running_batch(s)
    swa_pool.free_swa_out_of_window_slots(s, req)
    swa_pool.decode_batch_done(req)
    _write_kv(s, req.row, pos, pos + 1, req.fill_ids)
    req.committed += 1
    req.allocated = max(req.allocated, req.committed)
    req.output.append(token)
    _check_finished(s, req)
    return "ok"


def _decode_round(s: State, reqs: list) -> str:
    """`update_running_batch` then the decode step over the batch (`reqs`, batch order):
    `check_decode_mem` (it evicts what the step needs), on a shortfall `retract_decode`;
    `prepare_for_decode` (`alloc_for_decode` of the whole batch: one eviction, then a
    page for each request whose next token starts one); the forward writes each last
    token's KV; `process_batch_result_decode` appends the sampled token and finishes the
    requests at max_new_tokens, in batch order. "ok", or "oom" when a request had to be
    retracted or aborted."""
    update_running_batch(s)
    out = "ok"
    if not _check_decode_mem(s, reqs):
        reqs = _retract_decode(s, reqs)
        out = "oom"
    P = s.cfg.page_size
    evict_from_tree_cache(s, len(reqs) * P)
    for req in reqs:
        if not _alloc_decode(s, req.row, req.committed, evict=False):
            raise ModelError(f"alloc_for_decode failed after check_decode_mem for req {req.rid}")
    for req in reqs:
        pos = req.committed
        _write_kv(s, req.row, pos, pos + 1, req.fill_ids)
        req.committed += 1
        req.allocated = max(req.allocated, req.committed)
        req.output.append(SAMPLED_TOKEN)
    for req in reqs:
        _check_finished(s, req)
    return out


def new_tokens_required_next_decode(s: State, reqs: list) -> int:
    """`ScheduleBatch.new_tokens_required_next_decode` (no speculative decoding): a page
    for each request whose next token starts one."""
    P = s.cfg.page_size
    return sum(P for r in reqs if r.committed % P == 0)


def _check_decode_mem(s: State, reqs: list) -> bool:
    """`check_decode_mem` (`check_decode_capacity`): evict what the step needs, then
    whether it fits."""
    need = new_tokens_required_next_decode(s, reqs)
    evict_from_tree_cache(s, need)
    return available_size(s) >= need


def _retract_decode(s: State, reqs: list) -> list:
    """`retract_decode` (0.5.15 `schedule_batch.py` l.2470-2530, 0.5.23 l.3451-3540): at
    least one victim, then more until the rest fits; the last request is kept, and
    aborted when even it does not fit. Returns the batch left, in batch order."""
    kept = retraction_order(reqs)
    first = True
    while first or not _check_decode_mem(s, kept):
        if len(kept) == 1:
            break
        first = False
        victim = kept.pop()
        _retract(s, victim)
        enter_waiting_queue(s, victim)
    if len(kept) <= 1 and not _check_decode_mem(s, kept):
        last = kept.pop()               # FINISH_ABORT, released as a retraction (release_req),
        _retract(s, last)               # never re-queued: it leaves as a queued abort does
        _abort_queued(s, last)
    left = {r.rid for r in kept}
    return [r for r in reqs if r.rid in left]


def _spec_decode(s: State, req: Req, drafts: int, accepted: int, token: int) -> str:
    need = req.committed + 2 * (drafts + 1)
    if need > req.allocated:
        if not _alloc_extend(s, req.row, req.allocated, need):
            return "oom"
        req.allocated = need
    update_running_batch(s)
    swa_pool.free_swa_out_of_window_slots(s, req)
    swa_pool.decode_batch_done(req)
    req.output.extend([token] * (accepted + 1))
    start = req.committed
    req.committed += accepted + 1
    _write_kv(s, req.row, start, req.committed, req.fill_ids)
    _check_finished(s, req)
    return "ok"
