"""Planting a defect in the spec: a function replaced in every spec module that binds it
(each module imports what it calls by name, so one module's attribute alone is not the
function its callers reach)."""
from __future__ import annotations

import sys


def plant(monkeypatch, name: str, fn) -> None:
    """Replace the spec function `name` with `fn` wherever a kvcheck.spec module binds it."""
    homes = [m for key, m in list(sys.modules.items())
             if key.startswith("kvcheck.spec.") and name in vars(m)]
    originals = {id(vars(m)[name]) for m in homes}
    assert len(originals) == 1, f"{name} is bound to {len(originals)} objects in the spec"
    for m in homes:
        monkeypatch.setattr(m, name, fn)
