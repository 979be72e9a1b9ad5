"""Text views of a replay, for a person at a terminal: what one step changed, the full
abstract state of both sides with the differing fields marked, and the page x step
owner grid. Pure functions from AbstractStates to lines; the HTML report shows the same
lines.

Page and row numbers are the system's own (KV index // page_size, req_pool_idx), never
renamed, so a number means the same page through the whole trace. Whether two sides
differ is still decided up to renaming, as the checker decides it (canonical()): a
field whose raw values differ only by page or row ids is marked `~`, a real
difference `*`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from kvcheck.spec.abstract import (MISSING, TOP_FIELDS, AbstractState, Change, canonical, changes,
                           entities, entity_name, segments)
from kvcheck.spec.invariants_base import row_owners
from kvcheck.spec.pages import ceil_div

DIFFERS, RENAMED = "*", "~"
ID_FIELDS = ("free_pages", "free_rows")
IDENTITY_FIELDS = ("path", "rid", "sid")     # already in an entity's name


# ---------------------------------------------------------------------------
# values
# ---------------------------------------------------------------------------

def fmt_ids(ids) -> str:
    """A sorted multiset of page or row ids as ranges: `1-4, 9, 12-31`; an id that
    occurs twice (a double free) as `5 (x2)`."""
    ids = sorted(ids, key=_id_order)
    if not ids:
        return "none"
    parts, i = [], 0
    while i < len(ids):
        n = ids.count(ids[i])
        if n > 1 or not isinstance(ids[i], int):
            parts.append(f"{ids[i]!r}" + (f" (x{n})" if n > 1 else ""))
            i += n
            continue
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1 and ids.count(ids[j + 1]) == 1:
            j += 1
        parts.append(f"{ids[i]}" if j == i else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ", ".join(parts)


def _id_order(x):
    return (0, x, "") if isinstance(x, int) else (1, 0, repr(x))


def fmt_field(name: str, v) -> str:
    """A top-level field's value: id multisets as ranges with their count."""
    if name in ID_FIELDS:
        return f"{fmt_ids(v)} ({len(v)})"
    return repr(v)


# ---------------------------------------------------------------------------
# one step: what changed
# ---------------------------------------------------------------------------

def _id_change(label: str, before: tuple, after: tuple) -> str:
    taken = list(before)
    for x in after:
        if x in taken:
            taken.remove(x)
    returned = list(after)
    for x in before:
        if x in returned:
            returned.remove(x)
    parts = ([f"taken {fmt_ids(taken)}"] if taken else []) + \
            ([f"returned {fmt_ids(returned)}"] if returned else [])
    return f"{label}: {'; '.join(parts)}; {len(after)} free: {fmt_ids(after)}"


def change_lines(c: Change) -> list[str]:
    """One Change between two states of one side, as `before -> after` lines."""
    if c.where in ID_FIELDS:
        return [_id_change(c.where.replace("_", " "), c.left, c.right)]
    if c.left is MISSING or c.right is MISSING:
        if c.left is not MISSING:
            return [f"- {c.where}"]
        x = c.right
        if hasattr(x, "__dataclass_fields__"):
            return [f"+ {c.where}"] + [f"    {f} = {getattr(x, f)!r}" for f in x.__dataclass_fields__
                                       if f not in IDENTITY_FIELDS]
        return [f"+ {c.where} = {x!r}"]
    label = c.where if c.field is None else f"{c.where}: {c.field}"
    a, b = segments(c.left, c.right)
    return [f"{label}: {a} -> {b}"]


def step_lines(before: AbstractState, after: AbstractState) -> list[str]:
    """What one step changed on one side, raw ids, every changed value in full."""
    return [line for c in changes(before, after) for line in change_lines(c)]


# ---------------------------------------------------------------------------
# a full state, one side or two side by side
# ---------------------------------------------------------------------------

def state_rows(s: AbstractState) -> dict:
    """(where, field) -> value text for every field of a state, in state order."""
    rows = {(f, None): fmt_field(f, getattr(s, f)) for f in TOP_FIELDS}
    for name, x in entities(s).items():
        for f in x.__dataclass_fields__:
            if f not in IDENTITY_FIELDS:
                rows[(name, f)] = repr(getattr(x, f))
    for p, c in s.content:
        rows[(f"kv content of page {p}", None)] = repr(c)
    return rows


def _canonical_keys(a: AbstractState, b: AbstractState) -> tuple[set, bool]:
    """The (where, field) keys that differ after canonical renaming (entities present
    on one side only count for all their fields), and whether the KV contents differ."""
    ca, cb = canonical(a), canonical(b)
    keys = set()
    for c in changes(ca, cb):
        keys.add((c.where, c.field))
        if c.field is None:
            keys.add((c.where, "*"))
    return keys, ca.content != cb.content


def state_marks(a: AbstractState, b: AbstractState) -> dict:
    """(where, field) -> "*" (differs) or "~" (differs only in page/row ids) for every
    field whose raw values differ between the two sides."""
    ra, rb = state_rows(a), state_rows(b)
    keys, content_differs = _canonical_keys(a, b)
    marks = {}
    for k in list(ra) + [k for k in rb if k not in ra]:
        if ra.get(k) == rb.get(k):
            continue
        where, f = k
        if where.startswith("kv content"):
            real = content_differs
        else:
            real = k in keys or (where, "*") in keys
        marks[k] = DIFFERS if real else RENAMED
    return marks


def _label(key) -> str:
    where, f = key
    return where if f is None else f"{where}: {f}"


def state_table(a: AbstractState, b: Optional[AbstractState] = None) -> list[tuple]:
    """(mark, label, value on a, value on b) for every field of a state, or of two side
    by side; mark is "" where both agree (b's value is then None), "*" or "~"."""
    ra = state_rows(a)
    if b is None:
        return [("", _label(k), v, None) for k, v in ra.items()]
    rb, marks = state_rows(b), state_marks(a, b)
    keys = list(ra) + [k for k in rb if k not in ra]
    return [(marks.get(k, ""), _label(k), ra.get(k, "(absent)"),
             rb.get(k, "(absent)") if k in marks else None) for k in keys]


def state_lines(a: AbstractState, b: Optional[AbstractState] = None,
                names: tuple = ("spec", "impl")) -> list[str]:
    """The full state of one side, or of two side by side: a field both sides agree on
    is printed once; a differing one is marked and printed for each side."""
    table = state_table(a, b)
    width = min(max(len(label) for _, label, _, _ in table), 40)
    pad = max(len(n) for n in names)
    out = [] if b is None else [f"    (one value: both sides agree; {DIFFERS} differs; "
                                f"{RENAMED} differs only in page/row ids)"]
    for mark, label, va, vb in table:
        if not mark:
            out.append(f"    {label:<{width}}  {va}")
        else:
            out.append(f"  {mark} {label:<{width}}  {names[0]:<{pad}}: {va}")
            out.append(f"    {'':<{width}}  {names[1]:<{pad}}: {vb}")
    return out


# ---------------------------------------------------------------------------
# who owns each page: the grid
# ---------------------------------------------------------------------------

OWNER_KINDS = {
    "free": ("free", "."),
    "node": ("tree node", "n"),
    "node_locked": ("tree node, locked", "N"),
    "slot": ("session slot", "s"),
    "req": ("request row", "r"),
}
FLAGS = {
    "conflict": ("two owners, or owned and free", "!"),
    "leak": ("no owner and not free (leaked)", "?"),
}


@dataclass(frozen=True)
class Owner:
    kind: str        # a key of OWNER_KINDS
    name: str        # "free list", "node [1, 2]", "req 4", "req 4 / slot of session 2"


def page_owners(s: AbstractState) -> dict:
    """page -> [Owner] for pages 1..num_pages (and any other id some owner names): the
    free lists, tree nodes, and each row's owned pages [protected/P, ceil(allocated/P))
    (a slot and the request borrowing its row are one owner), as I2 counts them; and a
    row's protected prefix page that no tree node holds (I27 says it must be the tree's),
    so that a row reading a freed page shows."""
    out: dict = {p: [] for p in range(1, s.num_pages + 1)}
    for p in s.free_pages:
        out.setdefault(p, []).append(Owner("free", "free list"))
    for n in s.nodes:
        kind = "node_locked" if n.lock_ref > 0 else "node"
        for p in n.pages:
            out.setdefault(p, []).append(Owner(kind, entity_name("nodes", n)))
    in_tree = {p for n in s.nodes for p in n.pages}
    for names, prot, alloc, pages in row_owners(s).values():
        kind = "req" if any(x.startswith("req") for x in names) else "slot"
        name = " / ".join(names)
        for k in range(min(ceil_div(alloc, s.page_size), len(pages))):
            p = pages[k]
            if p is None:
                continue
            if k >= prot // s.page_size:
                out.setdefault(p, []).append(Owner(kind, name))
            elif p not in in_tree:      # the protected prefix reads pages no tree node holds
                out.setdefault(p, []).append(Owner(kind, f"{name} (protected prefix)"))
    return dict(sorted(out.items(), key=lambda x: _id_order(x[0])))


def cell_kind(owners: list) -> str:
    """A grid cell's class: an OWNER_KINDS key, or "conflict" / "leak" (flagged)."""
    if not owners:
        return "leak"
    if len(owners) > 1:
        return "conflict"
    return owners[0].kind


def cell_text(owners: list) -> str:
    return " + ".join(o.name for o in owners) if owners else "leaked: no owner, not free"


def owner_grid(states: list) -> tuple[list, list]:
    """(pages, columns) for states in step order: columns[i][page] is (cell kind, who
    owns it) in states[i], or the column is None where a side has no state there."""
    grids = [page_owners(s) if s is not None else None for s in states]
    pages = list(dict.fromkeys(p for g in grids if g for p in g))
    cols = [None if g is None else {p: (cell_kind(g.get(p, [])), cell_text(g.get(p, [])))
                                    for p in pages} for g in grids]
    return pages, cols


def grid_rows(pages: list, grids: list, run: int = 3) -> list[tuple[str, int]]:
    """The grid's rows as (label, index of the page shown): a run of `run` or more
    consecutive pages that are free in every column of every grid (one grid a side)
    is one row labelled with its range, so a large pool does not drown the picture."""
    def always_free(p):
        return all(col is None or col[p][0] == "free" for cols in grids for col in cols)
    rows, i = [], 0
    while i < len(pages):
        j = i
        while (j < len(pages) and isinstance(pages[j], int) and always_free(pages[j])
               and pages[j] - pages[i] == j - i):
            j += 1
        if j - i >= run:
            rows.append((f"{pages[i]}-{pages[j - 1]}", i))
            i = j
        else:
            rows.append((str(pages[i]), i))
            i += 1
    return rows


def kind_char(kind: str) -> str:
    return (OWNER_KINDS.get(kind) or FLAGS[kind])[1]


def grid_lines(states: list, labels: list, side: str) -> list[str]:
    """The page x step owner grid of one side as text, then every flagged cell."""
    pages, cols = owner_grid(states)
    labels = ["i" if x == "init" else x for x in labels]
    w = max(len(str(x)) for x in labels) + 1
    legend = "  ".join(f"{c} {name}" for name, c in (*OWNER_KINDS.values(), *FLAGS.values()))
    out = [f"page x step owners ({side}); columns: the state after each step (i: initial)",
           f"  {legend}",
           " page " + "".join(f"{x:>{w}}" for x in labels)]
    flagged = [f"  step {lab}, page {p}: {col[p][1]}" for p in pages
               for lab, col in zip(labels, cols) if col is not None and col[p][0] in FLAGS]
    for label, i in grid_rows(pages, [cols]):
        cells = [" " if col is None else kind_char(col[pages[i]][0]) for col in cols]
        out.append(f"{label:>5} " + "".join(f"{c:>{w}}" for c in cells))
    if flagged:
        out += ["flagged cells:"] + flagged
    return out
