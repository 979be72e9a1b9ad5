"""Invariants of the page and row pools: every page and row is free or owned exactly once,
and the token accounting adds up (I1-I4, I17)."""
from __future__ import annotations

from collections import Counter

from kvcheck.spec.abstract import AbstractState
from kvcheck.spec.config import Config
from kvcheck.spec.invariants_base import _holders, _v, invariant, row_owners
from kvcheck.spec.pages import ceil_align, ceil_div


def _active(r) -> bool:
    """In last_batch/running_batch with KV not yet released (the busy check's set)."""
    return r.phase in ("prefill", "decode") and r.row is not None and not r.committed_freed


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
