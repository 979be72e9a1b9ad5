"""Configuration of one checked system: pool sizes, page size, scheduler flags, era.

Every driver (the spec, impl/, upstream adapters, the explorer) is built from one
`Config`; an invalid one is refused with a message that says which field and why.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

ERAS = ("wrapper", "borrow")
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


class ConfigError(ValueError):
    """A configuration that no driver can run."""


@dataclass(frozen=True)
class Config:
    page_size: int = 1
    num_pages: int = 16
    """KV pages 1..num_pages are allocatable; page 0 is reserved (dummy writes)."""
    num_rows: int = 4
    """Rows of `req_to_token` (request-pool size)."""
    max_context_len: int = 64
    chunk_size: int | None = None
    """Chunked-prefill budget in tokens (`chunked_prefill_size`); None disables it."""
    spec_enabled: bool = False
    """Speculative decoding: `SpecDecode` over-allocates and accepts drafts."""
    max_drafts: int = 3
    overlap: bool = False
    """Overlap scheduler: the step after the last one is already prepared at
    finish/retract, so committed == seqlen there (DOMAIN.md section 2.5)."""
    era: str = "wrapper"
    accept: tuple = ()
    """Recorded findings (ids of ACCEPTABLE) whose upstream behaviour the spec takes, so a
    differential run drives their paths; () is the fixed behaviour everywhere."""

    def __post_init__(self) -> None:
        if isinstance(self.accept, list):
            object.__setattr__(self, "accept", tuple(self.accept))
        if not isinstance(self.accept, tuple) or any(a not in ACCEPTABLE for a in self.accept):
            raise ConfigError(f"config.accept must be a list of {sorted(ACCEPTABLE)}, "
                              f"got {self.accept!r}")
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in ("page_size", "num_pages", "num_rows", "max_context_len", "max_drafts"):
                if not isinstance(v, int) or isinstance(v, bool):
                    raise ConfigError(f"config.{f.name} must be an integer, got {v!r}")
        if self.page_size < 1:
            raise ConfigError(f"config.page_size must be >= 1, got {self.page_size}")
        if self.num_pages < 1:
            raise ConfigError(f"config.num_pages must be >= 1 (page 0 is reserved), got {self.num_pages}")
        if self.num_rows < 1:
            raise ConfigError(f"config.num_rows must be >= 1, got {self.num_rows}")
        if self.max_context_len < 2:
            raise ConfigError(f"config.max_context_len must be >= 2, got {self.max_context_len}")
        if self.max_context_len % self.page_size:
            raise ConfigError(
                f"config.max_context_len ({self.max_context_len}) must be a multiple of "
                f"page_size ({self.page_size})")
        if self.chunk_size is not None:
            if not isinstance(self.chunk_size, int) or isinstance(self.chunk_size, bool):
                raise ConfigError(f"config.chunk_size must be an integer or null, got {self.chunk_size!r}")
            if self.chunk_size < self.page_size:
                raise ConfigError(
                    f"config.chunk_size ({self.chunk_size}) must be >= page_size ({self.page_size}): "
                    "a chunk is truncated to whole pages and would make no progress")
        if self.max_drafts < 1:
            raise ConfigError(f"config.max_drafts must be >= 1, got {self.max_drafts}")
        if self.era not in ERAS:
            raise ConfigError(f"config.era must be one of {ERAS}, got {self.era!r}")
        for name in ("spec_enabled", "overlap"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"config.{name} must be true or false, got {getattr(self, name)!r}")

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
