"""JSON form of AbstractState and Violation, for the pipe between the sglang venv
(where the real classes run) and the checker's process. Plain data both ways."""
from __future__ import annotations

from dataclasses import asdict, fields

from kvcheck.spec.abstract import AbstractState, NodeView, ReqView, SessionView, SlotView
from kvcheck.spec.violations import Violation


def _to_json(v):
    if isinstance(v, tuple) or isinstance(v, list):
        return [_to_json(x) for x in v]
    if isinstance(v, dict):
        return {k: _to_json(x) for k, x in v.items()}
    return v


def _tup(v):
    """Lists back to tuples, recursively (anchors, paths, content)."""
    if isinstance(v, list):
        return tuple(_tup(x) for x in v)
    return v


def state_to_json(s: AbstractState) -> dict:
    return _to_json(asdict(s))


def _view(cls, d: dict):
    return cls(**{f.name: _tup(d[f.name]) for f in fields(cls) if f.name in d})


def state_from_json(d: dict) -> AbstractState:
    return AbstractState(
        page_size=d["page_size"], num_pages=d["num_pages"], num_rows=d["num_rows"],
        free_pages=_tup(d["free_pages"]), free_rows=_tup(d["free_rows"]),
        nodes=tuple(_view(NodeView, n) for n in d["nodes"]),
        reqs=tuple(_view(ReqView, r) for r in d["reqs"]),
        slots=tuple(_view(SlotView, t) for t in d["slots"]),
        sessions=tuple(_view(SessionView, x) for x in d["sessions"]),
        evictable_size=d["evictable_size"], protected_size=d["protected_size"],
        content=_tup(d.get("content", [])),
        **{k: _tup(d[k]) for k in HYBRID_FIELDS if k in d},
    )


HYBRID_FIELDS = ("swa_window", "swa_num_pages", "swa_free_pages", "swa_map", "mamba_slots",
                 "mamba_free")
"""The AbstractState's hybrid fields (spec/abstract.py), passed through when present."""


def violation_to_json(v: Violation) -> dict:
    return asdict(v)


def violation_from_json(d: dict) -> Violation:
    return Violation(**d)
