"""Symmetry reduction: `state_key` renames page, row, session and request ids canonically
before hashing, so that states equal up to renaming are visited once."""
from __future__ import annotations

import itertools
from typing import Optional

from kvcheck.spec import swa_tree
from kvcheck.spec.state import ROOT, State

# ---------------------------------------------------------------------------
# canonical state key (symmetry reduction)
# ---------------------------------------------------------------------------

def _b(x) -> int:
    return 1 if x else 0


SIGNATURE_ORDER = hash
"""How state_key orders sessions and requests by their id-free signatures. hash() is
fast but, on Python 3.11, hashes None by address, so the representative a key names can
differ between processes (never the reduction's soundness); repr is the same in every
process (tests comparing state sets across processes set it)."""


def req_sig(r) -> tuple:
    """A request's id-free signature in `state_key`: every field the spec reads, its ids,
    row and anchor node left to the caller (which labels them)."""
    ln = r.last_node
    if ln is None:
        anc = 0
    elif ln[0] == "virtual":
        anc = 1
    elif r.locked:
        anc = 2
    else:
        anc = 3
    return (r.streaming, r.rejected, r.origin, tuple(r.output), r.max_new_tokens, r.phase,
            r.row is None, r.committed, r.allocated, r.protected, anc, r.locked, r.to_finish,
            r.finished_reason, r.finished_len, r.committed_freed, r.overallocated_freed,
            r.is_retracted, r.extend_end, r.logprob_start,
            # priority scheduling: preemption reads these before any match
            (r.priority, r.entered, len(r.fill), r.prefix_len) if r.entered else None)


def state_key(s: State, symmetric: bool = True) -> tuple:
    """A hashable key such that two states with the same key have the same future up to
    renaming of page, row, session and request ids.

    Included: every field the spec reads, with ids renamed: tree nodes by key path (node
    ids are not observable), their pages, lock_ref and the *rank* of their access tick
    (eviction order is (tick, path); new ticks always exceed old ones, so only the order
    matters); the allocator's free pages as a multiset (the allocator takes the lowest
    free page, but free pages nothing else names are interchangeable); free rows as a
    multiset (same argument); each held row's page ids on row-pages [0, ceil(allocated/P))
    of its holders; the KV content of every page that is not unreferenced-and-free; every
    request, slot and session field.

    Left out, as dead data no step reads before writing it: row entries at or past a
    holder's allocated length and the entries of free rows (a row is rewritten when it is
    handed out); `req.prefix_pages` and `req.prefix_len` (written by the match of the
    same `schedule` that reads them; under priority scheduling preemption reads the last
    match's length and the fill's before the match, and they are kept); a request's radix `last_node` when it holds no lock
    through it (a rejected admission: the next schedule matches again; only "is it None"
    is read, by the pre_abort guard); `next_node_id` and the global tick.

    Requests and sessions are ordered by an id-free signature (sessions first, with the
    signatures of their requests), pages and rows by first appearance in a fixed walk
    (nodes by path, then rows of requests, then of slots). Ties between entities with
    equal signatures may leave two isomorphic states with different keys (less reduction,
    never a wrong merge). symmetric=False keeps every id as it is (no reduction)."""
    P = s.cfg.page_size
    reqs = dict(s.reqs)             # plain snapshots: reading copies nothing (kvcheck.spec.state.CowMap)
    sessions = dict(s.sessions)
    slots = dict(s.slots)

    # ---- sessions and requests
    sid_set = set(sessions)
    sid_set.update(slots)
    for r in reqs.values():
        if r.session is not None:
            sid_set.add(r.session)
        ln = r.last_node
        if ln is not None and ln[0] == "virtual":
            sid_set.add(ln[1])

    rsig = {}
    for rid, r in reqs.items():
        rsig[rid] = req_sig(r)
    if symmetric and len(sid_set) <= 1 and len(reqs) <= 1:
        sid_l = dict.fromkeys(sid_set, 1)
        rid_order = list(reqs)
        rid_l = dict.fromkeys(rid_order, 1)
    elif symmetric:
        def sess_sig(sid):
            x = sessions.get(sid)
            t = slots.get(sid)
            order = SIGNATURE_ORDER
            att = sorted(order(rsig[r.rid]) for r in reqs.values() if r.session == sid)
            return order((None if x is None else (x.inflight_rid is not None, x.checkpoint,
                                                 x.close_pending),
                         None if t is None else (t.row is None, t.committed, t.allocated,
                                                 t.protected, t.last_node is None),
                         tuple(att)))
        sid_order = sorted(sid_set, key=sess_sig) if len(sid_set) > 1 else list(sid_set)
        sid_l = {sid: i + 1 for i, sid in enumerate(sid_order)}
        rid_order = sorted(reqs, key=lambda rid: SIGNATURE_ORDER((rsig[rid],
                                                                  sid_l.get(reqs[rid].session))))
        rid_l = {rid: i + 1 for i, rid in enumerate(rid_order)}
    else:
        sid_l = {sid: sid for sid in sorted(sid_set)}
        rid_order = sorted(reqs)
        rid_l = {rid: rid for rid in rid_order}

    # ---- nodes (path, pages, lock_ref, tick rank), then rows of requests and slots
    nodes = s.nodes
    node_key, pages = _tree_key(nodes, symmetric)
    row_alloc: dict = {}
    for r in reqs.values():
        if r.row is not None:
            row_alloc[r.row] = max(row_alloc.get(r.row, 0), r.allocated)
    for t in slots.values():
        if t.row is not None:
            row_alloc[t.row] = max(row_alloc.get(t.row, 0), t.allocated)
    rows: dict = {}
    row_keys = []
    srows = s.rows

    def rl(row):
        if row is None:
            return None
        v = rows.get(row)
        if v is None:
            v = rows[row] = (len(rows) if symmetric else row)
            held = dict.__getitem__(srows, row)[:-(-row_alloc[row] // P)]
            if symmetric:
                lab = []
                for p in held:
                    if p is not None:
                        q = pages.get(p)
                        if q is None:
                            q = pages[p] = len(pages) + 1
                        p = q
                    lab.append(p)
                row_keys.append((v, tuple(lab)))
            else:
                for p in held:
                    if p is not None:
                        pages[p] = p
                row_keys.append((v, tuple(held)))
        return v

    def anchor(ln, locked):
        if ln is None:
            return None
        if ln[0] == "virtual":
            return ("v", sid_l.get(ln[1]))
        if not locked:
            return ("stale",)
        n = dict.get(nodes, ln[1])
        return ("gone", ln[1]) if n is None else ("n", n.path)

    req_key = []
    for rid in rid_order:
        r = reqs[rid]
        req_key.append((rid_l[rid], sid_l.get(r.session), rsig[rid], rl(r.row),
                        anchor(r.last_node, r.locked)))
    # loops, not generator expressions, where rl and anchor are called: a closure that a
    # generator captures is held by the scope it closes over in the Cython build (one
    # scope object per function), a reference cycle per call that the paused collector
    # never frees (tests/test_compiled.py counts them)
    slot_key = []
    for sid, t in (sorted(slots.items(), key=lambda x: sid_l[x[0]]) if len(slots) > 1
                   else slots.items()):
        slot_key.append((sid_l[sid], rl(t.row), t.committed, t.allocated, t.protected,
                         anchor(t.last_node, True)))
    sess_key = tuple(
        (sid_l[sid], None if x.inflight_rid is None else rid_l.get(x.inflight_rid, ("dead",)),
         x.checkpoint, x.close_pending)
        for sid, x in (sorted(sessions.items(), key=lambda x: sid_l[x[0]]) if len(sessions) > 1
                       else sessions.items()))

    content = s.content
    if symmetric:               # map and zip: no per-call comprehension frames
        free_key = tuple(sorted(map(pages.get, s.free_pages, itertools.repeat(0))))
        content_key = tuple(zip(pages.values(), map(content.get, pages)))
        free_rows = tuple(sorted(map(rows.get, s.free_rows, itertools.repeat(-9))))
    else:
        free_key = tuple(s.free_pages)
        content_key = tuple(sorted(content.items()))
        free_rows = tuple(s.free_rows)
    key = (node_key, tuple(req_key), tuple(slot_key), sess_key, tuple(row_keys), content_key,
           free_key, free_rows, s.evictable_size, s.protected_size)
    if s.cfg.enable_priority_scheduling:
        return key + (s.unfiltered,)
    return key + (_hybrid_key(s, pages, rid_l, sid_l),) if s.cfg.hybrid else key


def _tree_key(tree, symmetric: bool) -> tuple:
    """The tree's part of `state_key`: (node key, the page labels it gave, as a fresh dict
    the caller extends). Nodes by path with their pages, lock_ref and tick rank; pages
    labelled by first appearance. Kept on the node map (`CowMap._memo`): a successor
    whose step touched no node shares its parent's map and reuses it, so the key of such
    a successor costs nothing for the tree."""
    memo = tree._memo
    if memo is not None and memo[0] is symmetric:
        return memo[1], dict(memo[2])
    node_list = sorted(((n.path, n) for nid, n in dict.items(tree) if nid != ROOT),
                       key=_first)
    trank = {t: i for i, t in enumerate(sorted({n.tick for _, n in node_list}))}
    pages: dict = {}
    if symmetric:
        for _, n in node_list:
            for p in n.pages:
                if p is not None and p not in pages:
                    pages[p] = len(pages) + 1
        get = pages.get
        node_key = tuple((pth, tuple(get(p) for p in n.pages), n.lock_ref, trank[n.tick])
                         for pth, n in node_list)
    else:
        for _, n in node_list:
            for p in n.pages:
                if p is not None:
                    pages[p] = p
        node_key = tuple((pth, tuple(n.pages), n.lock_ref, trank[n.tick])
                         for pth, n in node_list)
    tree._memo = (symmetric, node_key, pages)
    return node_key, dict(pages)


def _first(x):
    return x[0]


def _hybrid_key(s: State, pages: dict, rid_l: dict, sid_l: dict) -> tuple:
    """The hybrid fields (spec/swa_pool.py, spec/swa_tree.py, spec/mamba_pool.py) under the
    same renaming: SWA pages by the full page that maps to them, Mamba slots by first
    appearance; a page nothing else labels keeps its id (less reduction, never a wrong
    merge)."""
    swa = {}
    smap = tuple(sorted((pages.get(f, ("id", f)), swa.setdefault(w, len(swa) + 1))
                        for f, w in sorted(s.full_to_swa_index_mapping.items(),
                                           key=lambda x: repr(pages.get(x[0], ("id", x[0]))))))
    mamba = {-1: -1}
    tree = ()
    if s.cfg.mamba_tree:                # per node: its state (labelled first), Mamba lock, LRU rank
        held = sorted((n.path, n) for n in dict.values(s.nodes) if n.mamba_value is not None
                      or n.mamba_lock_ref)
        mrank = {t: i for i, t in enumerate(sorted({n.mamba_tick for _, n in held}))}
        tree = tuple((pth, None if n.mamba_value is None else mamba.setdefault(n.mamba_value, len(mamba)),
                      n.mamba_lock_ref, mrank[n.mamba_tick]) for pth, n in held)
    if swa_tree.swa_lru_on(s):         # 0.5.23's SWA LRU: each SWA holder's rank
        live = sorted((n.path, n.swa_tick) for n in dict.values(s.nodes)
                      if n.id and swa_tree.swa_tokens(s, n))
        srank = {t: i for i, t in enumerate(sorted({t for _, t in live}))}
        tree += tuple((pth, srank[t]) for pth, t in live)
    reqs = tuple((rid_l[rid], r.swa_evicted_seqlen, r.decode_batch_idx,
                  _uuid_path(s, r.swa_uuid_for_lock), _mamba_labels(r, mamba), r.swa_evict_floor,
                  r.swa_branching_seqlen)
                 for rid, r in sorted(dict.items(s.reqs), key=lambda x: rid_l[x[0]]))
    slots = tuple((sid_l[sid], t.swa_evicted_seqlen, _uuid_path(s, t.swa_uuid_for_lock),
                   _mamba_labels(t, mamba), t.swa_evict_floor)
                  for sid, t in sorted(dict.items(s.slots), key=lambda x: sid_l[x[0]]))
    return (smap, len(s.swa_free_pages), reqs, slots, len(s.mamba_free_slots),
            s.forward_iter % s.cfg.swa_eviction_interval) + ((tree,) if tree else ())


def _mamba_labels(holder, mamba: dict) -> tuple:
    """A request's or slot's Mamba slots (pool index, then track buffer), labelled by first
    appearance in `mamba` (module level, not a closure: see state_key's loops)."""
    return tuple(mamba.setdefault(m, len(mamba)) for m in
                 (() if holder.mamba_pool_idx is None else (holder.mamba_pool_idx,))
                 + tuple(holder.mamba_ping_pong_track_buffer or ()))


def _uuid_path(s: State, a) -> Optional[tuple]:
    return None if a is None else _path_of(s, a[1])


def _path_of(s: State, nid: int) -> tuple:
    from kvcheck.spec.model import node_path
    return node_path(s, nid) if nid in s.nodes else ("gone", nid)
