"""The spec's own state mapped onto the AbstractState (the same view adapters produce)."""
from __future__ import annotations

from kvcheck.spec.abstract import (AbstractState, NodeView, ReqView, SessionView, SlotView, build_content,
                           with_lru_ranks)
from kvcheck.spec.mamba_pool import mamba_refs
from kvcheck.spec.pages import ceil_div
from kvcheck.spec.state import ROOT, State
from kvcheck.spec.radix_cache import evictable_leaves, node_path


def anchor_view(s: State, anchor, locked: bool = True):
    """("root",), ("node", path), ("virtual", sid) or None. A radix anchor of a request
    that holds no lock through it is stale (the next schedule matches again; the node
    may be evicted meanwhile) and is reported as None."""
    if anchor is None:
        return None
    if anchor[0] == "virtual":
        return anchor
    if not locked:
        return None
    if anchor[1] == ROOT:
        return ("root",)
    return ("node", node_path(s, anchor[1]))


def _row_pages(s: State, row, allocated: int) -> tuple:
    if row is None:
        return ()
    return tuple(dict.__getitem__(s.rows, row)[:ceil_div(allocated, s.cfg.page_size)])


def abstract(s: State) -> AbstractState:
    cfg = s.cfg
    tree = dict(s.nodes)            # reads through plain snapshots: no copy-on-write
    nodes = tuple(sorted(
        with_lru_ranks((NodeView(n.path, tree[n.parent].path, n.pages, n.lock_ref,
                                 **node_mamba_view(n.mamba_value, n.mamba_lock_ref))
                        for n in tree.values() if n.id != ROOT),
                       {n.path: n.tick for n in evictable_leaves(s)}),
        key=lambda v: v.path))
    reqs = tuple(
        ReqView(rid=r.rid, session=r.session, streaming=r.streaming, rejected=r.rejected,
                phase=r.phase, fill_ids=r.fill_ids, origin_len=len(r.origin),
                max_new_tokens=r.max_new_tokens, row=r.row, committed=r.committed,
                allocated=r.allocated, protected=r.protected,
                anchor=anchor_view(s, r.last_node, r.locked), locked=r.locked, to_finish=r.to_finish,
                is_retracted=r.is_retracted, committed_freed=r.committed_freed,
                overallocated_freed=r.overallocated_freed,
                row_pages=_row_pages(s, r.row, r.allocated),
                swa_evicted_seqlen=r.swa_evicted_seqlen, swa_evict_floor=r.swa_evict_floor,
                mamba=mamba_refs(r), swa_branching_seqlen=r.swa_branching_seqlen,
                fill=r.fill if cfg.aliases_token_arrays else None)
        for r in sorted(dict(s.reqs).values(), key=lambda r: r.rid))
    slots = tuple(
        SlotView(sid=sid, row=t.row, committed=t.committed, allocated=t.allocated,
                 protected=t.protected, last_node=anchor_view(s, t.last_node),
                 row_pages=_row_pages(s, t.row, t.allocated),
                 swa_evicted_seqlen=t.swa_evicted_seqlen, swa_evict_floor=t.swa_evict_floor,
                 mamba=mamba_refs(t),
                 swa_uuid_for_lock=anchor_view(s, t.swa_uuid_for_lock))
        for sid, t in sorted(dict(s.slots).items()))
    sessions = tuple(
        SessionView(sid=sid, inflight=x.inflight_rid is not None, checkpoint=x.checkpoint,
                    close_pending=x.close_pending)
        for sid, x in sorted(dict(s.sessions).items()))

    def read(page, offset):
        c = s.content.get(page)
        return None if c is None else c[offset]

    return AbstractState(
        page_size=cfg.page_size, num_pages=cfg.num_pages, num_rows=cfg.num_rows,
        free_pages=tuple(s.free_pages), free_rows=tuple(sorted(s.free_rows)),
        nodes=nodes, reqs=reqs, slots=slots, sessions=sessions,
        evictable_size=s.evictable_size, protected_size=s.protected_size,
        content=build_content(cfg.page_size, nodes, reqs, slots, read),
        **hybrid_view(s))


def node_mamba_view(value, lock_ref: int) -> dict:
    """A node's NodeView Mamba fields (config.mamba_tree); {} for a node with neither, so
    views without a Mamba tree are unchanged."""
    if value is None and not lock_ref:
        return {}
    return dict(mamba=() if value is None else (value,), mamba_lock_ref=lock_ref)


def hybrid_view(s: State) -> dict:
    """The AbstractState's hybrid fields of the spec state (empty when hybrid is off)."""
    cfg = s.cfg
    if not cfg.hybrid:
        return {}
    return dict(swa_window=cfg.swa_window, swa_num_pages=cfg.swa_pages if cfg.swa_window else 0,
                swa_free_pages=tuple(s.swa_free_pages),
                swa_map=tuple(sorted(s.full_to_swa_index_mapping.items())),
                mamba_slots=cfg.mamba_slots, mamba_free=tuple(sorted(s.mamba_free_slots)))
