"""A violation: which invariant, where, whose, which page, and the numbers."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Violation:
    id: str                     # "I2", "C3", ...
    name: str                   # "page exclusivity and conservation"
    message: str                # the numbers
    owner: Optional[str] = None # "req 3", "slot of session 1", "node [1, 2, 3, 4]", "allocator"
    page: Optional[int] = None
    side: str = ""              # "spec", "impl", "sglang-0.5.15": set by the checker

    def __str__(self) -> str:
        where = []
        if self.side:
            where.append(self.side)
        if self.owner:
            where.append(self.owner)
        if self.page is not None:
            where.append(f"page {self.page}")
        loc = f" [{'; '.join(where)}]" if where else ""
        return f"{self.id} {self.name}{loc}: {self.message}"


class ModelError(AssertionError):
    """An assertion of upstream code that the model itself reached (names it). `upstream`:
    the assertion's own message in the releases whose wording the model's message does not
    begin with (a release that raises one of them raised the same assertion)."""

    def __init__(self, message: str, upstream: tuple = ()):
        super().__init__(message)
        self.upstream = upstream
