"""What values a field of an operation or of the configuration may take, declared once,
on the field itself: `rid: Annotated[int, Range(0, MAX_ID)]`, `era: Literal[...]`.

kvcheck/schema.py turns these declarations into the trace JSON Schema (the published
docs/trace.schema.json and the validation of every trace file at load);
`field_error` checks an object built in code (a Config from explore's flags) against
the same declarations without any schema library, so spec/ stays pure.
"""
from __future__ import annotations

import functools
import types
import typing
from dataclasses import dataclass, fields
from typing import Annotated, Literal, Optional

MAX_ID = 2**31 - 1
"""Request, session and token ids: int32, as a torch index tensor stores them."""
MAX_CONTEXT = 2**14
"""Upper bound of max_context_len, and so of every length and token count in a trace:
a checker's scope stays small, and `req_to_token` (num_rows x max_context_len) stays
a few MB before anything is allocated."""
MAX_PAGES = 2**16
MAX_ROWS = 256
MAX_PAGE_SIZE = 64
MAX_DRAFTS = 64
MAX_PRIORITY = 2**15


@dataclass(frozen=True)
class Range:
    """An integer field's allowed values, both ends included."""
    lo: int
    hi: int


@dataclass(frozen=True)
class Length:
    """A list field's allowed number of items, both ends included."""
    lo: int
    hi: int


Id = Annotated[int, Range(0, MAX_ID)]
TokenId = Annotated[int, Range(0, MAX_ID)]
Tokens = Annotated[tuple[TokenId, ...], Length(1, MAX_CONTEXT)]
TokenCount = Annotated[int, Range(1, MAX_CONTEXT)]
MAX_ROUND = 64
"""The most requests one scheduling round names (a trace's rounds stay small)."""
Ids = Annotated[tuple[Id, ...], Length(1, MAX_ROUND)]
"""Request ids in the order a scheduling round takes them (each once)."""
Priority = Annotated[int, Range(-MAX_PRIORITY, MAX_PRIORITY)]
"""`GenerateReqInput.priority` under `--enable-priority-scheduling` (a larger value is
scheduled first: `schedule_low_priority_values_first` off); 0 is the value
`_set_or_validate_priority` gives a request that names none."""
LogprobStart = Optional[Annotated[int, Range(-1, MAX_CONTEXT)]]
"""`return_logprob=True` with this `logprob_start_len` (-1: upstream's default), or None:
no logprobs. At most the prompt's length (a larger one is `set_finish_with_abort`ed by
`handle_generate_request`, which `pre_abort` of a fresh request already is)."""


def describe(tp) -> tuple[str, dict]:
    """(base kind, constraints) of a declared type: kind is one of 'integer', 'boolean',
    'string', 'array'; constraints hold 'range', 'length', 'items', 'choices', 'nullable'."""
    cons: dict = {}
    if typing.get_origin(tp) is Annotated:
        base, *extras = typing.get_args(tp)
        for x in extras:
            if isinstance(x, Range):
                cons["range"] = x
            elif isinstance(x, Length):
                cons["length"] = x
        kind, inner = describe(base)
        return kind, {**inner, **cons}
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        kind, inner = describe(args[0])
        return kind, {**inner, "nullable": True}
    if origin is Literal:
        return "string", {"choices": typing.get_args(tp)}
    if origin is tuple or tp is tuple:
        args = typing.get_args(tp)
        return "array", {"items": describe(args[0]) if args else ("integer", {})}
    if tp is bool:
        return "boolean", {}
    if tp is int:
        return "integer", {"range": Range(0, MAX_ID)}
    return "string", {}


def value_error(value, kind: str, cons: dict) -> Optional[str]:
    """Why `value` is not allowed for a field of this kind, or None."""
    if value is None:
        return None if cons.get("nullable") else "must not be null"
    if kind == "boolean":
        return None if isinstance(value, bool) else f"must be true or false, got {value!r}"
    if kind == "string":
        ch = cons.get("choices")
        return None if value in (ch or (value,)) and isinstance(value, str) else \
            f"must be one of {list(ch)}, got {value!r}"
    if kind == "integer":
        r = cons.get("range")
        if not isinstance(value, int) or isinstance(value, bool):
            return f"must be an integer in [{r.lo}, {r.hi}], got {value!r}"
        return None if r.lo <= value <= r.hi else \
            f"must be an integer in [{r.lo}, {r.hi}], got {value}"
    if kind == "array":
        n = cons.get("length")
        if not isinstance(value, (list, tuple)):
            return f"must be a list, got {value!r}"
        if n and not n.lo <= len(value) <= n.hi:
            return f"must have {n.lo} to {n.hi} items, got {len(value)}"
        ikind, icons = cons["items"]
        for i, item in enumerate(value):
            err = value_error(item, ikind, icons)
            if err:
                return f"[{i}] {err}"
    return None


@functools.lru_cache(maxsize=None)
def field_specs(cls) -> tuple:
    """((name, kind, constraints), ...) for each field of dataclass `cls`, in order."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return tuple((f.name, *describe(hints[f.name])) for f in fields(cls))


def field_error(obj, prefix: str) -> Optional[str]:
    """The first field of dataclass instance `obj` whose value its declaration does not
    allow, as 'prefix.field must be ...', or None."""
    for name, kind, cons in field_specs(type(obj)):
        err = value_error(getattr(obj, name), kind, cons)
        if err:
            return f"{prefix}.{name}{'' if err.startswith('[') else ' '}{err}"
    return None
