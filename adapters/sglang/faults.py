"""Planted faults in the REAL upstream sglang code (runs inside an sglang venv).

impl/faults.py plants defects in kvcheck's own implementation; this registry plants them
in the published releases, so that the exhaustive check against a release
(`kvcheck explore --preset check-sglang-VERSION --backend sglang:VERSION`) can be shown
to catch a defect of the upstream code, not only of ours. Each fault re-creates a defect
upstream had, or that a comment in upstream's code says the code is written to avoid,
as a small monkeypatch of one upstream method: a wrapper that calls the real method
with one thing changed (an argument, a field hidden for the call, a reference put back
after it). No upstream code is copied.

Activation: KVCHECK_SGLANG_PLANT=name[,name] in the environment of the sglang process;
adapters/sglang/backend.py `process_setup` reads it once per process and calls
`install_from_env`. An unknown name, or a fault that does not apply to the installed
release, is refused (`PlantError`) naming the faults that do. The proxy keys its served
processes by (interpreter, KVCHECK_SGLANG_PLANT), so a planted run never shares a server
with a clean one (adapters/sglang/proxy.py `_server`).

Patches go on classes (never on instances), so the served backend's deep-copy fork
(SglangBackend.fork) and the fresh replay that confirms a failure both run them.
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Callable, Optional

ENV = "KVCHECK_SGLANG_PLANT"
SS = "sglang.srt.session.streaming_session"
PAGED = "sglang.srt.mem_cache.allocator.paged"


class PlantError(ValueError):
    """A planted fault that is unknown, or not applicable to the installed release."""


@dataclass(frozen=True)
class Fault:
    name: str
    releases: tuple          # sglang releases the installer knows the target of
    description: str         # one line: the defect
    source: str              # the upstream PR / comment that says why the code is as it is
    install: Callable[[str], None]   # install(version): patch the class attribute(s)


_ORIGINALS: dict = {}        # (module, class, attr) -> the upstream function, for uninstall
INSTALLED: list = []         # names installed in this process, in order


def _patch(module: str, cls: Optional[str], attr: str, make: Callable) -> None:
    """Replace module.cls.attr (cls None: the module's own attr) by make(what is there
    now). Two faults on one attribute stack, each wrapping the other; `uninstall` puts
    back the upstream original, kept from the first. Each fault is installed once
    (`install`)."""
    mod = importlib.import_module(module)
    target = mod if cls is None else getattr(mod, cls)
    current = vars(target)[attr]
    _ORIGINALS.setdefault((module, cls, attr), current)
    wrapper = make(current)
    wrapper.__kvcheck_fault__ = True
    setattr(target, attr, wrapper)


def _page_size(session) -> int:
    """StreamingSession's page size: 0.5.15 forwards it to the inner cache, 0.5.23 keeps
    the owning UnifiedRadixCache as `cache`."""
    cache = getattr(session, "cache", None)
    return cache.page_size if cache is not None else session.page_size


# -- installers ------------------------------------------------------------------------

def _free_tail_noop(version: str) -> None:
    # before PR #22862: try_match_prefix restored the slot without freeing the orphaned
    # tail [prefix_len, kv_allocated_len) that alloc_for_extend then overwrites
    _patch(SS, "StreamingSession", "_free_tail", lambda orig: lambda self, *a, **k: None)


def _preabort_restores_slot(version: str) -> None:
    # before PR #22273: find_active_slot did not look at to_finish, so a pre-aborted
    # request (input too long) restored the slot and its release overwrote session KV
    def make(orig):
        def find_active_slot(self, req):
            hidden, req.to_finish = req.to_finish, None
            try:
                return orig(self, req)
            finally:
                req.to_finish = hidden
        return find_active_slot
    _patch(SS, "StreamingSession", "find_active_slot", make)


def _free_kv_aligned_floor(version: str) -> None:
    # _free_kv_aligned's docstring: the free starts at ceil_align(target) "because
    # PagedTokenToKVPoolAllocator.free returns whole pages, so partial-page free would
    # corrupt pages still holding committed tokens". Align target down instead.
    def make(orig):
        def _free_kv_aligned(self, where, target, end):
            P = _page_size(self)
            return orig(self, where, (target // P) * P, end)
        return _free_kv_aligned
    _patch(SS, "StreamingSession", "_free_kv_aligned", make)


def _trim_overshoot_noop(version: str) -> None:
    # before PR #22897: a finishing turn kept the speculative KV past max_new_tokens (and
    # its output_ids past finished_len) in the slot: token/KV mismatch next turn
    _patch(SS, "StreamingSession", "_trim_overshoot", lambda orig: lambda self, *a, **k: None)


def _put_back(cls: str, method: str, field: str) -> None:
    """Patch SS.cls.method(self, req, ...) to give `req.<field>` its value from before the
    call back after it: the request keeps a reference the method hands over."""
    def make(orig):
        def wrapper(self, req, *args, **kwargs):
            kept = getattr(req, field)
            out = orig(self, req, *args, **kwargs)
            setattr(req, field, kept)
            return out
        wrapper.__name__ = method
        return wrapper
    _patch(SS, cls, method, make)


def _finish_keeps_req_row(version: str) -> None:
    # save_from_req (0.5.15) / req.detach_kv() (0.5.23): "Ownership has transferred to the
    # slot. Null *all* of the req's references"; release_kv_cache's early return keys on
    # it. Put the request's reference back after the session saved the turn (0.5.23: the
    # abort and non-streaming paths leave req.kv as it was, so putting it back is a no-op
    # there).
    if version == "0.5.15":
        _put_back("SessionSlot", "save_from_req", "req_pool_idx")
    else:
        _put_back("StreamingSession", "try_cache_finished_req", "kv")


def _close_keeps_tree_lock(version: str) -> None:
    # release_session drops the first turn's tree lock (0.5.15 dec_lock_ref on
    # slot.last_node, "for dec_lock_ref on session close"; 0.5.23 cache.unlock(slot.lock)).
    # Hide the lock from it: the prompt stays locked after the session is gone.
    field = "last_node" if version == "0.5.15" else "lock"

    def make(orig):
        def release_session(self, session_id):
            slot = self.slots.get(session_id)
            if slot is not None:
                setattr(slot, field, None)
            return orig(self, session_id)
        return release_session
    _patch(SS, "StreamingSession", "release_session", make)


def _lock_not_handed_over(version: str) -> None:
    # 0.5.23 _lock_to_slot: `slot.lock, req.lock = req.lock, None`, the one hand-over of the
    # admission lock to the session (take, try_checkpoint). Leave the request its copy:
    # two holders of one lock reference, released twice.
    _put_back("StreamingSession", "_lock_to_slot", "lock")


def _free_no_page_dedup(version: str) -> None:
    # PagedTokenToKVPoolAllocator.free frees unique(index // P): "freeing any index frees
    # its whole page", duplicates removed within one call (DOMAIN.md 1.1). Free the
    # indices one call each: a page is freed once per index of it.
    def make(orig):
        def free(self, free_index):
            if free_index.numel() <= 1:
                return orig(self, free_index)
            for i in range(free_index.numel()):
                orig(self, free_index[i:i + 1])
        return free
    _patch(PAGED, "PagedTokenToKVPoolAllocator", "free", make)


def _overalloc_free_floor(version: str) -> None:
    # 0.5.23 _release_overallocated_kv_indices: "start_p is aligned to the allocator's page
    # above, so it never shares a page with the tail free_kv_row in this group" (I18, the
    # boundary page freed once). Align it down instead: the page straddling the owned
    # length is freed by both calls.
    def make(orig):
        def _release_overallocated_kv_indices(req, start_p, end_p, tree_cache):
            # only where there is an overallocation to free (start_p < end_p): the
            # no-speculation assert start_p == end_p sees what upstream gives it
            if start_p < end_p:
                P = tree_cache.token_to_kv_pool_allocator.page_size
                start_p = (start_p // P) * P
            return orig(req, start_p, end_p, tree_cache)
        return _release_overallocated_kv_indices
    _patch("sglang.srt.mem_cache.common", None, "_release_overallocated_kv_indices", make)


def _session_held_counts_borrowed(version: str) -> None:
    # PR #22213 (busy double count): session_held_tokens skips slots whose row a running
    # request borrows (active_pool_idxs), which the busy check counts as uncached. Drop it.
    def make(orig):
        def session_held_tokens(self, active_pool_idxs=None):
            return orig(self, None)
        return session_held_tokens
    _patch(SS, "StreamingSession", "session_held_tokens", make)


def _restore_clears_slot(version: str) -> None:
    # 0.5.15 SessionSlot.restore_to_req's NOTE: "req_pool_idx and mamba_pool_idx are
    # intentionally NOT cleared from the slot ... Each retry calls match_prefix ->
    # restore_to_req again, so the slot must remain intact for idempotent restoration".
    # Clear the slot's row after the restore: a rejected admission's retry finds no slot.
    def make(orig):
        def restore_to_req(self, req):
            out = orig(self, req)
            self.req_pool_idx = None
            return out
        return restore_to_req
    _patch(SS, "SessionSlot", "restore_to_req", make)


def _free_tail_slot_untouched(version: str) -> None:
    # 0.5.15 _free_tail trims the slot as well as the request (kv_allocated_len =
    # prefix_len): a rejected admission's retry restores the trimmed slot. Keep the slot's
    # lengths as they were: the retry frees the same tail again.
    def make(orig):
        def _free_tail(self, slot, req, prefix_len):
            # the allocated length: on the slot (0.5.14-0.5.15), in its copy of the
            # turn's ReqKvInfo (0.5.16-0.5.18, `slot.kv`, which _free_tail trims in place)
            rec = slot.kv if getattr(slot, "kv", None) is not None else slot
            kept = (rec.kv_allocated_len, slot.kv_committed_len)
            out = orig(self, slot, req, prefix_len)
            rec.kv_allocated_len, slot.kv_committed_len = kept
            return out
        return _free_tail
    _patch(SS, "StreamingSession", "_free_tail", make)


def _close_keeps_row(version: str) -> None:
    # 0.5.15 release_session ends with `req_to_token_pool.free_slots.append(
    # slot.req_pool_idx)`: the slot's row goes back to the pool. Take it back out: the row
    # leaks with the session.
    def make(orig):
        def release_session(self, session_id):
            slot = self.slots.get(session_id)
            row = slot.req_pool_idx if slot is not None else None
            out = orig(self, session_id)
            free = self.req_to_token_pool.free_slots
            if row is not None and row in free:
                free.remove(row)
            return out
        return release_session
    _patch(SS, "StreamingSession", "release_session", make)


def _close_keeps_mamba(version: str) -> None:
    # PR #23496 (mamba leak on close): release_session ends with _free_slot_mamba(slot),
    # which gives the slot's mamba state (and its ping-pong track slots) back to the mamba
    # allocator. Skip it: the state leaks with the session.
    _patch(SS, "StreamingSession", "_free_slot_mamba", lambda orig: lambda self, slot: None)


def _ephemeral_slot_no_mamba(version: str) -> None:
    # 0.5.15 try_cache_finished_req, a first turn aborted mid-processing: the ephemeral
    # slot that release_session cleans up takes the request's mamba refs ("Also carry the
    # mamba refs over so _free_slot_mamba can return the ... slots to the mamba pool;
    # otherwise the abort orphans them"). Hide them from it: the abort orphans them.
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    def make(orig):
        def try_cache_finished_req(self, req, *args, **kwargs):
            session = getattr(req, "session", None)
            if (session is not None and session.streaming
                    and isinstance(req.finished_reason, FINISH_ABORT)
                    and session.session_id not in self.slots):
                req.mamba_pool_idx = None
                req.mamba_ping_pong_track_buffer = None
            return orig(self, req, *args, **kwargs)
        return try_cache_finished_req
    _patch(SS, "StreamingSession", "try_cache_finished_req", make)


def _close_not_deferred(version: str) -> None:
    # PR #21875 (close deferral): SessionController._close defers a streaming session's
    # close while a turn is in flight or its last request is unfinished ("An in-flight
    # request is still decoding on this session's KV memory. Freeing now would corrupt
    # the scheduler"). Hide both from it there: the session is released at once, under
    # the running turn.
    def make(orig):
        def _close(self, session_id):
            session = self.sessions[session_id]
            nodes = session.req_nodes
            busy = session.streaming and (session._inflight or any(
                not n.req.finished() for n in nodes.values()))
            if not busy:
                return orig(self, session_id)
            inflight = session._inflight
            session._inflight, session.req_nodes = False, {}
            try:
                return orig(self, session_id)
            finally:
                session._inflight, session.req_nodes = inflight, nodes
        return _close
    _patch("sglang.srt.session.session_controller", "SessionController", "_close", make)


def _split_no_lock_copy(version: str) -> None:
    # a node split gives the new upper node the child's lock count (0.5.15
    # RadixCache._split_node `new_node.lock_ref = child.lock_ref`; 0.5.23
    # FullComponent.redistribute_on_node_split): the path's lock counts are unchanged
    # (DOMAIN.md, match_prefix). Leave the upper node unlocked: a holder's path loses it.
    if version == "0.5.15":
        def make(orig):
            def _split_node(self, key, child, split_len):
                new_node = orig(self, key, child, split_len)
                new_node.lock_ref = 0
                return new_node
            return _split_node
        _patch("sglang.srt.mem_cache.radix_cache", "RadixCache", "_split_node", make)
        return

    def make23(orig):
        def redistribute_on_node_split(self, new_parent, child):
            out = orig(self, new_parent, child)
            new_parent.component_data[self.component_type].lock_ref = 0
            return out
        return redistribute_on_node_split
    _patch("sglang.srt.mem_cache.unified_cache.components.full", "FullComponent",
           "redistribute_on_node_split", make23)


# -- the scheduling round's own code (PrefillAdder, alloc_for_extend, the decode round) -----

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


BOTH = ("0.5.15", "0.5.23")

FAULTS: dict[str, Fault] = {f.name: f for f in (
    Fault("free_tail_noop", BOTH,
          "_free_tail does nothing: the slot's tail past the restored prefix leaks",
          "PR #22862 (_free_tail); try_match_prefix's comment 'Free orphaned tail'",
          _free_tail_noop),
    Fault("preabort_restores_slot", BOTH,
          "find_active_slot ignores to_finish: a pre-aborted turn restores (0.5.23: borrows) the slot",
          "PR #22273 (pre-abort corruption); find_active_slot's docstring", _preabort_restores_slot),
    Fault("free_kv_aligned_floor", BOTH,
          "_free_kv_aligned frees from floor(target) instead of ceil_align(target): a live partial page is freed",
          "_free_kv_aligned's docstring ('partial-page free would corrupt pages still holding "
          "committed tokens')", _free_kv_aligned_floor),
    Fault("trim_overshoot_noop", BOTH,
          "_trim_overshoot does nothing: speculative KV past max_new_tokens stays in the slot",
          "PR #22897 (_trim_overshoot)", _trim_overshoot_noop),
    Fault("finish_keeps_req_row", BOTH,
          "a saved turn keeps its row (0.5.15 save_from_req) / record (0.5.23 detach_kv): "
          "release_kv_cache frees what the slot owns",
          "save_from_req's comment 'Ownership has transferred to the slot. Null *all* of the "
          "req's references'; 0.5.23 Req.detach_kv", _finish_keeps_req_row),
    Fault("close_keeps_tree_lock", BOTH,
          "release_session skips the first turn's tree unlock (0.5.15 dec_lock_ref, 0.5.23 unlock)",
          "SessionSlot.last_node 'for dec_lock_ref on session close'; 0.5.23 "
          "release_session's cache.unlock(slot.lock)", _close_keeps_tree_lock),
    Fault("lock_not_handed_over", ("0.5.23",),
          "_lock_to_slot leaves req.lock set: the admission lock has two holders, released twice",
          "0.5.23 take / _lock_to_slot ('the session takes the request's record and the tree "
          "lock it took at admission')", _lock_not_handed_over),
    Fault("overalloc_free_floor", ("0.5.23",),
          "release_kv_cache frees the overallocation from floor(owned) instead of "
          "ceil_align(owned): the boundary page is freed twice",
          "0.5.23 _release_overallocated_kv_indices' comment ('start_p is aligned ... so it "
          "never shares a page with the tail free_kv_row')", _overalloc_free_floor),
    # 0.5.15 only: 0.5.23 frees rows through free_segment(s) (page representatives, its own
    # page-disjointness assert); its free() runs only when an aux allocation raises
    Fault("free_no_page_dedup", ("0.5.15",),
          "PagedTokenToKVPoolAllocator.free frees index by index: a page is freed once per index",
          "allocator free's unique(free_index // page_size) (DOMAIN.md 1.1, I18)",
          _free_no_page_dedup),
    Fault("restore_clears_slot", ("0.5.15",),
          "restore_to_req clears slot.req_pool_idx: a rejected turn's retry loses the slot's KV",
          "SessionSlot.restore_to_req's NOTE ('intentionally NOT cleared ... idempotent "
          "restoration')", _restore_clears_slot),
    Fault("free_tail_slot_untouched", ("0.5.15",),
          "_free_tail trims the request only, not the slot: a retry frees the same tail twice",
          "_free_tail's slot.kv_allocated_len = prefix_len (PR #22862)",
          _free_tail_slot_untouched),
    Fault("close_keeps_row", ("0.5.15",),
          "release_session does not give the slot's row back to the pool: the row leaks",
          "release_session's free_slots.append(slot.req_pool_idx)", _close_keeps_row),
    Fault("split_no_lock_copy", BOTH,
          "a node split leaves the new upper node unlocked: a holder's path loses its lock",
          "0.5.15 RadixCache._split_node (new_node.lock_ref = child.lock_ref); 0.5.23 "
          "FullComponent.redistribute_on_node_split", _split_no_lock_copy),
    Fault("close_not_deferred", BOTH,
          "SessionController._close releases a streaming session at once while a turn is "
          "in flight: its KV is freed under the running turn",
          "PR #21875 (close deferral); _close's comment ('Freeing now would corrupt the "
          "scheduler')", _close_not_deferred),
    Fault("close_keeps_mamba", BOTH,
          "release_session skips _free_slot_mamba: the slot's mamba state leaks with the session",
          "PR #23496 (mamba leak on close); release_session's _free_slot_mamba(slot)",
          _close_keeps_mamba),
    Fault("ephemeral_slot_no_mamba", ("0.5.15",),
          "a first turn aborted mid-processing: the ephemeral slot does not take the "
          "request's mamba refs, which the abort orphans",
          "0.5.15 try_cache_finished_req's comment ('Also carry the mamba refs over so "
          "_free_slot_mamba can return the ... slots to the mamba pool; otherwise the abort "
          "orphans them')", _ephemeral_slot_no_mamba),
    Fault("session_held_counts_borrowed", ("0.5.15",),
          "session_held_tokens ignores active_pool_idxs: a borrowed slot counted twice while busy",
          "PR #22213 (busy double count); session_held_tokens' docstring",
          _session_held_counts_borrowed),
    Fault("round_charge_leak", BOTH,
          "PrefillAdder._update_prefill_budget skips a round's first admitted request: the "
          "chunk budget leaks across the round",
          "_update_prefill_budget's docstring ('Charge one admitted request against the "
          "prefill budgets')", _round_charge_leak),
    Fault("admission_lock_dropped", BOTH,
          "add_one_req gives the admitted request's persistent tree lock back at once: its "
          "matched prefix is unlocked while it runs",
          "0.5.15 _req_inc_lock_ref; 0.5.23 _commit_prefill_admission's "
          "req.lock = tree_cache.lock(req.last_node)", _admission_lock_dropped),
    Fault("admission_pin_kept", BOTH,
          "add_one_req's temporary pin of the matched prefix (_lock_node) is taken again "
          "after the selection: the prefix stays locked after the round",
          "0.5.23 add_one_req's comment ('The temporary pin excludes this prefix from the "
          "evictable budget'); _lock_node's release in finally", _admission_pin_kept),
    Fault("retract_keeps_least_preferred", ("0.5.23",),
          "retract_decode's victim order reversed: the request with the most output is "
          "retracted first",
          "_get_decode_retraction_order's docstring ('most-preferred to least-preferred to "
          "keep. The retraction loop pops from the end')", _retract_keeps_least_preferred),
    Fault("decode_mem_one_page", BOTH,
          "new_tokens_required_next_decode counts at most one page for the batch: "
          "check_decode_mem passes while the decode batch is short",
          "new_tokens_required_next_decode's page per request whose next token starts one",
          _decode_mem_one_page),
    Fault("preempt_takes_finished", ("0.5.15",),
          "preempt_to_schedule does not skip the finished requests still in the running "
          "batch: a finished request is released a second time",
          "preempt_to_schedule's NOTE on the two-phase finish ('We must skip them here to "
          "avoid a double-free on release_req')", _preempt_takes_finished),
    Fault("preempt_oldest_first", BOTH,
          "preempt_to_schedule breaks a priority tie by the earliest queue entry: the "
          "longest-waiting running request is preempted first",
          "preempt_to_schedule's sort key (priority, -wait_queue_entry_time)",
          _preempt_oldest_first),
    Fault("extend_rows_swapped", BOTH,
          "alloc_for_extend gets the batch's rows in reverse order: each request's KV "
          "indices are written into another request's row",
          "alloc_for_extend: alloc_req_slots(...) rows in batch order, then "
          "write_cache_indices per request", _extend_rows_swapped),
)}


def requested(env: dict | None = None) -> tuple:
    """The names in KVCHECK_SGLANG_PLANT, in order, without blanks or repeats."""
    text = (os.environ if env is None else env).get(ENV, "")
    out: list = []
    for n in (x.strip() for x in text.split(",")):
        if n and n not in out:
            out.append(n)
    return tuple(out)


SAME_CODE = {"0.5.14": "0.5.15", "0.5.16": "0.5.15", "0.5.17": "0.5.15", "0.5.18": "0.5.15",
             "0.5.22": "0.5.23"}
"""A release whose patched methods are another's, as the installers know them: 0.5.14's
and 0.5.16's StreamingSession, SessionSlot, RadixCache and paged allocator methods have
0.5.15's names and arguments (0.5.16's slot keeps its allocated length in `slot.kv`, which
`free_tail_slot_untouched` reads there; so do 0.5.17's and 0.5.18's), 0.5.22's have
0.5.23's. `python -m benchmarks.bench_sglang_faults --versions V`: 12 of 12 caught on each
of 0.5.14 and 0.5.16-0.5.18, 9 of 9 on 0.5.22 (adapters/sglang/README.md); the clean
release passes every scope. Those runs predate `close_keeps_mamba` and
`ephemeral_slot_no_mamba`, which need a scope whose session slot holds Mamba state:
0.5.16-0.5.18's presets have none."""


def code_of(version: str) -> str:
    """The release whose code a fault's `releases` and installer name for `version`."""
    return SAME_CODE.get(version, version)


def applicable(version: str) -> list:
    return sorted(n for n, f in FAULTS.items() if code_of(version) in f.releases)


def validate(names, version: str) -> None:
    for n in names:
        if n not in FAULTS:
            raise PlantError(f"{ENV}: unknown planted fault {n!r}; known for sglang {version}: "
                             f"{', '.join(applicable(version))}")
        if code_of(version) not in FAULTS[n].releases:
            raise PlantError(f"{ENV}: planted fault {n!r} does not apply to sglang {version} "
                             f"(only {', '.join(FAULTS[n].releases)}); known for {version}: "
                             f"{', '.join(applicable(version))}")


def install(names, version: str) -> tuple:
    """Validate, then install each named fault once (idempotent); the names installed."""
    validate(names, version)
    for n in names:
        if n not in INSTALLED:
            FAULTS[n].install(code_of(version))
            INSTALLED.append(n)
    return tuple(INSTALLED)


def install_from_env(version: str) -> tuple:
    return install(requested(), version)


def uninstall() -> None:
    """Put every patched upstream attribute back (in-process tests)."""
    for (module, cls, attr), orig in _ORIGINALS.items():
        mod = importlib.import_module(module)
        setattr(mod if cls is None else getattr(mod, cls), attr, orig)
    _ORIGINALS.clear()
    INSTALLED.clear()
