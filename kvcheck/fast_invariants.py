"""The explorer's fast path for the state invariants: a verdict, clean or not, read off the
spec's own `State` without building an `AbstractState`.

`spec/invariants.py` stays the reference: it says what each invariant means and it writes
every violation message. This module only answers "would `check_state(abstract(s), cfg)`
be empty?", reading the same fields `kvcheck.spec.view.abstract` reads (through plain snapshots:
no copy-on-write). The explorer asks it first; when it answers False it builds the
abstract view and runs the reference, so a report is always the reference's. So the one
obligation here is: never answer True on a state where the reference finds a violation.
tests/test_fast_invariants.py compares both verdicts on every state of `check-overlap`,
of the hybrid preset and of planted spec defects.

Covered: the ids in `COVERED` (every state invariant today, the hybrid pools' I40-I46
included). A state invariant this module does not know (one added to spec/ since) makes
`applies` false, and the explorer then asks the reference for every state.
"""
from __future__ import annotations

from kvcheck.spec.mamba_pool import mamba_refs
from kvcheck.spec.swa_pool import cursor_at_dead_lo, row_swa_held
from kvcheck.spec.state import ROOT, State

COVERED = frozenset({"I1", "I2", "I3", "I4", "I5", "I6", "I7", "I8", "I9", "I12", "I13",
                     "I14", "I15", "I17", "I20", "I22", "I24", "I26", "I27", "I29",
                     "I40", "I41", "I42", "I43", "I44", "I45", "I46"})


def applies(cfg, state_invariant_ids) -> bool:
    """Whether `state_clean` may stand for the reference: it knows every invariant."""
    return set(state_invariant_ids) <= COVERED


def _anchor_path(nodes: dict, anchor):
    """The node path a radix anchor names, () for the root, None for no radix anchor
    (None or virtual); KeyError for a dangling anchor (as `kvcheck.spec.view.anchor_view`)."""
    if anchor is None or anchor[0] != "node":
        return None
    return () if anchor[1] == ROOT else nodes[anchor[1]].path


def state_clean(s: State) -> bool:
    """True iff no state invariant of spec/invariants.py fires on `abstract(s)` (see the
    module's docstring: only valid where `applies`)."""
    try:
        return _clean(s)
    except (KeyError, IndexError, TypeError):
        return False        # a malformed state: the reference reports (or raises) it


def _clean(s: State) -> bool:
    cfg = s.cfg
    P = cfg.page_size
    n_pages = cfg.num_pages
    nodes = dict(s.nodes)
    reqs = sorted(dict(s.reqs).values(), key=lambda r: r.rid)
    slots = dict(s.slots)
    sessions = dict(s.sessions)
    rows = s.rows
    content = s.content
    free = s.free_pages
    free_set = set(free)
    if len(free_set) != len(free):                                      # I3
        return False

    # ---- the tree: I13, I14, I15, I17 (node pages), I26 (node pages), places for I2
    by_path = {}
    tree = []                   # every node but the root
    placed = {}                 # page -> count of non-free places (I2)
    total = locked = 0
    for nid, n in nodes.items():
        if nid == ROOT:
            continue
        by_path[n.path] = n
        tree.append(n)
        pages = n.pages
        if n.lock_ref < 0:                                              # I13
            return False
        size = len(pages) * P
        total += size
        if n.lock_ref > 0:
            locked += size
        seg = n.path[len(n.path) - size:]
        for k, p in enumerate(pages):
            if p in free_set:                                           # I17
                return False
            c = content.get(p)
            if c is None or c != seg[k * P:(k + 1) * P]:                # I26
                return False
            placed[p] = placed.get(p, 0) + 1
    if s.evictable_size + s.protected_size != total or s.protected_size != locked:  # I15
        return False
    for n in tree:                                                      # I14
        par = by_path.get(nodes[n.parent].path)
        if par is not None and n.lock_ref > par.lock_ref:
            return False

    # ---- holders: requests (by rid), then slots (by sid)
    anchors = []                # lock anchor paths (I13)
    holders = []                # (holder, is_slot, row pages) for every row holder
    row_req: dict = {}
    row_slot: dict = {}
    active_rows = set()
    uncached = 0
    spec_enabled = cfg.spec_enabled
    live_turns: dict = {}
    for r in reqs:
        row, ln = r.row, r.last_node
        if r.protected % P:                                             # I8
            return False
        if r.phase != "queued" and r.committed_freed != r.overallocated_freed:  # I12
            return False
        virtual = ln is not None and ln[0] == "virtual"
        if r.session is not None and r.streaming and not r.rejected:
            if r.session not in sessions:                               # I22
                return False
            live_turns[r.session] = live_turns.get(r.session, 0) + 1
        if r.locked and ln is not None and ln[0] == "node" and ln[1] != ROOT:
            anchors.append(nodes[ln[1]].path)
        if row is None:
            if r.phase != "queued" and not r.committed_freed:           # I29
                return False
            continue
        if r.committed_freed or r.overallocated_freed:                  # I12
            return False
        if row in row_req:                                              # I4
            return False
        row_req[row] = r
        t = slots.get(ln[1]) if virtual else None
        if virtual and (t is None or t.row != row):                     # I22 (and I5)
            return False
        if r.phase == "queued" and not virtual:                         # I5
            return False
        if r.phase != "queued" and not r.committed_freed:
            active_rows.add(row)
            uncached += -(-r.allocated // P) * P - r.protected
        rp = dict.__getitem__(rows, row)[:-(-r.allocated // P)]
        holders.append((r, False, rp))
        if not _row_content_ok(rp, r.committed, r.fill_ids, content, P):   # I26 on the row
            return False
        # I27: the protected prefix is the locked path
        if r.locked or virtual:
            anchor = t.last_node if virtual else ln
            if not _prefix_is_path(nodes, by_path, r, rp, anchor, P):
                return False
    for x in sessions.values():                                         # I20
        turns = live_turns.get(x.sid, 0)
        if turns > 1 or (x.inflight_rid is not None) != (turns > 0):
            return False
    held_slots = 0
    for sid, t in slots.items():
        if t.protected % P:                                             # I8
            return False
        row = t.row
        if row is None:                                                 # I24
            return False
        ln = t.last_node
        if ln is not None and ln[0] == "node" and ln[1] != ROOT:
            anchors.append(nodes[ln[1]].path)
        u = t.swa_uuid_for_lock             # the view names its node (KeyError if gone)
        if u is not None and u[0] != "virtual" and u[1] != ROOT:
            nodes[u[1]]
        if row in row_slot:                                             # I4
            return False
        row_slot[row] = t
        r = row_req.get(row)
        if r is not None and r.session != sid and r.last_node != ("virtual", sid):  # I4
            return False
        if row not in active_rows:
            held_slots += -(-t.allocated // P) * P - t.protected
        rp = dict.__getitem__(rows, row)[:-(-t.allocated // P)]
        holders.append((t, True, rp))
        x = sessions.get(sid)                                           # I26 on the slot's row
        if not _row_content_ok(rp, t.committed, x.checkpoint if x is not None else (), content, P):
            return False
        if not _prefix_is_path(nodes, by_path, t, rp, t.last_node, P):  # I27
            return False

    # ---- per holder: I6, I7, I9, I17; owned row ranges for I2
    owners: dict = {}           # row -> (protected, allocated, row pages), as row_owners
    for h, is_slot, rp in holders:
        if h.committed > h.allocated or h.protected > h.committed:      # I6, I9
            return False
        if not spec_enabled and h.committed != h.allocated:             # I7
            return False
        for k in range(-(-min(h.committed, len(rp) * P) // P)):         # I17
            if rp[k] in free_set:
                return False
        got = owners.get(h.row)
        if got is None:
            owners[h.row] = (h.protected, h.allocated, rp, (h,))
        else:
            prot = h.protected if is_slot else got[0]
            owners[h.row] = (prot, h.allocated, rp, got[3] + (h,)) if h.allocated >= got[1] \
                else (prot, got[1], got[2], got[3] + (h,))

    # ---- I1: the accounting identity
    if len(free) * P + s.evictable_size + s.protected_size + held_slots + uncached \
            != n_pages * P:
        return False

    # ---- I2: every page exactly once (free, a node, an owned row range), ids in range
    for prot, alloc, rp, _ in owners.values():
        for k in range(prot // P, -(-alloc // P)):
            p = rp[k] if k < len(rp) else None
            if p is None:
                return False
            placed[p] = placed.get(p, 0) + 1
    for p, c in placed.items():
        if c > 1 or p in free_set:
            return False
    if len(placed) + len(free_set) != n_pages:
        return False
    for p in placed:
        if not (type(p) is int and 1 <= p <= n_pages):
            return False
    for p in free_set:
        if not (type(p) is int and 1 <= p <= n_pages):
            return False

    # ---- I4: rows exclusive, in range, conserved
    free_rows = s.free_rows
    free_row_set = set(free_rows)
    if len(free_row_set) != len(free_rows):
        return False
    n_rows = cfg.num_rows
    for row in set(row_req) | set(row_slot):
        if row in free_row_set or not (type(row) is int and 0 <= row < n_rows):
            return False
    if len(free_row_set | set(row_req) | set(row_slot)) != n_rows:
        return False

    # ---- I13: lock_ref equals its live holders
    if anchors:
        for path in anchors:
            if path not in by_path:
                return False
        for n in tree:
            np_, ln_ = n.path, len(n.path)
            if n.lock_ref != sum(1 for a in anchors if a[:ln_] == np_):
                return False
    else:
        for n in tree:
            if n.lock_ref:
                return False
    if cfg.swa_window and cfg.swa_pages and not _swa_clean(s, tree, owners, free_set, P):
        return False
    if cfg.mamba_slots and not _mamba_clean(s, reqs, slots, owners, tree):
        return False
    if cfg.mamba_tree:                                                  # I46
        for n in tree:
            if n.mamba_lock_ref > n.lock_ref or \
                    n.mamba_lock_ref != sum(1 for a in anchors if a == n.path):
                return False
    return True


def _swa_clean(s: State, tree, owners: dict, free_set: set, P: int) -> bool:
    """I40-I43 (the SWA pool): its pages free or mapped from one full page each, no
    mapping of a free page or to a free SWA page, the window cursor within the committed
    KV which keeps its SWA pages from there, the SWA accounting identity."""
    n_swa = s.cfg.swa_pages
    mapping = s.full_to_swa_index_mapping
    swa_free = s.swa_free_pages
    ws = list(swa_free) + list(mapping.values())
    swa_free_set = set(swa_free)
    if len(set(ws)) != len(ws) or len(ws) != n_swa:                     # I40
        return False
    for w in ws:
        if not (type(w) is int and 1 <= w <= n_swa):
            return False
    for full, w in mapping.items():                                     # I41
        if w in swa_free_set or full in free_set:
            return False
    held = 0
    for prot, alloc, rp, hs in owners.values():                         # I42, I43
        for h in hs:
            if h.swa_evicted_seqlen > h.committed and not cursor_at_dead_lo(h, P):
                return False
        cursor = max(h.swa_evicted_seqlen for h in hs)
        committed = max(h.committed for h in hs)
        floor = max(h.swa_evict_floor for h in hs)
        for k in range(max(prot, cursor) // P, min(-(-committed // P), len(rp))):
            if rp[k] is not None and rp[k] not in mapping:
                return False
        held += row_swa_held(alloc, prot, cursor, floor, P, rp, mapping)
    in_tree = sum(P for n in tree for p in n.pages if p in mapping)
    return len(swa_free) * P + in_tree + held == n_swa * P


def _mamba_clean(s: State, reqs, slots: dict, owners: dict, tree) -> bool:
    """I44, I45 (the Mamba pool): each slot free or held by one owner (a slot and the
    request borrowing its row are one owner with one set of references; a tree node; a
    queued request's copy-on-write slot), never the sentinel or the dummy, none leaked;
    the accounting identity."""
    n_mamba = s.cfg.mamba_slots
    free = s.mamba_free_slots
    placed = list(free)
    placed += [n.mamba_value for n in tree if n.mamba_value is not None]
    placed += [m for r in reqs if r.row is None for m in mamba_refs(r) if m != -1]
    for _, _, _, hs in owners.values():                                 # I44
        refs = ()
        for h in hs:
            m = mamba_refs(h)
            if len(m) > len(refs):
                refs = m
        if not refs or refs[0] == -1:
            return False
        for h in hs:
            m = mamba_refs(h)
            if m and m != refs:
                return False
        placed += [m for m in refs if m != -1]
    if len(set(placed)) != len(placed) or len(placed) != n_mamba:
        return False
    for m in placed:
        if not (type(m) is int and 1 <= m <= n_mamba):
            return False
    rows = {r.row for r in reqs if r.row is not None}                   # I45
    in_reqs = sum(1 for r in reqs for m in mamba_refs(r) if m != -1)
    held = sum(1 for t in slots.values() if t.row not in rows for m in mamba_refs(t) if m != -1)
    in_tree = sum(1 for n in tree if n.mamba_value is not None)
    return len(free) + in_tree + in_reqs + held == n_mamba


def _row_content_ok(rp, committed: int, tokens, content: dict, P: int) -> bool:
    """I26 on a row: positions [0, committed) hold the KV of `tokens` (a request's fill ids,
    a slot's session checkpoint)."""
    for i in range(min(committed, len(rp) * P, len(tokens))):
        p = rp[i // P]
        c = content.get(p) if p is not None else None
        if (None if c is None else c[i % P]) != tokens[i]:
            return False
    return True


def _prefix_is_path(nodes, by_path, h, rp, anchor, P) -> bool:
    """I27 for one holder: its protected length is its locked path's, and its row starts
    with that path's pages."""
    if anchor is None or anchor[0] == "virtual":
        return True
    path = _anchor_path(nodes, anchor)
    pages = ()
    while path:
        n = by_path.get(path)
        if n is None:
            return False
        pages = n.pages + pages
        path = nodes[n.parent].path
    if len(pages) * P != h.protected:
        return False
    return tuple(rp[:len(pages)]) == pages
