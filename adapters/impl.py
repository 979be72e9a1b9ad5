"""ImplBackend: drives impl/ (the tensor implementation) through the operation vocabulary
and maps its tensors onto the abstract state."""
from __future__ import annotations

from typing import Optional

import torch

from kvcheck.impl.checks import Snapshot, concrete_findings, leak_check, snapshot
from kvcheck.impl.mamba import mamba_refs
from kvcheck.impl.radix_cache import TreeNode
from kvcheck.impl.scheduler import Scheduler
from kvcheck.impl.streaming_session import _VirtualNode
from kvcheck.spec import ops
from kvcheck.spec.abstract import (AbstractState, NodeView, ReqView, SessionView, SlotView, build_content,
                           with_lru_ranks)
from kvcheck.spec.config import Config
from kvcheck.spec.view import node_mamba_view
from kvcheck.spec.violations import Violation


def _ceil_div(x: int, p: int) -> int:
    return -(-x // p)


class ImplBackend:
    name = "impl"

    def __init__(self, cfg: Config, device=None) -> None:
        self.cfg = cfg
        with torch.inference_mode():        # see apply()
            self.sched = self._scheduler(cfg, device)

    @staticmethod
    def _scheduler(cfg: Config, device) -> Scheduler:
        return Scheduler(
            page_size=cfg.page_size, num_pages=cfg.num_pages, num_rows=cfg.num_rows,
            max_context_len=cfg.max_context_len, chunk_size=cfg.chunk_size,
            spec_enabled=cfg.spec_enabled, overlap=cfg.overlap, era=cfg.era, device=device,
            swa_window=cfg.swa_window, swa_num_pages=cfg.swa_num_pages,
            swa_eviction_interval=cfg.swa_eviction_interval, mamba_slots=cfg.mamba_slots,
            prefill_aware_swa=cfg.prefill_aware_swa,
            mamba_extra_buffer=cfg.mamba_extra_buffer, need_sort=cfg.need_sort,
            disable_radix_cache=cfg.disable_radix_cache, mamba_tree=cfg.mamba_tree,
            accept=cfg.accept, evict_shortfall=cfg.evict_shortfall,
            enable_priority_scheduling=cfg.enable_priority_scheduling,
            preemption_threshold=cfg.priority_scheduling_preemption_threshold,
            filter_before_prefill=cfg.filter_before_prefill, admission=cfg.admission,
            debug_mode=cfg.debug_mode or None)     # off: SGLANG_DEBUG_MEMORY_POOL decides

    # -- driving -----------------------------------------------------------------------
    @torch.inference_mode()
    def apply(self, op: ops.Op) -> str:
        """One operation, under `torch.inference_mode()` as upstream's scheduler loop runs
        (`@DynamicGradMode()` on `event_loop_normal`): no autograd or version-counter
        bookkeeping per tensor op (impl/'s tensors are created under it too)."""
        s = self.sched
        if isinstance(op, ops.OpenSession):
            return s.open_session(op.sid)
        if isinstance(op, ops.SubmitTurn):
            return s.submit_turn(op.sid, op.rid, op.new_tokens, op.max_new_tokens, op.priority)
        if isinstance(op, ops.SubmitRequest):
            return s.submit_request(op.rid, op.tokens, op.max_new_tokens, op.logprob_start_len,
                                    op.priority)
        if isinstance(op, ops.Schedule):
            return s.schedule(op.rid, op.admit)
        if isinstance(op, ops.ScheduleRound):
            return s.schedule_round(op.rids, op.limit)
        if isinstance(op, ops.DecodeRound):
            return s.decode_round(op.rids)
        if isinstance(op, ops.PrefillChunk):
            return s.prefill_chunk(op.rid)
        if isinstance(op, ops.Decode):
            return s.decode(op.rid, op.token)
        if isinstance(op, ops.SpecDecode):
            return s.spec_decode(op.rid, op.drafts, op.accepted, op.token)
        if isinstance(op, ops.Finish):
            return s.finish(op.rid)
        if isinstance(op, ops.AbortQueued):
            return s.abort_queued(op.rid)
        if isinstance(op, ops.QueueReject):
            return s.queue_reject(op.rid)
        if isinstance(op, ops.PreAbort):
            return s.pre_abort(op.rid)
        if isinstance(op, ops.AbortRunning):
            return s.abort_running(op.rid)
        if isinstance(op, ops.Retract):
            return s.retract(op.rid)
        if isinstance(op, ops.CloseSession):
            return s.close_session(op.sid)
        if isinstance(op, ops.Evict):
            return s.evict(op.num_tokens)
        raise TypeError(f"ImplBackend: unknown operation {op!r}")

    # -- abstraction -------------------------------------------------------------------
    def _anchor(self, node, locked: bool = True) -> Optional[tuple]:
        """A radix anchor through which no lock is held (a queued request whose admission
        was rejected) is stale and reported as None (docs/semantics.md, abstract view)."""
        if node is None:
            return None
        if isinstance(node, _VirtualNode):
            return ("virtual", node.session_id)
        if not locked:
            return None
        if isinstance(node, TreeNode):
            if node is self.sched.radix_cache.root_node:
                return ("root",)
            return ("node", node.path())
        raise TypeError(f"unknown lock anchor {node!r}")

    def _row_pages(self, row: Optional[int], allocated: int, r2t_rows: list) -> tuple:
        if row is None or allocated <= 0:
            return ()
        P = self.cfg.page_size
        vals = r2t_rows[row]
        return tuple(vals[k * P] // P for k in range(_ceil_div(allocated, P)))

    def abstract(self) -> AbstractState:
        return self._abstract(snapshot(self.sched))

    def observe(self) -> tuple[AbstractState, list[Violation]]:
        """abstract() and concrete_violations() of the same moment, from one snapshot of
        the tensors (the checker calls this once per step)."""
        snap = snapshot(self.sched)
        return self._abstract(snap), self._concrete_violations(snap)

    def _abstract(self, snap: Snapshot) -> AbstractState:
        s = self.sched
        P = self.cfg.page_size
        rows = snap.r2t
        root = s.radix_cache.root_node
        paths = {id(n): path for n, path, _ in snap.nodes}
        nodes = []
        for n, path, vals in snap.nodes:        # sorted by path
            parent = () if n.parent is root else paths.get(id(n.parent)) or n.parent.path()
            nodes.append(NodeView(path=path, parent=parent,
                                  pages=tuple(vals[k * P] // P for k in range(len(n.key) // P)),
                                  lock_ref=n.lock_ref, **mamba_view(n)))
        # unlocked childless nodes, read off the tree (not through evict()'s own
        # candidate test, whose planted fault the eviction step is there to catch)
        nodes = with_lru_ranks(nodes, {path: n.last_access_tick for n, path, _ in snap.nodes
                                       if n.lock_ref == 0 and not n.children})
        nodes.sort(key=lambda v: v.path)
        reqs = []
        for rid in sorted(s.reqs):
            r = s.reqs[rid]
            reqs.append(ReqView(
                rid=rid, session=None if r.session is None else r.session.session_id,
                streaming=r.streaming, rejected=r.rejected, phase=r.phase,
                fill_ids=tuple(r.fill_ids), origin_len=len(r.origin_input_ids),
                max_new_tokens=r.max_new_tokens, row=r.req_pool_idx,
                committed=r.kv_committed_len, allocated=r.kv_allocated_len,
                protected=r.cache_protected_len, anchor=self._anchor(r.last_node, r.lock_held),
                locked=r.lock_held, to_finish=r.to_finish is not None, is_retracted=r.is_retracted,
                committed_freed=r.kv_committed_freed, overallocated_freed=r.kv_overallocated_freed,
                row_pages=self._row_pages(r.req_pool_idx, r.kv_allocated_len, rows),
                swa_evicted_seqlen=r.swa_evicted_seqlen, swa_evict_floor=r.swa_evict_floor,
                mamba=mamba_refs(r), swa_branching_seqlen=r.swa_branching_seqlen))
        slots = []
        for sid in sorted(s.tree_cache.slots):
            t = s.tree_cache.slots[sid]
            slots.append(SlotView(sid=sid, row=t.req_pool_idx, committed=t.kv_committed_len,
                                  allocated=t.kv_allocated_len, protected=t.cache_protected_len,
                                  last_node=self._anchor(t.last_node),
                                  row_pages=self._row_pages(t.req_pool_idx, t.kv_allocated_len, rows),
                                  swa_evicted_seqlen=t.swa_evicted_seqlen,
                                  swa_evict_floor=t.swa_evict_floor, mamba=mamba_refs(t),
                                  swa_uuid_for_lock=self._anchor(t.swa_uuid_for_lock)))
        sessions = []
        for sid in sorted(s.session_controller.sessions):
            se = s.session_controller.sessions[sid]
            sessions.append(SessionView(sid=sid, inflight=se.inflight, checkpoint=tuple(se.checkpoint()),
                                        close_pending=se.close_on_finish))
        token_of = snap.token_of

        def read(page, offset):
            v = token_of[page * P + offset]
            return None if v < 0 else v

        content = build_content(P, nodes, reqs, slots, read)
        free_pages = tuple(sorted(snap.free))
        return AbstractState(
            page_size=P, num_pages=self.cfg.num_pages, num_rows=self.cfg.num_rows,
            free_pages=free_pages, free_rows=tuple(sorted(s.req_to_token_pool.free_slots)),
            nodes=tuple(nodes), reqs=tuple(reqs), slots=tuple(slots), sessions=tuple(sessions),
            evictable_size=s.tree_cache.evictable_size(), protected_size=s.tree_cache.protected_size(),
            content=content, **self._hybrid_view(snap))

    def _hybrid_view(self, snap: Snapshot) -> dict:
        """The AbstractState's hybrid fields: the SWA pool and mapping (per full page, read
        at its first index, as `swa_page_of` reads it, from the step's snapshot), the
        Mamba allocator's free list."""
        cfg, s = self.cfg, self.sched
        if not cfg.hybrid:
            return {}
        out = dict(swa_window=cfg.swa_window, mamba_slots=cfg.mamba_slots)
        if cfg.swa_window:
            alloc, m, P = s.token_to_kv_pool_allocator, snap.swa_map, cfg.page_size
            out.update(swa_num_pages=cfg.swa_pages,
                       swa_free_pages=tuple(sorted(alloc.swa_attn_allocator.get_all_free_pages().tolist())),
                       swa_map=tuple((p, w) for p in range(1, cfg.num_pages + 1)
                                     if (w := m[p * P] // P) != 0))
        if cfg.mamba_slots:
            out.update(mamba_free=tuple(sorted(s.req_to_token_pool.mamba_allocator.free_slots.tolist())))
        return out

    # -- checks ------------------------------------------------------------------------
    def concrete_violations(self) -> list[Violation]:
        """C1..C5 on the tensors, plus impl's own leak checks (L1, L2: upstream's
        `_check_pool_invariant` and `_check_req_pool`, through impl's session_held_*
        helpers), so a defect in those helpers is caught too."""
        return self._concrete_violations(snapshot(self.sched))

    def _concrete_violations(self, snap: Snapshot) -> list[Violation]:
        return [Violation(id=f.id, name=f.name, message=f.message, owner=f.owner, page=f.page)
                for f in concrete_findings(self.sched, snap) + leak_check(self.sched)]

    def leak_violations(self) -> list[Violation]:
        """Upstream's leak checks (idle/busy accounting identity, request-pool check)."""
        return [Violation(id=f.id, name=f.name, message=f.message, owner=f.owner, page=f.page)
                for f in leak_check(self.sched)]

    def close(self) -> None:
        pass


def mamba_view(node) -> dict:
    """An impl tree node's NodeView Mamba fields (kvcheck.spec.view.node_mamba_view): here,
    not in impl/, which never imports the spec."""
    value = None if node.mamba_value is None else int(node.mamba_value.reshape(-1)[0].item())
    return node_mamba_view(value, node.mamba_lock_ref)
