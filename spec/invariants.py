"""Named invariants, evaluated on an AbstractState (from the spec or from any system).

Ids follow DOMAIN.md section 3 where it has one (I1..I25); I26+ are kvcheck's own.
Each check returns Violations that name the owner, the page and the numbers; none
raises. State invariants take (state, cfg); step invariants take
(before, op, outcome, after) and cover what one state cannot show.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable

from kvcheck.spec import ops as O
from kvcheck.spec.abstract import AbstractState
from kvcheck.spec.config import Config
from kvcheck.spec.swa_pool import cursor_at_dead_lo, row_swa_held
from kvcheck.spec.pages import ceil_align, ceil_div
from kvcheck.spec.violations import Violation


@dataclass(frozen=True)
class Invariant:
    id: str
    name: str
    check: Callable


STATE_INVARIANTS: list[Invariant] = []
STEP_INVARIANTS: list[Invariant] = []


def invariant(id_: str, name: str, step: bool = False):
    def deco(fn):
        (STEP_INVARIANTS if step else STATE_INVARIANTS).append(Invariant(id_, name, fn))
        fn.inv_id, fn.inv_name = id_, name
        return fn
    return deco


def _v(fn, message, owner=None, page=None) -> Violation:
    return Violation(fn.inv_id, fn.inv_name, message, owner, page)


def _req(r) -> str:
    return f"req {r.rid}"


def _slot(t) -> str:
    return f"slot of session {t.sid}"


def _holders(s: AbstractState):
    """Every (owner name, view) that holds a row: requests and slots."""
    out = [(_req(r), r) for r in s.reqs if r.row is not None]
    out += [(_slot(t), t) for t in s.slots if t.row is not None]
    return out


def _active(r) -> bool:
    """In last_batch/running_batch with KV not yet released (the busy check's set)."""
    return r.phase in ("prefill", "decode") and r.row is not None and not r.committed_freed


def _node_by_path(s: AbstractState) -> dict:
    return {n.path: n for n in s.nodes}


def _path_pages(nodes: dict, path: tuple):
    """Pages along the root path to the node `path`, or None if a node is missing."""
    out = []
    while path:
        n = nodes.get(path)
        if n is None:
            return None
        out[:0] = n.pages
        path = n.parent
    return tuple(out)


def row_owners(s: AbstractState) -> dict:
    """row -> (owner names, protected, allocated) where the row's owned pages are
    row-pages [protected/P, ceil(allocated/P)): a slot and the request that borrowed its
    row are one owner (DOMAIN.md 1.7); the larger allocated counts."""
    rows: dict = {}
    for name, h in _holders(s):
        names, prot, alloc, pages = rows.get(h.row, ([], None, 0, ()))
        if name.startswith("slot") or prot is None:
            prot = h.protected
        if h.allocated >= alloc:
            alloc, pages = h.allocated, h.row_pages
        rows[h.row] = (names + [name], prot, alloc, pages)
    return rows


# ---------------------------------------------------------------------------
# state invariants
# ---------------------------------------------------------------------------

@invariant("I3", "no double free")
def no_double_free(s: AbstractState, cfg: Config):
    return [_v(no_double_free, f"page {p} is in the free lists {n} times", "allocator", p)
            for p, n in sorted(Counter(s.free_pages).items()) if n > 1]


@invariant("I17", "a page holding committed KV is never free")
def live_page_not_free(s: AbstractState, cfg: Config):
    P, free, out = s.page_size, set(s.free_pages), []
    for name, h in _holders(s):
        seen = set()
        for i in range(min(h.committed, len(h.row_pages) * P)):
            p = h.row_pages[i // P]
            if p in free and p not in seen:
                seen.add(p)
                out.append(_v(live_page_not_free,
                              f"row position {i} (< kv_committed_len {h.committed}) lies in page "
                              f"{p}, which is in the free list", name, p))
    for n in s.nodes:
        for p in n.pages:
            if p in free:
                out.append(_v(live_page_not_free, "a tree node's page is in the free list",
                              f"node {list(n.path)}", p))
    return out


_FREE_LIST = "free list"


def _place(x) -> str:
    """A place a page is found in, as I2 names it."""
    if x is _FREE_LIST:
        return x
    if x[0] == "node":
        return f"node {list(x[1])}"
    return f"{x[1]} (row-page {x[2]})"


@invariant("I2", "page exclusivity and conservation")
def page_exclusivity(s: AbstractState, cfg: Config):
    P, out = s.page_size, []
    places: dict = {}       # page -> its places, named by _place() only when reported
    for p in s.free_pages:
        places.setdefault(p, []).append(_FREE_LIST)
    for n in s.nodes:
        for p in n.pages:
            places.setdefault(p, []).append(("node", n.path))
    for row, (names, prot, alloc, pages) in sorted(row_owners(s).items(), key=lambda x: repr(x[0])):
        owner = " / ".join(names)
        for k in range(prot // P, ceil_div(alloc, P)):
            p = pages[k] if k < len(pages) else None
            if p is None:
                out.append(_v(page_exclusivity, f"row-page {k} of row {row} (allocated {alloc}) "
                              "holds no page", owner))
                continue
            places.setdefault(p, []).append(("row", owner, k))
    n_pages, suspects = s.num_pages, ()
    for p, where in places.items():     # the usual case: nothing to report, nothing named
        if not (type(p) is int and 1 <= p <= n_pages) or len(where) > 1 and \
                any(x is not _FREE_LIST for x in where):
            suspects = places
            break
    for p, where in sorted(suspects.items() if suspects else (), key=lambda x: repr(x[0])):
        where = [_place(x) for x in where]
        if p == 0:
            out.append(_v(page_exclusivity, f"reserved page 0 is in use: {where}", where[0], 0))
        elif not (isinstance(p, int) and 1 <= p <= s.num_pages):
            out.append(_v(page_exclusivity, f"page id out of range 1..{s.num_pages}: {where}",
                          where[0], p))
        elif len(where) > 1 and set(where) != {"free list"}:
            out.append(_v(page_exclusivity, f"page owned {len(where)} times: {', '.join(where)}",
                          where[0], p))
    for p in range(1, s.num_pages + 1):
        if p not in places:
            out.append(_v(page_exclusivity, "page is in no free list, tree node or owned range "
                          "(leaked)", None, p))
    return out


@invariant("I1", "accounting identity available + evictable + protected + session_held + uncached == total")
def accounting_identity(s: AbstractState, cfg: Config):
    P = s.page_size
    available = len(s.free_pages) * P
    active_rows = {r.row for r in s.reqs if _active(r)}
    uncached = sum(ceil_align(r.allocated, P) - r.protected for r in s.reqs if _active(r))
    held = sum(ceil_align(t.allocated, P) - t.protected for t in s.slots
               if t.row is not None and t.row not in active_rows)
    total = s.num_pages * P
    got = available + s.evictable_size + s.protected_size + held + uncached
    if got != total:
        return [_v(accounting_identity,
                   f"available {available} + evictable {s.evictable_size} + protected "
                   f"{s.protected_size} + session_held {held} + uncached {uncached} = {got} "
                   f"!= total {total} (off by {got - total})")]
    return []


@invariant("I4", "row exclusivity and conservation")
def row_exclusivity(s: AbstractState, cfg: Config):
    out = []
    for row, n in sorted(Counter(s.free_rows).items()):
        if n > 1:
            out.append(_v(row_exclusivity, f"row {row} is in free_slots {n} times", "req_to_token_pool"))
    free = set(s.free_rows)
    held: dict = {}
    for name, h in _holders(s):
        held.setdefault(h.row, []).append((name, h))
    slot_sid = {t.row: t.sid for t in s.slots if t.row is not None}
    for row, hs in held.items():
        names = [n for n, _ in hs]
        if row in free:
            out.append(_v(row_exclusivity, f"row {row} is free and held by {', '.join(names)}", names[0]))
        reqs = [h for n, h in hs if n.startswith("req")]
        slots = [h for n, h in hs if n.startswith("slot")]
        if len(reqs) > 1 or len(slots) > 1:
            out.append(_v(row_exclusivity, f"row {row} held by {', '.join(names)}", names[0]))
        elif reqs and slots and reqs[0].session != slot_sid[row] and \
                reqs[0].anchor != ("virtual", slot_sid[row]):
            out.append(_v(row_exclusivity, f"row {row} of {names[1]} is held by {names[0]}, "
                          "which is not that session's turn", names[0]))
        if not (isinstance(row, int) and 0 <= row < s.num_rows):
            out.append(_v(row_exclusivity, f"row id {row} out of range", names[0]))
    for row in range(s.num_rows):
        if row not in free and row not in held:
            out.append(_v(row_exclusivity, f"row {row} is neither free nor held (leaked)", None))
    return out


@invariant("I5", "a queued request holds a row only as its session slot's borrower")
def queued_row(s: AbstractState, cfg: Config):
    slots = {t.sid: t for t in s.slots}
    out = []
    for r in s.reqs:
        if r.phase == "queued" and r.row is not None:
            sid = r.anchor[1] if r.anchor and r.anchor[0] == "virtual" else None
            t = slots.get(sid)
            if t is None or t.row != r.row:
                out.append(_v(queued_row, f"queued request holds row {r.row} that no slot of its "
                              f"session lends it (anchor {r.anchor})", _req(r)))
    return out


@invariant("I6", "kv_committed_len <= kv_allocated_len")
def committed_le_allocated(s: AbstractState, cfg: Config):
    return [_v(committed_le_allocated, f"kv_committed_len {h.committed} > kv_allocated_len {h.allocated}", n)
            for n, h in _holders(s) if h.committed > h.allocated]


@invariant("I7", "without speculative decoding, committed == allocated")
def committed_eq_allocated(s: AbstractState, cfg: Config):
    if cfg.spec_enabled:
        return []
    return [_v(committed_eq_allocated, f"kv_committed_len {h.committed} != kv_allocated_len {h.allocated}", n)
            for n, h in _holders(s) if h.committed != h.allocated]


@invariant("I8", "cache_protected_len is page-aligned")
def protected_aligned(s: AbstractState, cfg: Config):
    out = [_v(protected_aligned, f"cache_protected_len {r.protected} % page_size {s.page_size} != 0", _req(r))
           for r in s.reqs if r.protected % s.page_size]
    out += [_v(protected_aligned, f"cache_protected_len {t.protected} % page_size {s.page_size} != 0", _slot(t))
            for t in s.slots if t.protected % s.page_size]
    return out


@invariant("I9", "cache_protected_len <= kv_committed_len for every row holder")
def protected_le_committed(s: AbstractState, cfg: Config):
    return [_v(protected_le_committed, f"cache_protected_len {h.protected} > kv_committed_len {h.committed}", n)
            for n, h in _holders(s) if h.protected > h.committed]


@invariant("I12", "released flags agree for running requests")
def freed_flags(s: AbstractState, cfg: Config):
    out = []
    for r in s.reqs:
        if r.phase in ("prefill", "decode") and r.committed_freed != r.overallocated_freed:
            out.append(_v(freed_flags, f"kv_committed_freed={r.committed_freed} "
                          f"kv_overallocated_freed={r.overallocated_freed}", _req(r)))
        if r.row is not None and (r.committed_freed or r.overallocated_freed):
            out.append(_v(freed_flags, f"holds row {r.row} after its KV was released", _req(r)))
    return out


@invariant("I13", "lock_ref equals its live holders, never negative")
def lock_ref_holders(s: AbstractState, cfg: Config):
    nodes = _node_by_path(s)
    anchors = [(_req(r), r.anchor[1]) for r in s.reqs
               if r.locked and r.anchor and r.anchor[0] == "node"]
    anchors += [(_slot(t), t.last_node[1]) for t in s.slots if t.last_node and t.last_node[0] == "node"]
    out = []
    for name, path in anchors:
        if path not in nodes:
            out.append(_v(lock_ref_holders, f"lock anchor {list(path)} is not in the tree", name))
    for n in s.nodes:
        holders = [name for name, path in anchors if path[:len(n.path)] == n.path]
        if n.lock_ref != len(holders) or n.lock_ref < 0:
            out.append(_v(lock_ref_holders, f"lock_ref {n.lock_ref} but {len(holders)} live holder(s)"
                          f"{': ' + ', '.join(holders) if holders else ''}", f"node {list(n.path)}"))
    return out


@invariant("I14", "lock_ref(parent) >= lock_ref(child)")
def lock_ref_monotone(s: AbstractState, cfg: Config):
    nodes = _node_by_path(s)
    return [_v(lock_ref_monotone, f"lock_ref {n.lock_ref} > parent's {nodes[n.parent].lock_ref}",
               f"node {list(n.path)}")
            for n in s.nodes if n.parent in nodes and n.lock_ref > nodes[n.parent].lock_ref]


@invariant("I15", "evictable_size + protected_size match the tree's keys")
def tree_sizes(s: AbstractState, cfg: Config):
    P = s.page_size
    total = sum(len(n.pages) * P for n in s.nodes)
    locked = sum(len(n.pages) * P for n in s.nodes if n.lock_ref > 0)
    out = []
    if s.evictable_size + s.protected_size != total:
        out.append(_v(tree_sizes, f"evictable {s.evictable_size} + protected {s.protected_size} "
                      f"!= {total} tokens in the tree", "radix cache"))
    if s.protected_size != locked:
        out.append(_v(tree_sizes, f"protected_size {s.protected_size} != {locked} tokens in locked "
                      "nodes", "radix cache"))
    return out


@invariant("I20", "at most one in-flight turn per session, and _inflight says so")
def single_inflight(s: AbstractState, cfg: Config):
    out = []
    live: dict = {}
    for r in s.reqs:
        if r.session is not None and r.streaming and not r.rejected:
            live.setdefault(r.session, []).append(r.rid)
    for x in s.sessions:
        turns = live.get(x.sid, [])
        if len(turns) > 1:
            out.append(_v(single_inflight, f"{len(turns)} turns in flight: reqs {turns}",
                          f"session {x.sid}"))
        if x.inflight != bool(turns):
            what = (f"turn req {turns[0]} is in flight" if turns else "no turn is in flight")
            out.append(_v(single_inflight, f"_inflight={x.inflight} but {what}", f"session {x.sid}"))
    return out


@invariant("I22", "a running turn's session and borrowed slot are never released under it")
def borrowed_slot_alive(s: AbstractState, cfg: Config):
    slots = {t.sid: t for t in s.slots}
    sessions = {x.sid for x in s.sessions}
    out = []
    for r in s.reqs:
        if r.anchor and r.anchor[0] == "virtual" and r.row is not None:
            t = slots.get(r.anchor[1])
            if t is None or t.row != r.row:
                out.append(_v(borrowed_slot_alive, f"borrows row {r.row} of session {r.anchor[1]}'s "
                              f"slot, which {'is gone' if t is None else f'holds row {t.row}'}", _req(r)))
        if r.session is not None and r.streaming and not r.rejected and r.session not in sessions:
            out.append(_v(borrowed_slot_alive, f"session {r.session} was closed while this turn "
                          "is in flight", _req(r)))
    return out


@invariant("I24", "a slot present holds KV")
def slot_holds_kv(s: AbstractState, cfg: Config):
    return [_v(slot_holds_kv, "slot exists with req_pool_idx None", _slot(t)) for t in s.slots if t.row is None]


@invariant("I29", "a running request holds its row until its KV is released")
def running_holds_row(s: AbstractState, cfg: Config):
    """The converse of I23: a request in a running batch (phase prefill or decode) whose KV
    `release_kv_cache` has not released reads and writes `req_to_token[req_pool_idx]` on its
    next step, so it must hold a row (its own, or its session slot's)."""
    return [_v(running_holds_row, f"{r.phase} request with req_pool_idx None while its KV is "
               "not released (kv_committed_freed False)", _req(r))
            for r in s.reqs if r.phase != "queued" and r.row is None and not r.committed_freed]


@invariant("I26", "KV content matches the tokens it stands for")
def kv_content(s: AbstractState, cfg: Config):
    P, content, out = s.page_size, s.content_map(), []
    for n in s.nodes:
        seg = n.path[len(n.path) - len(n.pages) * P:]
        for k, p in enumerate(n.pages):
            got = content.get(p)
            want = seg[k * P:(k + 1) * P]
            if got is None or tuple(got) != tuple(want):
                out.append(_v(kv_content, f"holds KV of {got} for key tokens {want}",
                              f"node {list(n.path)}", p))
    for r in s.reqs:
        if r.row is not None:
            bad = _row_content_mismatch(r.row_pages, r.committed, r.fill_ids, content, P)
            if bad:
                i, got, p = bad
                out.append(_v(kv_content, f"row position {i} holds KV of token {got}, the request's "
                              f"token is {r.fill_ids[i]} (kv_committed_len {r.committed})", _req(r), p))
    checkpoint = {x.sid: x.checkpoint for x in s.sessions}
    for t in s.slots:
        tokens = checkpoint.get(t.sid, ())
        bad = _row_content_mismatch(t.row_pages, t.committed, tokens, content, P)
        if bad:
            i, got, p = bad
            out.append(_v(kv_content, f"row position {i} holds KV of token {got}, the session's "
                          f"token is {tokens[i]} (the slot's kv_committed_len {t.committed})",
                          _slot(t), p))
    return out


def _row_content_mismatch(row_pages, committed: int, tokens, content: dict, P: int):
    """The first row position in [0, committed) whose KV is not of its token: (position,
    the token its KV is of, page), or None. A request's row against its fill ids, a slot's
    against the session's checkpoint."""
    for i in range(min(committed, len(row_pages) * P, len(tokens))):
        p = row_pages[i // P]
        c = content.get(p)
        got = None if c is None else c[i % P]
        if got != tokens[i]:
            return i, got, p
    return None


@invariant("I27", "a row's protected prefix is the locked tree path")
def protected_prefix_is_path(s: AbstractState, cfg: Config):
    P, nodes, out = s.page_size, _node_by_path(s), []
    slots = {t.sid: t for t in s.slots}

    def check(name, h, anchor):
        if anchor is None or anchor[0] == "virtual":
            return
        path = () if anchor[0] == "root" else anchor[1]
        pages = _path_pages(nodes, path)
        if pages is None:
            out.append(_v(protected_prefix_is_path, f"anchor {list(path)} is not in the tree", name))
        elif len(pages) * P != h.protected:
            out.append(_v(protected_prefix_is_path, f"cache_protected_len {h.protected} != locked path "
                          f"length {len(pages) * P}", name))
        elif h.row is not None and tuple(h.row_pages[:len(pages)]) != pages:
            k = next(i for i, (a, b) in enumerate(zip(h.row_pages, pages)) if a != b) \
                if len(h.row_pages) >= len(pages) else len(h.row_pages)
            out.append(_v(protected_prefix_is_path, f"row-page {k} is "
                          f"{h.row_pages[k] if k < len(h.row_pages) else None}, the tree path has "
                          f"{pages[k]}", name, pages[k]))

    for r in s.reqs:
        if r.row is not None and (r.locked or r.anchor and r.anchor[0] == "virtual"):
            anchor = r.anchor
            if anchor and anchor[0] == "virtual" and anchor[1] in slots:
                anchor = slots[anchor[1]].last_node
            check(_req(r), r, anchor)
    for t in s.slots:
        check(_slot(t), t, t.last_node)
    return out


# ---------------------------------------------------------------------------
# hybrid models (spec/swa_pool.py, spec/mamba_pool.py), I40-I45: the SWA pool and the Mamba pool. Each returns [] when
# its pool is off (swa_num_pages / mamba_slots 0), so non-hybrid runs are unchanged.
# ---------------------------------------------------------------------------

def _window_start(h, P: int) -> int:
    """The first row-page whose SWA KV the holder still needs: from its cursor, never
    the tree-owned prefix."""
    return max(h.protected, h.swa_evicted_seqlen) // P


@invariant("I40", "SWA pages exclusive and conserved")
def swa_pages_conserved(s: AbstractState, cfg: Config):
    if not s.swa_num_pages:
        return []
    out, places = [], {}
    for w in s.swa_free_pages:
        places.setdefault(w, []).append("SWA free list")
    for full, w in s.swa_map:
        places.setdefault(w, []).append(f"full page {full}")
    for w, where in sorted(places.items(), key=lambda x: repr(x[0])):
        if not (isinstance(w, int) and 1 <= w <= s.swa_num_pages):
            out.append(_v(swa_pages_conserved, f"SWA page id out of range 1..{s.swa_num_pages}: "
                          f"{', '.join(where)}", where[0], w))
        elif len(where) > 1:
            out.append(_v(swa_pages_conserved, f"SWA page held {len(where)} times: "
                          f"{', '.join(where)}", where[0], w))
    for w in range(1, s.swa_num_pages + 1):
        if w not in places:
            out.append(_v(swa_pages_conserved, "SWA page is neither free nor mapped from a full "
                          "page (leaked)", "SWA allocator", w))
    return out


@invariant("I41", "no full-to-SWA mapping entry of a free page or pointing at a free SWA page")
def swa_mapping_live(s: AbstractState, cfg: Config):
    if not s.swa_num_pages:
        return []
    free, swa_free, out = set(s.free_pages), set(s.swa_free_pages), []
    for full, w in s.swa_map:
        if w in swa_free:
            out.append(_v(swa_mapping_live, f"full_to_swa_index_mapping[{full}] = {w}, a free SWA "
                          "page", "full_to_swa_index_mapping", full))
        if full in free:
            out.append(_v(swa_mapping_live, f"free full page {full} still maps to SWA page {w}",
                          "full_to_swa_index_mapping", full))
    return out


@invariant("I42", "the SWA window cursor stays within the committed KV, which keeps its SWA KV from there")
def swa_window_cursor(s: AbstractState, cfg: Config):
    if not s.swa_num_pages:
        return []
    P, mapped, out = s.page_size, {f for f, _ in s.swa_map}, []
    for name, h in _holders(s):
        if h.swa_evicted_seqlen > h.committed and not cursor_at_dead_lo(h, P):
            out.append(_v(swa_window_cursor, f"swa_evicted_seqlen {h.swa_evicted_seqlen} > "
                          f"kv_committed_len {h.committed}", name))
    for row, (names, prot, cursor, committed, pages, _) in sorted(_swa_rows(s).items(),
                                                                key=lambda x: repr(x[0])):
        for k in range(max(prot, cursor) // P, min(ceil_div(committed, P), len(pages))):
            if pages[k] is not None and pages[k] not in mapped:
                out.append(_v(swa_window_cursor, f"row-page {k} (page {pages[k]}) lies at or after "
                              f"swa_evicted_seqlen {cursor} below kv_committed_len {committed}, "
                              "but has no SWA page", " / ".join(names), pages[k]))
                break
    return out


def _swa_rows(s: AbstractState) -> dict:
    """row -> (owner names, protected, cursor, committed, row pages, swa_evict_floor): a
    slot and the request borrowing its row are one owner, the one further on (its cursor
    and committed length, the longer row) speaks for both (the slot is stale while it is
    lent)."""
    out = {}
    for row, (names, prot, alloc, pages) in row_owners(s).items():
        hs = [h for _, h in _holders(s) if h.row == row]
        out[row] = (names, prot, max(h.swa_evicted_seqlen for h in hs),
                    max(h.committed for h in hs), pages, max(h.swa_evict_floor for h in hs))
    return out


@invariant("I43", "SWA accounting identity swa_available + tree + session_held_swa + uncached_swa == swa total")
def swa_accounting(s: AbstractState, cfg: Config):
    """A holder's SWA is `ceil_align(allocated) - max(protected, cursor)`; under
    prefill-aware SWA (a floor above the protected prefix) the row-pages still mapped,
    since a later turn's floor can rise above a range an earlier floor let the window
    free, which 0.5.23's `kv_private_swa_tokens` then counts as held (docs/coverage.md)."""
    if not s.swa_num_pages:
        return []
    P, mapped = s.page_size, {f for f, _ in s.swa_map}
    tree = sum(P for n in s.nodes for p in n.pages if p in mapped)
    allocs = {row: alloc for row, (_, _, alloc, _) in row_owners(s).items()}
    held = sum(row_swa_held(allocs[row], prot, cursor, floor, P, pages, mapped)
               for row, (_, prot, cursor, _, pages, floor) in _swa_rows(s).items())
    available = len(s.swa_free_pages) * P
    total = s.swa_num_pages * P
    if available + tree + held != total:
        return [_v(swa_accounting, f"swa_available {available} + tree SWA {tree} + held SWA {held} "
                   f"= {available + tree + held} != swa total {total}", "SWA allocator")]
    return []


def _mamba_owners(s: AbstractState) -> dict:
    """Owner name -> Mamba entries, a slot and the request borrowing its row counted as one
    owner (they share one set of references, as they share the row)."""
    owners: dict = {}
    for row, (names, *_rest) in row_owners(s).items():
        hs = [h for n, h in _holders(s) if h.row == row]
        refs = max((h.mamba for h in hs), key=len)
        owners[" / ".join(names)] = (refs, hs)
    return owners


@invariant("I44", "each Mamba slot is free or held by exactly one owner, never freed twice, never the sentinel")
def mamba_slots_conserved(s: AbstractState, cfg: Config):
    if not s.mamba_slots:
        return []
    out, places = [], {}
    for m, n in sorted(Counter(s.mamba_free).items()):
        if n > 1:
            out.append(_v(mamba_slots_conserved, f"Mamba slot {m} is in the free list {n} times "
                          "(freed twice)", "MambaSlotAllocator"))
        places.setdefault(m, []).append("free list")
    for owner, m in _mamba_off_row(s):
        places.setdefault(m, []).append(owner)
    for owner, (refs, hs) in _mamba_owners(s).items():
        if any(h.mamba and h.mamba != refs for h in hs):
            out.append(_v(mamba_slots_conserved, "a slot and the request borrowing its row hold "
                          f"different Mamba states {[h.mamba for h in hs]}", owner))
        if not refs:
            out.append(_v(mamba_slots_conserved, "holds a row but no Mamba state", owner))
        for k, m in enumerate(refs):
            if m == -1 and k == 0:
                out.append(_v(mamba_slots_conserved, "mamba_pool_idx is the sentinel -1", owner))
            if m != -1:
                places.setdefault(m, []).append(owner)
    for m, where in sorted(places.items(), key=lambda x: repr(x[0])):
        if not (isinstance(m, int) and 1 <= m <= s.mamba_slots):
            what = "the reserved dummy slot 0" if m == 0 else ("the sentinel -1" if m == -1 else
                                                                f"out of range 1..{s.mamba_slots}")
            out.append(_v(mamba_slots_conserved, f"Mamba slot {m} is {what}: {', '.join(where)}",
                          where[0]))
        elif len(set(where)) > 1 or (len(where) > 1 and where[0] != "free list"):
            out.append(_v(mamba_slots_conserved, f"Mamba slot {m} held {len(where)} times: "
                          f"{', '.join(where)}", where[0]))
    for m in range(1, s.mamba_slots + 1):
        if m not in places:
            out.append(_v(mamba_slots_conserved, f"Mamba slot {m} is neither free nor held (leaked)",
                          "MambaSlotAllocator"))
    return out


def _mamba_off_row(s: AbstractState) -> list:
    """(owner, slot) of every Mamba state held outside a row: a tree node's
    (config.mamba_tree), and a queued request's copy-on-write slot, taken at its match
    before it has a row (kept across a rejected admission by a streaming turn)."""
    out = [(f"node {list(n.path)}", m) for n in s.nodes for m in n.mamba]
    out += [(_req(r), m) for r in s.reqs if r.row is None for m in r.mamba if m != -1]
    return out


@invariant("I45", "Mamba accounting identity available + evictable + protected + held by requests + session_held_mamba_slots == size")
def mamba_accounting(s: AbstractState, cfg: Config):
    if not s.mamba_slots:
        return []
    active_rows = {r.row for r in s.reqs if r.row is not None}
    in_reqs = sum(1 for r in s.reqs for m in r.mamba if m != -1)   # a queued one's copy too
    held = sum(1 for t in s.slots if t.row not in active_rows for m in t.mamba if m != -1)
    evictable = sum(1 for n in s.nodes if n.mamba and not n.mamba_lock_ref)
    protected = sum(1 for n in s.nodes if n.mamba and n.mamba_lock_ref)
    got = len(s.mamba_free) + evictable + protected + in_reqs + held
    if got != s.mamba_slots:
        return [_v(mamba_accounting, f"available {len(s.mamba_free)} + evictable {evictable} + "
                   f"protected {protected} + held by requests {in_reqs} + "
                   f"session_held_mamba_slots {held} = {got} != size {s.mamba_slots}",
                   "MambaSlotAllocator")]
    return []


@invariant("I46", "a node's Mamba lock_ref equals the holders anchored on it, never above its full lock_ref")
def mamba_tree_locks(s: AbstractState, cfg: Config):
    """0.5.23 with a Mamba tree component: `inc_lock_ref` locks the anchor node's own state
    (tombstone or not) beside the full KV up the path; `UnifiedTreeCore.sanity_check`
    asserts `lock_ref >= 0` and `full_lock >= mamba_lock` per node."""
    if cfg is None or not cfg.mamba_tree:
        return []
    anchors = [(_req(r), r.anchor[1]) for r in s.reqs
               if r.locked and r.anchor and r.anchor[0] == "node"]
    anchors += [(_slot(t), t.last_node[1]) for t in s.slots if t.last_node and t.last_node[0] == "node"]
    out = []
    for n in s.nodes:
        holders = [name for name, path in anchors if path == n.path]
        if n.mamba_lock_ref != len(holders):
            out.append(_v(mamba_tree_locks, f"Mamba lock_ref {n.mamba_lock_ref} but {len(holders)} "
                          f"holder(s) anchored on it{': ' + ', '.join(holders) if holders else ''}",
                          f"node {list(n.path)}"))
        if n.mamba_lock_ref > n.lock_ref:
            out.append(_v(mamba_tree_locks, f"Mamba lock_ref {n.mamba_lock_ref} > full lock_ref "
                          f"{n.lock_ref}", f"node {list(n.path)}"))
    return out


# ---------------------------------------------------------------------------
# step invariants (before, op, outcome, after)
# ---------------------------------------------------------------------------

def _publishes_chunk(op, t, u, a: AbstractState, cfg) -> bool:
    """Borrow era only: a first turn's chunk checkpoint publishes the prompt through the
    slot it runs on (`try_checkpoint` while `publishes_prompt`), so the slot's protected
    prefix grows and its lock moves deeper. Never happens in the wrapper era, where a
    streaming chunk checkpoint is a snapshot."""
    if cfg is None or cfg.era != "borrow":
        return False
    if not isinstance(op, (O.PrefillChunk, O.ScheduleRound)) or t.protected < u.protected:
        return False
    # judged on the state before the step: the turn may finish (and leave) in it
    acting = O.acting_rids(op)
    return any(r.rid in acting and (isinstance(op, O.PrefillChunk) or r.phase == "prefill")
               and r.session == t.sid
               and r.anchor == ("virtual", t.sid) for r in a.reqs)


@invariant("I10", "a slot's cache_protected_len and last_node are fixed for its life", step=True)
def slot_fixed(a: AbstractState, op, outcome, b: AbstractState, cfg=None):
    before = {t.sid: t for t in a.slots}
    out = []
    for t in b.slots:
        u = before.get(t.sid)
        if u is not None and (u.protected, u.last_node) != (t.protected, t.last_node) \
                and not _publishes_chunk(op, t, u, a, cfg):
            out.append(_v(slot_fixed, f"cache_protected_len {u.protected} -> {t.protected}, last_node "
                          f"{u.last_node} -> {t.last_node} by {op}", _slot(t)))
    return out


@invariant("I16", "no locked node is evicted", step=True)
def locked_not_evicted(a: AbstractState, op, outcome, b: AbstractState, cfg=None):
    after = {n.path for n in b.nodes}
    released = _round_released_locks(a, op, b)
    return [_v(locked_not_evicted, f"node with lock_ref {n.lock_ref} vanished by {op}", f"node {list(n.path)}")
            for n in a.nodes if n.lock_ref > 0 and n.path not in after
            and released(n.path) < n.lock_ref]


def _round_released_locks(a: AbstractState, op, b: AbstractState):
    """A round releases locks before it evicts (`retract_decode` then
    `check_decode_mem`; a prefill round's preemption before its allocation): for a node
    path, how many of its locks were held by the round's requests, or the running
    requests it preempted, that hold none after it (0 outside rounds)."""
    if not isinstance(op, (*O.ROUNDS, O.Schedule)):
        return lambda path: 0
    requeued = {r.rid for r in b.reqs if r.phase == "queued"}
    acting = set(O.acting_rids(op)) | {r.rid for r in a.reqs
                                        if r.phase == "decode" and r.rid in requeued}
    still = {r.rid for r in b.reqs if r.locked}
    gone = [r.anchor[1] for r in a.reqs
            if r.rid in acting and r.locked and r.rid not in still
            and r.anchor and r.anchor[0] == "node"]
    return lambda path: sum(1 for p in gone if p[:len(path)] == path)


@invariant("I25", "a rejected admission retried restores idempotently", step=True)
def idempotent_restore(a: AbstractState, op, outcome, b: AbstractState, cfg=None):
    if not isinstance(op, (O.Schedule, O.ScheduleRound)) or outcome != "rejected" or \
            len(O.acting_rids(op)) != 1:
        return []           # a round of several allocates for the others it admits
    rid, = O.acting_rids(op)
    r = next((x for x in a.reqs if x.rid == rid), None)
    if r is None or r.phase != "queued" or r.row is None or \
            not (r.anchor and r.anchor[0] == "virtual"):
        return []           # (a chunked request's round checkpoints its chunk first)
    sid = r.anchor[1]
    ta = next((t for t in a.slots if t.sid == sid), None)
    tb = next((t for t in b.slots if t.sid == sid), None)
    out = []
    if ta != tb:
        out.append(_v(idempotent_restore, f"second restore changed the slot: {ta} -> {tb}", f"slot of session {sid}"))
    if len(a.free_pages) != len(b.free_pages):
        out.append(_v(idempotent_restore, f"second restore freed {len(b.free_pages) - len(a.free_pages)} "
                      "page(s)", _req(r)))
    return out


FINISHING_STEPS = (O.Schedule, O.PrefillChunk, O.Decode, O.SpecDecode, *O.ROUNDS)
"""Steps whose result can reach max_new_tokens and finish a request (`check_finished`)."""


@invariant("I28", "a session's checkpoint advances only on a successful finish", step=True)
def checkpoint_advance(a: AbstractState, op, outcome, b: AbstractState, cfg=None):
    before = {x.sid: x for x in a.sessions}
    reqs = {r.rid: r for r in a.reqs}
    out = []
    for x in b.sessions:
        u = before.get(x.sid)
        if u is None or u.checkpoint == x.checkpoint:
            continue
        after = {q.rid for q in b.reqs}
        # a finish: the Finish op (a stop token), or a step whose result reaches
        # max_new_tokens (check_finished), after which the turn is gone
        ok = any(r is not None and r.session == x.sid and not r.rejected and not r.to_finish
                 and (isinstance(op, O.Finish)
                      or (isinstance(op, FINISHING_STEPS) and r.rid not in after))
                 for r in map(reqs.get, O.acting_rids(op)))
        if not ok:
            out.append(_v(checkpoint_advance, f"checkpoint {len(u.checkpoint)} -> {len(x.checkpoint)} "
                          f"tokens by {op}", f"session {x.sid}"))
    return out


# ---------------------------------------------------------------------------

INVARIANT_IDS = {i.id: i.name for i in STATE_INVARIANTS + STEP_INVARIANTS}


def check_state(s: AbstractState, cfg: Config) -> list[Violation]:
    out: list[Violation] = []
    for inv in STATE_INVARIANTS:
        out.extend(inv.check(s, cfg))
    return out


def check_step(a: AbstractState, op, outcome: str, b: AbstractState, cfg: Config = None) -> list[Violation]:
    """Step invariants; `cfg` lets an era-specific allowance apply (None: the strict
    wrapper-era reading)."""
    out: list[Violation] = []
    for inv in STEP_INVARIANTS:
        out.extend(inv.check(a, op, outcome, b, cfg))
    return out
