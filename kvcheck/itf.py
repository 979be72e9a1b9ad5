"""`kvcheck replay TRACE --itf OUT`: a run as an ITF trace (the Informal Trace Format of
Apalache and Quint), one state per step, for the tools that read ITF (itf-py, Quint's
trace viewers). The kvcheck trace stays the input format; this is an export.

The mapping (docs/itf.md says it in full):
- `#meta`: format, source trace, backend, config, expectation, the operations (as in the
  kvcheck trace, with its #meta as trace_meta, so that `kvcheck replay` reads the ITF
  file back: `from_itf`) and the failure found.
- `vars`: step, action, op, outcome, and the abstract state of each side: `spec`, and
  `sut` (the system under test) unless the backend is the spec alone.
- `states[0]` is the initial state (step -1, action "init"); `states[k+1]` the state
  after operation k. A failing step whose system under test has no state (it raised,
  or the spec failed first and the backend never ran) ends the trace before it.
- Encodings: a mapping keyed by id is `#map`; a set `#set`; a fixed-arity tuple `#tup`;
  a sequence (fill_ids, a node's path and pages, the free lists as sorted multisets)
  a JSON list; an integer beyond 2^53 `#bigint`; a value that may be absent a variant
  `{"tag": ..., "value": ...}` (Apalache's "U_OF_UNIT" where it carries nothing).
"""
from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

from kvcheck.itf_read import UNIT, from_itf, is_itf  # noqa: F401  (read back: the core's)
from kvcheck.spec.abstract import AbstractState

SAFE_INT = 2 ** 53


def _int(v: int):
    return v if -SAFE_INT < v < SAFE_INT else {"#bigint": str(v)}


def value(v):
    """A plain value (int, bool, str, tuple as a sequence) in ITF's JSON."""
    if isinstance(v, bool) or isinstance(v, str):
        return v
    if isinstance(v, int):
        return _int(v)
    if isinstance(v, (tuple, list)):
        return [value(x) for x in v]
    raise TypeError(f"no ITF encoding for {type(v).__name__}: {v!r}")


def variant(tag: str, payload=UNIT) -> dict:
    return {"tag": tag, "value": payload}


def optional(v, some: str, none: str) -> dict:
    """None -> the `none` variant; else the `some` variant carrying the value."""
    return variant(none) if v is None else variant(some, value(v))


def anchor(a) -> dict:
    """A lock anchor: NoAnchor | Root | Node(path) | Virtual(sid)."""
    if a is None:
        return variant("NoAnchor")
    if a[0] == "root":
        return variant("Root")
    return variant(a[0].capitalize(), value(a[1]))


def indexed(seq) -> dict:
    """A sequence with holes (None) as a map index -> value, the holes left out."""
    return {"#map": [[i, value(x)] for i, x in enumerate(seq) if x is not None]}


def _record(view, skip=(), **special) -> dict:
    out = {}
    for f in fields(view):
        if f.name in skip:
            continue
        v = getattr(view, f.name)
        out[f.name] = special[f.name](v) if f.name in special else value(v)
    return out


def state(s: AbstractState) -> dict:
    """An AbstractState as an ITF record."""
    row = lambda v: optional(v, "Row", "NoRow")  # noqa: E731
    return {
        "page_size": _int(s.page_size), "num_pages": _int(s.num_pages), "num_rows": _int(s.num_rows),
        "free_pages": value(s.free_pages),
        "free_rows": value(s.free_rows),
        "nodes": {"#map": [[value(n.path), _record(
            n, skip=("path",), lru_rank=lambda v: optional(v, "Rank", "NoRank"))] for n in s.nodes]},
        "reqs": {"#map": [[_int(r.rid), _record(
            r, skip=("rid",), session=lambda v: optional(v, "Session", "NoSession"), row=row,
            anchor=anchor, row_pages=indexed,
            swa_branching_seqlen=lambda v: optional(v, "Branch", "NoBranch"),
            fill=lambda v: optional(v, "Fill", "NoFill"))] for r in s.reqs]},
        "slots": {"#map": [[_int(t.sid), _record(
            t, skip=("sid",), row=row, last_node=anchor, row_pages=indexed,
            swa_uuid_for_lock=anchor)] for t in s.slots]},
        "sessions": {"#map": [[_int(x.sid), _record(x, skip=("sid",))] for x in s.sessions]},
        "evictable_size": _int(s.evictable_size),
        "protected_size": _int(s.protected_size),
        "content": {"#map": [[_int(p), indexed(c)] for p, c in s.content]},
        **_hybrid(s),
    }


def _hybrid(s: AbstractState) -> dict:
    """The hybrid pools (spec/swa_pool.py, spec/mamba_pool.py), only when the configuration
    has them."""
    if not (s.swa_num_pages or s.mamba_slots):
        return {}
    return {"swa_free_pages": value(s.swa_free_pages),
            "swa_map": {"#map": [[_int(f), _int(w)] for f, w in s.swa_map]},
            "mamba_free": value(s.mamba_free)}


def operation(op) -> dict:
    """An operation as the variant `name(fields)`; None: the initial state's `init`."""
    if op is None:
        return variant("init")
    from kvcheck.spec.fields import field_specs
    nullable = {name for name, _, cons in field_specs(type(op)) if cons.get("nullable")}
    return variant(op.name, {name: optional(v, "Some", "NoValue")
                             if name in nullable else value(v) for name, v in op.args()})


def itf_trace(trace, res, source: str = "") -> dict:
    """The ITF object of a finished replay (kvcheck.replay.ReplayResult)."""
    sut = res.backend_name if res.backend_name != "spec" else None
    f = res.failure
    meta = {
        "format": "ITF",
        "format-description": "https://apalache-mc.org/docs/adr/015adr-trace.html",
        "description": f"kvcheck replay of {source or 'a trace'} on the spec"
                       + (f" and {sut} (var sut)" if sut else ""),
        "source": source, "backend": res.backend_name,
        "config": trace.config.to_json(), "expect": trace.expect.to_json(),
        "ops": [op.to_json() for op in trace.ops], "trace_meta": dict(trace.meta),
        "failure": None if f is None else {
            "id": f.id, "name": f.name, "step": f.step, "side": f.side,
            "violations": [str(v) for v in f.violations], "details": list(f.details)},
    }
    vars_ = ["step", "action", "op", "outcome"] + (["sut_outcome"] if sut else []) + \
        ["spec"] + (["sut"] if sut else [])
    states = []
    for k in range(-1, len(res.records)):
        rec = res.records[k] if k >= 0 else None
        sides = {side: res.state_at(side, k) for side in res.sides}
        if any(v is None for v in sides.values()):
            meta["last_state_omitted"] = f"step {k}: {sut} has no state (see failure)"
            break
        st = {"#meta": {"index": k + 1}, "step": k,
              "action": "init" if rec is None else rec.op.name, "op": operation(rec and rec.op),
              "outcome": "" if rec is None else rec.outcome}
        if sut:
            st["sut_outcome"] = "" if rec is None or rec.backend_outcome is None else rec.backend_outcome
        st["spec"] = state(sides["spec"])
        if sut:
            st["sut"] = state(sides[sut])
        states.append(st)
    return {"#meta": meta, "vars": vars_, "states": states}


def write_itf(trace, res, out, source: str = "") -> Path:
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(itf_trace(trace, res, str(source)), indent=1) + "\n")
    return path
