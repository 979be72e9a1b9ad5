"""impl/ StreamingSession: DOMAIN.md 2.8, 2.9, 2.10 examples with exact numbers."""
import torch

from kvcheck.impl.device import resolve_device
from kvcheck.impl.scheduler import Scheduler
from kvcheck.impl.schedule_batch import FINISH_ABORT, Req
from kvcheck.impl.streaming_session import SessionSlot, _VirtualNode

DEV = resolve_device()


class FreeSpy:
    """Records every allocator.free call (as lists of KV indices)."""

    def __init__(self, alloc):
        self.calls = []
        self._free = alloc.free

        def free(x):
            if x.numel():
                self.calls.append(x.tolist())
            self._free(x)
        alloc.free = free


def setup_row(s: Scheduler, req: Req, n: int) -> list:
    """Give req a row and n fresh KV indices in positions [0, n)."""
    s.req_to_token_pool.alloc([req])
    a = s.token_to_kv_pool_allocator
    out = a.alloc(n) if a.page_size == 1 else a.alloc_extend(
        torch.tensor([0]), torch.tensor([n]), torch.tensor([-1]), n)
    s.req_to_token_pool.write(req.req_pool_idx, 0, out)
    return out.tolist()


def test_trim_overshoot_p1_exact():
    """P = 1, origin 26, finished_len 12, committed 40, allocated 44, output 14:
    frees positions 38..43, everything becomes 38, output truncated to 12."""
    s = Scheduler(page_size=1, num_pages=64, num_rows=2, device=DEV)
    req = Req(1, list(range(26)), 20)
    req.output_ids = [5] * 14
    kv = setup_row(s, req, 44)
    req.kv_committed_len, req.kv_allocated_len = 40, 44
    spy = FreeSpy(s.token_to_kv_pool_allocator)
    s.tree_cache._trim_overshoot(req, 12)
    assert spy.calls == [kv[38:44]]
    assert (req.kv_committed_len, req.kv_allocated_len, len(req.output_ids)) == (38, 38, 12)


def test_free_tail_p4_keeps_partial_page():
    """P = 4, committed 7, allocated 12, prefix 5: frees positions 8..11 only; slot and
    request become 5/5; positions 5..7 stay attached in row-page 1."""
    s = Scheduler(page_size=4, num_pages=8, num_rows=2, device=DEV)
    req = Req(1, list(range(9)), 4)
    kv = setup_row(s, req, 12)
    slot = SessionSlot(1, req.req_pool_idx, 7, 12)
    spy = FreeSpy(s.token_to_kv_pool_allocator)
    s.tree_cache._free_tail(slot, req, 5)
    assert spy.calls == [kv[8:12]]
    assert (slot.kv_committed_len, slot.kv_allocated_len) == (5, 5)
    assert (req.kv_allocated_len,) == (5,)
    assert s.token_to_kv_pool_allocator.available_size() == 8 * 4 - 12 + 4


def _session_with(s: Scheduler, sid=1):
    s.open_session(sid)
    return s.session_controller.sessions[sid]


def test_first_mid_abort_nukes_ephemeral_slot():
    """P = 1, allocated 20, protected 0: frees exactly 0..19; free_slots == [0]; no slot;
    both flags set."""
    s = Scheduler(page_size=1, num_pages=32, num_rows=1, device=DEV)
    sess = _session_with(s)
    req = sess.create_req(7, list(range(1, 20)), 4)
    kv = setup_row(s, req, 20)
    req.kv_committed_len = req.kv_allocated_len = 20
    req.last_node = s.radix_cache.root_node
    req.finished_reason = FINISH_ABORT
    spy = FreeSpy(s.token_to_kv_pool_allocator)
    s.tree_cache.cache_finished_req(req)
    assert spy.calls == [kv[0:20]]
    assert s.req_to_token_pool.free_slots == [0]
    assert s.tree_cache.slots == {}
    assert req.kv_committed_freed and req.kv_overallocated_freed and req.req_pool_idx is None
    assert not sess.inflight


def test_nth_mid_abort_frees_max_allocated_in_one_call():
    """Slot 50/50, request 60/65: frees 0..64 in one call; the slot is deleted."""
    s = Scheduler(page_size=1, num_pages=80, num_rows=1, max_context_len=80, device=DEV)
    sess = _session_with(s)
    req = sess.create_req(3, list(range(1, 61)), 8)
    kv = setup_row(s, req, 65)
    slot = SessionSlot(1, req.req_pool_idx, 50, 50)
    s.tree_cache.slots[1] = slot
    req.kv_committed_len, req.kv_allocated_len = 60, 65
    req.last_node = slot.virtual_node
    req.finished_reason = FINISH_ABORT
    spy = FreeSpy(s.token_to_kv_pool_allocator)
    s.tree_cache.cache_finished_req(req)
    assert spy.calls == [kv[0:65]]
    assert s.tree_cache.slots == {} and s.req_to_token_pool.free_slots == [0]
    assert req.kv_committed_freed and req.kv_overallocated_freed
    assert not sess.inflight


def test_preabort_detaches_and_preserves_slot():
    s = Scheduler(page_size=1, num_pages=32, num_rows=2, device=DEV)
    sess = _session_with(s)
    slot = SessionSlot(1, 0, 10, 12, cache_protected_len=0)
    s.tree_cache.slots[1] = slot
    s.req_to_token_pool.free_slots.remove(0)
    stub = sess.create_req(5, [1, 2], 3)          # no turn in flight: a real turn
    stub.to_finish = FINISH_ABORT
    assert s.tree_cache.find_active_slot(stub) is None
    assert stub.session is None and not sess.inflight
    assert (slot.req_pool_idx, slot.kv_committed_len, slot.kv_allocated_len) == (0, 10, 12)


def test_restore_is_idempotent_and_keeps_slot():
    s = Scheduler(page_size=4, num_pages=8, num_rows=2, device=DEV)
    sess = _session_with(s)
    turn = sess.create_req(2, [9] * 20, 3)
    kv = setup_row(s, turn, 16)
    slot = SessionSlot(1, turn.req_pool_idx, 15, 16)
    s.tree_cache.slots[1] = slot
    turn.req_pool_idx = None
    spy = FreeSpy(s.token_to_kv_pool_allocator)
    key = turn.fill_ids[:19]
    r1 = s.tree_cache.match_prefix(turn, key)
    r2 = s.tree_cache.match_prefix(turn, key)
    assert r1[0].tolist() == r2[0].tolist() == kv[:15]
    assert isinstance(r1[1], _VirtualNode) and spy.calls == []
    assert slot.req_pool_idx == turn.req_pool_idx == 0
