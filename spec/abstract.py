"""The abstract state: what every system under test is mapped onto, after every step.

The spec produces it from its own state; an adapter produces it from a concrete
system (impl/ tensors, a real sglang release). The invariants (spec/invariants.py)
are evaluated on it, on both sides, and `canonical()` renames page and row ids so that
two systems that allocate different ids compare equal when they own the same things.

Plain data only: ints, tuples, strings, None. Page ids are the system's own page ids
(KV index // page_size); row ids are `req_pool_idx` values.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

# Lock anchors: ("root",), ("node", key_path), ("virtual", sid), or None (no last_node).
Anchor = Optional[tuple]

PHASES = ("queued", "prefill", "decode")
"""A request's scheduler phase: waiting queue; between prefill chunks; decoding.
Finished requests leave the state."""


@dataclass(frozen=True)
class NodeView:
    path: tuple            # the full key from the root (token ids); identity of the node
    parent: tuple          # the parent's path (() for a child of the root)
    pages: tuple           # page ids of this node's own key segment, len(key) // P of them
    lock_ref: int
    lru_rank: Optional[int] = None   # eviction order among the evictable leaves (0 goes
                                     # first; equal priorities share a rank); None: not one
    mamba: tuple = ()      # config.mamba_tree: the node's Mamba state slot; () a tombstone
    mamba_lock_ref: int = 0          # its own Mamba lock (component_data[MAMBA].lock_ref)


@dataclass(frozen=True)
class ReqView:
    rid: int
    session: Optional[int]      # attached session id (req.session), None when plain/detached
    streaming: bool             # created for a streaming session (create_req)
    rejected: bool              # a create_req rejection stub
    phase: str
    fill_ids: tuple             # origin_input_ids + output_ids
    origin_len: int
    max_new_tokens: int
    row: Optional[int]          # req_pool_idx
    committed: int              # kv_committed_len
    allocated: int              # kv_allocated_len
    protected: int              # cache_protected_len
    anchor: Anchor              # last_node
    locked: bool                # holds a persistent lock_ref through `anchor`
    to_finish: bool
    is_retracted: bool
    committed_freed: bool
    overallocated_freed: bool
    row_pages: tuple = ()       # page id of each row-page [0, ceil(allocated / P)) (None: unset)
    swa_evicted_seqlen: int = 0     # hybrid: SWA KV of [protected, here) is freed
    swa_evict_floor: int = 0        # hybrid: prefill-aware SWA's floor (swa_dead_lo)
    mamba: tuple = ()               # hybrid: mamba_pool_idx, then the ping-pong track buffer
    swa_branching_seqlen: Optional[int] = None  # borrow-era SWA: the match's pending branch
    fill: Optional[tuple] = None    # full_untruncated_fill_ids where requests share token
                                    # arrays (`Config.aliases_token_arrays`); else None


@dataclass(frozen=True)
class SlotView:
    sid: int
    row: Optional[int]
    committed: int
    allocated: int
    protected: int
    last_node: Anchor
    row_pages: tuple = ()
    swa_evicted_seqlen: int = 0     # hybrid (see ReqView)
    swa_evict_floor: int = 0
    mamba: tuple = ()
    swa_uuid_for_lock: Anchor = None    # the first turn's SWA lock boundary


@dataclass(frozen=True)
class SessionView:
    sid: int
    inflight: bool              # Session._inflight
    checkpoint: tuple           # tokens the next turn builds on (last successful turn)
    close_pending: bool         # close_on_finish


@dataclass(frozen=True)
class AbstractState:
    page_size: int
    num_pages: int
    num_rows: int
    free_pages: tuple           # multiset (sorted) of page ids in the allocator's free lists
    free_rows: tuple            # multiset (sorted) of free row ids
    nodes: tuple                # NodeView, sorted by path; root excluded
    reqs: tuple                 # ReqView, sorted by rid
    slots: tuple                # SlotView, sorted by sid
    sessions: tuple             # SessionView, sorted by sid
    evictable_size: int         # as the tree reports it
    protected_size: int
    content: tuple = ()         # (page id, tuple of P token ids or None) for owned pages
    # hybrid models (all empty when config.swa_window and config.mamba_slots are 0)
    swa_window: int = 0
    swa_num_pages: int = 0
    swa_free_pages: tuple = ()  # multiset (sorted) of SWA page ids in the SWA allocator
    swa_map: tuple = ()         # (full page, SWA page) for every nonzero mapping entry, sorted
    mamba_slots: int = 0
    mamba_free: tuple = ()      # multiset (sorted) of the Mamba allocator's free slots

    def content_map(self) -> dict:
        return dict(self.content)


# ---------------------------------------------------------------------------
# canonical renaming
# ---------------------------------------------------------------------------

def canonical(s: AbstractState) -> AbstractState:
    """Rename page and row ids by first appearance in a fixed traversal (tree nodes by
    path, then requests by rid, then slots by sid), so that two systems that own the same
    things through different ids compare equal. Free pages that nothing else names are
    interchangeable and become the label 0 (a multiset count remains); a free page that
    is also owned keeps its owner's label, so aliasing survives renaming."""
    pages: dict = {}
    rows: dict = {}

    def pl(p):
        if p is None:
            return None
        if p not in pages:
            pages[p] = len(pages) + 1
        return pages[p]

    def rl(r):
        if r is None:
            return None
        if r not in rows:
            rows[r] = len(rows)
        return rows[r]

    nodes = tuple(_with(n, pages=tuple(pl(p) for p in n.pages)) for n in s.nodes)
    reqs = tuple(_with(r, row=rl(r.row), row_pages=tuple(pl(p) for p in r.row_pages)) for r in s.reqs)
    slots = tuple(_with(t, row=rl(t.row), row_pages=tuple(pl(p) for p in t.row_pages)) for t in s.slots)
    free_pages = tuple(sorted(pages.get(p, 0) for p in s.free_pages))
    free_rows = tuple(sorted(rows.get(r, -1) for r in s.free_rows))
    content = tuple(sorted((pages[p], c) for p, c in s.content if p in pages))
    out = _with(s, free_pages=free_pages, free_rows=free_rows, nodes=nodes, reqs=reqs,
                 slots=slots, content=content)
    return _canonical_hybrid(out, s, pages) if (s.swa_map or s.swa_free_pages or
                                                s.mamba_free or s.mamba_slots) else out


def _canonical_hybrid(out: AbstractState, s: AbstractState, pages: dict) -> AbstractState:
    """Rename SWA pages by the renamed full page that maps to them, and Mamba slots by
    first appearance (tree nodes by path, requests by rid, then slots); -1 (an unallocated track entry) and
    0 (the reserved dummy) keep their value."""
    swa: dict = {}
    for full, w in sorted(s.swa_map, key=lambda x: (pages.get(x[0], 0), x[1])):
        swa.setdefault(w, len(swa) + 1)
    mamba: dict = {-1: -1, 0: 0}

    def ml(m):
        if m not in mamba:
            mamba[m] = len(mamba) - 1
        return mamba[m]

    nodes = tuple(_with(n, mamba=tuple(ml(m) for m in n.mamba)) if n.mamba else n
                  for n in out.nodes)
    reqs = tuple(_with(r, mamba=tuple(ml(m) for m in r.mamba)) for r in out.reqs)
    slots = tuple(_with(t, mamba=tuple(ml(m) for m in t.mamba)) for t in out.slots)
    return _with(out, nodes=nodes, reqs=reqs, slots=slots,
                 swa_map=tuple(sorted((pages.get(f, f), swa[w]) for f, w in s.swa_map)),
                 swa_free_pages=tuple(sorted(swa.get(w, 0) for w in s.swa_free_pages)),
                 mamba_free=tuple(sorted(mamba.get(m, -2) for m in s.mamba_free)))


def _with(x, **changes):
    """`dataclasses.replace` for these plain frozen views (no __post_init__, no
    validation) without the cost of re-running __init__: canonical() runs twice a step."""
    y = object.__new__(type(x))
    d = y.__dict__
    d.update(x.__dict__)
    d.update(changes)
    return y


def with_lru_ranks(nodes, evictable: dict) -> list:
    """`nodes` (NodeView) with `lru_rank` set from `evictable`: path -> the eviction
    priority the system itself orders its evictable leaves by (the spec's tick, impl's
    `last_access_tick`, upstream's `eviction_strategy.get_priority`). The rank is the dense
    rank of that priority, so a stale access stamp shows at the step that makes it, not
    at a later eviction; a tie (which the system breaks arbitrarily or by path) is one
    rank on every side."""
    order = {p: i for i, p in enumerate(sorted(set(evictable.values())))}
    return [_with(n, lru_rank=order[evictable[n.path]]) if n.path in evictable else n
            for n in nodes]


MISSING = type("Missing", (), {"__repr__": lambda self: "(absent)"})()
"""The side of a Change that lacks the entity."""

ENTITY_KINDS = (("nodes", "path"), ("reqs", "rid"), ("slots", "sid"), ("sessions", "sid"))
TOP_FIELDS = ("free_pages", "free_rows", "evictable_size", "protected_size",
              "swa_free_pages", "swa_map", "mamba_free")


@dataclass(frozen=True)
class Change:
    """One difference between two abstract states. `where` names it the way a violation
    names its owner ("free_pages", "req 3", "slot of session 1", "session 1",
    "node [1, 2, 3, 4]", "kv content of page 5"); `field` is the entity's field, or None
    for a top-level field, a page's content or a whole entity present on one side only
    (that side's value is then MISSING)."""
    where: str
    field: Optional[str]
    left: object
    right: object


def entity_name(kind: str, x) -> str:
    """An entity's name, as spec/invariants_base.py names owners."""
    if kind == "nodes":
        return f"node {list(x.path)}"
    if kind == "reqs":
        return f"req {x.rid}"
    if kind == "slots":
        return f"slot of session {x.sid}"
    return f"session {x.sid}"


def entities(s: AbstractState) -> dict:
    """name -> entity view for every node, request, slot and session, in state order."""
    return {entity_name(kind, x): x for kind, _ in ENTITY_KINDS for x in getattr(s, kind)}


def changes(a: AbstractState, b: AbstractState) -> list[Change]:
    """Every difference between two abstract states, field by field."""
    out = [Change(f, None, getattr(a, f), getattr(b, f)) for f in TOP_FIELDS
           if getattr(a, f) != getattr(b, f)]
    ea, eb = entities(a), entities(b)
    for name in list(ea) + [n for n in eb if n not in ea]:
        xa, xb = ea.get(name, MISSING), eb.get(name, MISSING)
        if xa is MISSING or xb is MISSING:
            out.append(Change(name, None, xa, xb))
        elif xa != xb:
            out += [Change(name, f, getattr(xa, f), getattr(xb, f)) for f in xa.__dataclass_fields__
                    if getattr(xa, f) != getattr(xb, f)]
    ca, cb = a.content_map(), b.content_map()
    out += [Change(f"kv content of page {p}", None, ca.get(p, MISSING), cb.get(p, MISSING))
            for p in sorted(set(ca) | set(cb), key=repr) if ca.get(p, MISSING) != cb.get(p, MISSING)]
    return out


def describe(c: Change, left: str, right: str) -> list[str]:
    """A Change as lines: a changed value shows its differing segment in full; an entity
    on one side only is listed one field per line."""
    label = c.where if c.field is None else f"{c.where}: {c.field}"
    if c.left is MISSING or c.right is MISSING:
        side, x = (right, c.right) if c.left is MISSING else (left, c.left)
        if hasattr(x, "__dataclass_fields__"):
            return [f"{label}: only in {side}"] + [f"    {f} = {getattr(x, f)!r}"
                                                  for f in x.__dataclass_fields__]
        return [f"{label}: only in {side}: {x!r}"]
    sa, sb = segments(c.left, c.right)
    if c.field is None and c.where == "free_pages":
        return [f"free pages: {left} has {len(c.left)} {sa}, {right} has {len(c.right)} {sb}"]
    return [f"{label}: {left}={sa} {right}={sb}"]


def diff(a: AbstractState, b: AbstractState, left: str = "spec", right: str = "impl") -> list[str]:
    """Human-readable differences between two abstract states (canonical ones, for a
    comparison up to renaming)."""
    return [line for c in changes(a, b) for line in describe(c, left, right)]


def segments(va, vb, limit: int = 60) -> tuple[str, str]:
    """Both values, with a long pair of tuples cut to the segment where they differ:
    the equal prefix and suffix are counted, not hidden: `(…12 same…, 7, 8)`."""
    ra, rb = repr(va), repr(vb)
    if not (isinstance(va, tuple) and isinstance(vb, tuple)) or max(len(ra), len(rb)) <= limit:
        return ra, rb
    n = min(len(va), len(vb))
    pre = next((i for i in range(n) if va[i] != vb[i]), n)
    suf = next((i for i in range(n - pre) if va[-1 - i] != vb[-1 - i]), n - pre)
    return _segment(va, pre, suf), _segment(vb, pre, suf)


def _segment(v: tuple, pre: int, suf: int) -> str:
    parts = [f"…{pre} same…"] if pre else []
    parts += [repr(x) for x in v[pre:len(v) - suf]]
    parts += [f"…{suf} same…"] if suf else []
    return "(" + ", ".join(parts) + ")"


def build_content(page_size: int, nodes, reqs, slots, read) -> tuple:
    """The KV content that some owner vouches for, per page: every position of a tree
    node's pages, and row positions `[0, committed)` of each request and slot.
    `read(page, offset)` returns the token id whose KV the system stored there (None if
    unwritten). Used by every producer of an AbstractState, so both sides of a
    comparison look at exactly the same positions."""
    valid: dict = {}
    whole = range(page_size)

    def claim(page, offsets):
        if page is not None:
            got = valid.get(page)
            if got is None:
                valid[page] = got = set()
            got.update(offsets)

    for n in nodes:
        for p in n.pages:
            claim(p, whole)
    for holder in (*reqs, *slots):
        rp = holder.row_pages
        end = min(holder.committed, len(rp) * page_size)     # positions [0, end)
        for k in range(-(-end // page_size)):
            claim(rp[k], range(min(page_size, end - k * page_size)))
    out = []
    for p in sorted(valid):
        offs = valid[p]
        out.append((p, tuple(read(p, o) if o in offs else None for o in range(page_size))))
    return tuple(out)
