"""What every invariant module builds on: `invariant` gives a check its id and name (its
Violations carry them), and the owners of an AbstractState's rows, named as reports name them.
"""
from __future__ import annotations

from kvcheck.spec.abstract import AbstractState
from kvcheck.spec.violations import Violation


def invariant(id_: str, name: str):
    """Names a check: `_v` puts its id and name on its Violations (the tables of
    spec/invariants.py say which checks run)."""
    def deco(fn):
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
