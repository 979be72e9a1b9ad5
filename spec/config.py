"""Configuration of one checked system: pool sizes, page size, scheduler flags, era.

Every driver (the spec, impl/, upstream adapters, the explorer) is built from one
`Config`; an invalid one is refused with a message that says which field and why.
"""
from __future__ import annotations

import typing
from dataclasses import asdict, dataclass, fields
from typing import Annotated, Literal, Optional

from spec.fields import MAX_CONTEXT, MAX_DRAFTS, MAX_PAGE_SIZE, MAX_PAGES, MAX_ROWS, Range, field_error

Era = Literal["wrapper", "borrow"]
ERAS = typing.get_args(Era)
"""`wrapper`: sglang 0.5.11-0.5.21 (`StreamingSession(RadixCache)`, the seed):
a mid-abort releases all session KV through `release_session`, no tree insert.
`borrow`: sglang 0.5.22+ (session inside `UnifiedRadixCache`): a mid-abort drops the
slot's lock and releases the aborted turn like any request, checkpointing its
committed prefix into the radix tree."""


ACCEPTABLE = {
    "U1": "H3: the rejected stub's detach (find_active_slot) clears another turn's _inflight",
    "U2": "H4: retract runs finish_req (checkpoint advances, _inflight cleared)",
    "U3": "H5 (0.5.15): a queued abort of a streaming turn makes no session call",
    "U6": "0.5.23: a queue drop (_release_aborted_request) of a rejected stub clears _inflight",
}
"""Recorded upstream findings (docs/upstream-findings.md) whose known behaviour the spec
takes instead of the fix when `Config.accept` names them (`--accept U1,U2`)."""
Accepted = Literal["U1", "U2", "U3", "U6"]
assert set(typing.get_args(Accepted)) == set(ACCEPTABLE)


class ConfigError(ValueError):
    """A configuration that no driver can run."""


@dataclass(frozen=True)
class Config:
    page_size: Annotated[int, Range(1, MAX_PAGE_SIZE)] = 1
    num_pages: Annotated[int, Range(1, MAX_PAGES)] = 16
    """KV pages 1..num_pages are allocatable; page 0 is reserved (dummy writes)."""
    num_rows: Annotated[int, Range(1, MAX_ROWS)] = 4
    """Rows of `req_to_token` (request-pool size)."""
    max_context_len: Annotated[int, Range(2, MAX_CONTEXT)] = 64
    chunk_size: Optional[Annotated[int, Range(1, MAX_CONTEXT)]] = None
    """Chunked-prefill budget in tokens (`chunked_prefill_size`); None disables it."""
    spec_enabled: bool = False
    """Speculative decoding: `SpecDecode` over-allocates and accepts drafts."""
    max_drafts: Annotated[int, Range(1, MAX_DRAFTS)] = 3
    overlap: bool = False
    """Overlap scheduler: the step after the last one is already prepared at
    finish/retract, so committed == seqlen there (DOMAIN.md section 2.5)."""
    era: Era = "wrapper"
    accept: tuple[Accepted, ...] = ()
    """Recorded findings (ids of ACCEPTABLE) whose upstream behaviour the spec takes, so a
    differential run drives their paths; () is the fixed behaviour everywhere."""

    def __post_init__(self) -> None:
        if isinstance(self.accept, list):       # from JSON
            object.__setattr__(self, "accept", tuple(self.accept))
        err = field_error(self, "config")      # each field's declared type and range
        if err:
            raise ConfigError(err)
        if self.max_context_len % self.page_size:
            raise ConfigError(
                f"config.max_context_len ({self.max_context_len}) must be a multiple of "
                f"page_size ({self.page_size})")
        if self.chunk_size is not None and self.chunk_size < self.page_size:
            raise ConfigError(
                f"config.chunk_size ({self.chunk_size}) must be >= page_size ({self.page_size}): "
                "a chunk is truncated to whole pages and would make no progress")

    @property
    def total_tokens(self) -> int:
        """`max_total_num_tokens`: every allocatable KV slot, in tokens."""
        return self.num_pages * self.page_size

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Config":
        if not isinstance(data, dict):
            raise ConfigError(f"config must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown config field(s) {unknown}; known: {sorted(known)}")
        return cls(**data)
