"""SglangBackend's read-back: upstream's concrete state (rows, pages, tree nodes, slots,
hybrid pools) mapped onto the spec's AbstractState."""
from __future__ import annotations


from kvcheck.spec.abstract import (AbstractState, NodeView, ReqView, SessionView, SlotView,
                                   build_content, with_lru_ranks)
from kvcheck.spec.pages import ceil_div

from kvcheck.adapters.sglang import hybrid, swa_tree, swa_unified
from kvcheck.adapters.sglang.release import component_type

class ReadBack:
    """The abstract state of SglangBackend (adapters/sglang/backend.py)."""

    def _slots(self) -> dict:
        if self.api == "flat":
            return self.sess_obj.slots
        return self.sess_obj.slots

    def _slot_kv(self, slot, sid=None):
        """(row, committed, allocated, protected, last_node) of a session slot."""
        if self.api == "flat" and self.shared:
            kv = slot.kv
            row = kv.req_pool_idx if kv.holds_kv else None
            lens = self.slot_copy.get(sid) or \
                (kv.kv_committed_len, kv.kv_allocated_len, kv.cache_protected_len)
            return (row, *lens, slot.last_node)
        if self.api == "flat":
            return (slot.req_pool_idx, slot.kv_committed_len, self._allocated(slot),
                    slot.cache_protected_len, slot.last_node)
        kv = slot.kv
        return (kv.req_pool_idx if kv.holds_kv else None, kv.kv_committed_len,
                kv.kv_allocated_len, kv.cache_protected_len, self._slot_anchor_node(slot))

    def _borrowers(self) -> dict:
        """0.5.19-0.5.21: sid -> the rids of the live requests that run on that slot's record."""
        out = {}
        for sid, slot in self._slots().items():
            out[sid] = {rid for rid, L in self.live.items() if L.req.kv is slot.kv}
        return out

    def _note_slot_copies(self, restored=None, before=None) -> None:
        """0.5.19-0.5.21 keep one `ReqKvInfo` per session: the slot takes the first turn's
        record at its finish (`save_from_req`: `req.detach_kv()`) and a later turn runs on
        it from its match (`restore_to_req`: `req.kv = self.kv`) until its finish, retract
        or abort detaches it back. 0.5.14-0.5.18 (and the wrapper-era spec) keep the slot's
        lengths in the slot and copy them out to the turn at the match (`restore_to_req`,
        then `_free_tail` trims both) and back at its finish or retract (`save_from_req`),
        so while a turn runs the slot shows what it held at the turn's match. This keeps
        that view: `restored` (a request just matched) records its record's lengths for
        the slot it borrows; at the end of an operation (`before`: the borrowers when it
        began) a slot one of whose borrowers handed the record back, or that nobody
        borrows, shows its record as it is. The turn's own lengths, upstream's live record,
        are compared through the request's view; pages, rows and locks are upstream's."""
        now = self._borrowers()
        for sid, slot in self._slots().items():
            kv = slot.kv
            lens = (kv.kv_committed_len, kv.kv_allocated_len, kv.cache_protected_len)
            if restored is not None:
                if restored.kv is kv:
                    self.slot_copy[sid] = lens
                    others = sorted(rid for rid, L in self.live.items()
                                    if L.req is not restored and L.req.kv is kv)
                    if others and self._shared_with is None:    # see past_model
                        self._shared_with = (f"R1: request {int(restored.rid)} matched session "
                                             f"{sid}'s record while requests {others} hold it "
                                             "(0.5.19 shares it; the wrapper-era spec "
                                             "copies it)")
                continue
            was = (before or {}).get(sid, set()) | self._restored.get(sid, set())
            if not now[sid] or was - now[sid]:
                self.slot_copy[sid] = lens
        for sid in [sid for sid in self.slot_copy if sid not in now]:
            del self.slot_copy[sid]
        for slot in self._slots().values():     # every record a slot held (past_model)
            if not any(slot.kv is r for r in self._records):
                self._records.append(slot.kv)
        live = [L.req.kv for L in self.live.values()]
        self._records = [r for r in self._records
                         if any(r is s.kv for s in self._slots().values())
                         or any(r is k for k in live)]
        if restored is None:
            self._restored = {}
        else:                                   # `was` at the end of this operation
            for sid, slot in self._slots().items():
                if restored.kv is slot.kv:
                    self._restored.setdefault(sid, set()).add(int(restored.rid))

    def past_model(self):
        """Why the release's state is past what the spec follows of it (None: it is not).
        0.5.19-0.5.21 keep one `ReqKvInfo` per session, which the slot and the turn that
        runs on it share (`restore_to_req`: `req.kv = self.kv`); 0.5.14-0.5.18, whose
        bookkeeping the wrapper-era spec follows, copy it into and out of the turn. With
        one turn on it at a time the two designs free, keep and lock the same pages and
        rows (the slot's lengths are shown as the copy would hold them,
        `_note_slot_copies`). They part where a record is held by two live requests, by a
        request no longer attached to its slot's session, or by a request after its slot
        was released (0.5.19's `release_session` frees the record's live range and takes
        its row, `req_to_token_pool.free(slot)`, under the request still running on it):
        each needs two live turns in one session, which only accepted U1 or U2 make
        (docs/upstream-findings.md, "Releases between", R1). There a turn's decode, restore
        or release acts on the other's lengths (0.5.23's shared record, which the spec
        models in the borrow era only), so nothing is compared from there on; the
        checker counts it as beyond the accepted findings' model (`Lockstep.beyond`)."""
        if not self.shared:
            return None
        if self._shared_with is not None:
            return self._shared_with
        slots = self._slots()
        for sid, slot in slots.items():
            holders = [rid for rid, L in self.live.items() if L.req.kv is slot.kv]
            if len(holders) > 1:
                return (f"R1: session {sid}'s record is held by requests {sorted(holders)} "
                        "(0.5.19 shares it; the wrapper-era spec copies it)")
            for rid in holders:
                s = self.live[rid].req.session
                if s is None or str(s.session_id) != str(sid):
                    return (f"R1: request {rid} holds session {sid}'s record, detached from "
                            "that session")
        current = [slot.kv for slot in slots.values()]
        for rid, L in self.live.items():
            kv = L.req.kv
            if any(kv is r for r in self._records) and not any(kv is r for r in current):
                return (f"R1: request {rid} runs on the record of a session slot released "
                        "under it")
        return None

    def _slot_anchor_node(self, slot):
        lock = getattr(slot, "lock", None)
        return getattr(lock, "node", None) if lock is not None else None

    def _free_page_census(self) -> list:
        import torch
        alloc = swa_tree.full_allocator(self.alloc)
        if hasattr(alloc, "get_all_free_pages"):
            t = alloc.get_all_free_pages()
        else:
            parts = [alloc.free_pages]
            rel = getattr(alloc, "release_pages", None)
            if rel is not None and len(rel):
                parts.append(rel)
            t = torch.cat(parts)
        return [int(x) for x in t.tolist()]

    # The tree: 0.5.15 RadixCache TreeNode objects (requests point at the node object);
    # 0.5.22+ UnifiedTreeNode in a TreeCore arena (requests and TreeLocks hold NodeIds;
    # the KV indices and lock counts live in the node's per-component data, FULL here).

    def _root(self):
        return self.tree.root_node if self.radix else self.cache.tree_core.root_node

    def _nid(self, node):
        """What requests and locks use to name a tree node."""
        return id(node) if self.radix else node.id

    def _node_value(self, node):
        if self.radix:
            return node.value
        return node.component(component_type().FULL).value

    def _node_lock_ref(self, node) -> int:
        if self.radix:
            return swa_tree.lock_ref(node) if self.cfg.swa_window or self.cfg.mamba_tree \
                else int(node.lock_ref)
        return int(node.component(component_type().FULL).lock_ref)

    def _node_views(self) -> tuple[list, dict]:
        P = self.P
        root = self._root()
        out, paths = [], {self._nid(root): ()}
        stack = [root]
        while stack:
            n = stack.pop()
            for child in n.children.values():
                key = tuple(int(t) for t in child.key.raw_token_ids()) \
                    if hasattr(child.key, "raw_token_ids") else tuple(child.key)
                path = paths[self._nid(n)] + key
                paths[self._nid(child)] = path
                value = self._node_value(child)
                vals = value.tolist() if value is not None else []
                pages = tuple(int(vals[i]) // P for i in range(0, len(vals), P))
                out.append(NodeView(path=path, parent=paths[self._nid(n)], pages=pages,
                                    lock_ref=self._node_lock_ref(child),
                                    **hybrid.node_mamba(self.cfg, child)))
                stack.append(child)
        leaves, priority = self._eviction_order()
        out = with_lru_ranks(out, {paths[self._nid(n)]: priority(n) for n in leaves})
        out.sort(key=lambda v: v.path)
        return out, paths

    def _eviction_order(self):
        """(the evictable leaves, the priority evict() pops them by), both upstream's own.
        0.5.15 `RadixCache.evict` heaps `(eviction_strategy.get_priority(n), n)` over
        `evictable_leaves` (LRU: `last_access_time`; a tie falls to `TreeNode.__lt__`,
        which says neither is less: heap order). 0.5.23 `FullComponent._evict_device_start`
        heaps `(session_ref_eviction_strategy(n), n)` over the tree core's
        `evictable_device_leaves` (LRU: the `last_access_time` counter; with session radix
        caching, session-referenced nodes last)."""
        if self.api == "flat" and (self.cfg.swa_window or self.cfg.mamba_tree):
            return swa_tree.eviction_order(self.tree)
        if self.radix:
            return list(self.tree.evictable_leaves), self.tree.eviction_strategy.get_priority
        core = self.cache.tree_core
        [full] = [c for c in core.components if c.component_type == component_type().FULL]
        full._ensure_eviction_strategy()
        return list(core.evictable_device_leaves), full.session_ref_eviction_strategy

    def _req_anchor(self, node, paths: dict, sid_hint, locked: bool):
        """A radix anchor (root included) through which the request holds no lock is
        stale and reported as None (docs/semantics.md, the abstract view)."""
        a = self._anchor(node, paths, sid_hint)
        return a if locked or (a is not None and a[0] == "virtual") else None

    def _anchor(self, node, paths: dict, sid_hint):
        if node is None:
            return None
        if self.radix:
            if node is self.tree.root_node:
                return ("root",)
            if id(node) in paths:
                return ("node", paths[id(node)])
        elif isinstance(node, int):
            if node == self._root().id:
                return ("root",)
            if node in paths:
                return ("node", paths[node])
            return ("detached", f"node id {node}")
        for sid, slot in self._slots().items():
            if getattr(slot, "virtual_node", None) is node:
                return ("virtual", int(sid))
        if type(node).__name__ == "_VirtualNode" or getattr(self.cache, "is_virtual_node",
                                                            lambda n: False)(node):
            return ("virtual", sid_hint)
        return ("detached", type(node).__name__)

    def _row_pages(self, row, allocated: int) -> tuple:
        if row is None:
            return ()
        P = self.P
        vals = self.pool.req_to_token[row, : ceil_div(allocated, P) * P].tolist()
        out = []
        for k in range(ceil_div(allocated, P)):
            page = int(vals[k * P]) // P
            out.append(None if page == 0 else page)
        return tuple(out)

    def _session_views(self) -> list:
        out = []
        for sid, s in sorted(self.ctrl.sessions.items(), key=lambda kv: int(kv[0])):
            checkpoint = ()
            if s.req_nodes:
                [node] = s.req_nodes.values()
                last = node.req
                olen = s.committed_origin_len
                origin = list(last.origin_input_ids)
                if olen is not None:
                    origin = origin[:olen]
                checkpoint = tuple(origin) + tuple(
                    last.output_ids[: last.sampling_params.max_new_tokens])
            inflight = bool(getattr(s, "_inflight", False)) if hasattr(s, "_inflight") \
                else getattr(s, "_inflight_req", None) is not None
            out.append(SessionView(sid=int(sid), inflight=inflight,
                                   checkpoint=tuple(int(t) for t in checkpoint),
                                   close_pending=bool(s.close_on_finish)))
        return out

    def abstract(self) -> AbstractState:
        cfg = self.cfg
        nodes, paths = self._node_views()
        reqs = []
        for rid in sorted(self.live):
            L = self.live[rid]
            req = L.req
            committed, allocated, protected = self._lens(req)
            row = self._row(req)
            session = req.session
            sid = int(session.session_id) if session is not None else None
            reqs.append(ReqView(
                rid=rid, session=sid, streaming=L.streaming, rejected=L.rejected,
                phase=L.phase,
                fill_ids=tuple(int(t) for t in list(req.origin_input_ids) + list(req.output_ids)),
                origin_len=len(req.origin_input_ids),
                max_new_tokens=req.sampling_params.max_new_tokens, row=self._arow(row),
                committed=committed, allocated=allocated, protected=protected,
                anchor=self._req_anchor(req.last_node, paths, sid, self._locked(L)),
                locked=self._locked(L),
                to_finish=req.to_finish is not None, is_retracted=bool(req.is_retracted),
                committed_freed=bool(self._flag(req, "kv_committed_freed")),
                overallocated_freed=bool(self._flag(req, "kv_overallocated_freed")),
                row_pages=self._row_pages(row, allocated), mamba=hybrid.mamba_refs(req),
                fill=(tuple(int(t) for t in req.full_untruncated_fill_ids)
                      if cfg.aliases_token_arrays else None),
                **self._swa_fields(req)))
        slots = []
        for sid, slot in sorted(self._slots().items(), key=lambda kv: int(kv[0])):
            row, committed, allocated, protected, last_node = self._slot_kv(slot, sid)
            slots.append(SlotView(sid=int(sid), row=self._arow(row), committed=committed,
                                  allocated=allocated, protected=protected,
                                  last_node=self._anchor(last_node, paths, int(sid)),
                                  row_pages=self._row_pages(row, allocated),
                                  mamba=hybrid.mamba_refs(slot),
                                  **self._swa_fields(slot, paths)))
        P = self.P

        def read(page, offset):
            return self.shadow.get(page * P + offset)

        return AbstractState(
            page_size=P, num_pages=cfg.num_pages, num_rows=cfg.num_rows,
            free_pages=tuple(sorted(self._free_page_census())),
            free_rows=tuple(sorted(self._arow(int(r)) for r in self.pool.free_slots)),
            nodes=tuple(nodes), reqs=tuple(reqs), slots=tuple(slots),
            sessions=tuple(self._session_views()),
            evictable_size=swa_tree.tree_sizes(self.cache)[0],
            protected_size=swa_tree.tree_sizes(self.cache)[1],
            content=build_content(P, nodes, reqs, slots, read),
            **self._hybrid_view())

    def _hybrid_view(self) -> dict:
        out = hybrid.hybrid_view(self.cfg, self.pool)
        if self.cfg.swa_window:
            out.update(swa_tree.swa_view(self.cfg, self.alloc), mamba_slots=self.cfg.mamba_slots)
        return out

    def _swa_fields(self, holder, paths=None) -> dict:
        """A holder's SWA cursor and (a slot, `paths` given) its SWA lock boundary."""
        if not self.cfg.swa_window:
            return {}
        if self.api != "flat":
            out = swa_unified.swa_fields(holder)
            if paths is None:                   # a request: its pending SWA branch
                out["swa_branching_seqlen"] = swa_unified.branching_seqlen(holder)
            if paths is not None:
                node = swa_unified.uuid_node(self.cache, swa_unified.lock_uuid(
                    getattr(holder, "lock", None)))
                out["swa_uuid_for_lock"] = None if node is None else \
                    self._anchor(node.id, paths, None)
            return out
        out = swa_tree.swa_fields(self._flat_record(holder))
        if paths is not None:
            node = swa_tree.uuid_node(self.tree, getattr(holder, "swa_uuid_for_lock", None))
            out["swa_uuid_for_lock"] = None if node is None else self._anchor(node, paths, None)
        return out

    def _locked(self, L) -> bool:
        """Whether the request itself holds a tree lock. 0.5.15: the glue's record of
        the persistent admission lock. 0.5.22+: `req.lock` (a TreeLock; None once the
        session took it, or on a virtual node)."""
        return L.locked if self.api == "flat" else L.req.lock is not None

    def _arow(self, row):
        return None if row is None else int(row) - self.row_base

    def _flag(self, req, name):
        """`kv_committed_freed` / `kv_overallocated_freed`: on the request (0.5.14-0.5.15),
        on its record (0.5.22+); 0.5.16-0.5.18 have neither (a released request's `kv` is
        None, and it has left the scheduler)."""
        if self.api == "flat":
            return getattr(req, name, False)
        return getattr(req.kv, name, False)
