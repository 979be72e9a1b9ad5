"""Reading back the ITF files `kvcheck replay --itf` writes (kvcheck/itf.py): what
kvcheck.trace.parse needs to take one as a trace, below the reports that write them."""
from __future__ import annotations

UNIT = "U_OF_UNIT"
"""The ITF unit value (`variant(tag)` of a tag without payload)."""


def _plain(v):
    """An ITF value back in plain JSON: `#bigint` an integer, an optional's variant its
    value or None."""
    if isinstance(v, dict) and "#bigint" in v:
        return int(v["#bigint"])
    if isinstance(v, dict) and "tag" in v:
        return None if v.get("value") == UNIT or v["tag"] == "NoValue" else _plain(v["value"])
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


def is_itf(data) -> bool:
    return isinstance(data, dict) and isinstance(data.get("#meta"), dict) \
        and data["#meta"].get("format") == "ITF"


def from_itf(data: dict) -> dict:
    """The kvcheck trace (as JSON, for kvcheck.trace.parse) of an ITF file `write_itf`
    wrote: its #meta's config, expectation and operations; an older file without
    #meta.ops gives the operations of its states (the failing one is missing when its
    state was left out: #meta.last_state_omitted). Raises ValueError naming what is
    missing."""
    meta = data["#meta"]
    missing = [k for k in ("config", "expect") if k not in meta]
    if missing:
        raise ValueError(f"an ITF file without #meta.{missing[0]}: not written by "
                         "`kvcheck replay --itf`, which records the trace it ran there")
    ops = meta.get("ops")
    if ops is None:
        states = data.get("states")
        if not isinstance(states, list):
            raise ValueError("an ITF file without #meta.ops or states")
        ops = []
        for st in states[1:]:
            op = st.get("op") if isinstance(st, dict) else None
            if not (isinstance(op, dict) and isinstance(op.get("value"), dict)):
                raise ValueError(f"states[{len(ops) + 1}].op is not an operation variant")
            ops.append({"op": op.get("tag"), **{k: _plain(v) for k, v in op["value"].items()}})
    kept = meta.get("trace_meta") if isinstance(meta.get("trace_meta"), dict) else {}
    return {"#meta": {**kept, "itf": meta.get("source") or "ITF"}, "config": meta["config"],
            "ops": ops, "expect": meta["expect"]}
