"""The interface every system under test is driven through."""
from __future__ import annotations

from typing import Protocol

from kvcheck.spec.abstract import AbstractState
from kvcheck.spec.config import Config
from kvcheck.spec.ops import Op
from kvcheck.spec.violations import Violation


class Backend(Protocol):
    name: str

    def __init__(self, cfg: Config) -> None: ...

    def apply(self, op: Op) -> str:
        """Apply one op that the spec found enabled; return its outcome (kvcheck.spec.ops.OUTCOMES).
        May raise: the checker reports an exception as a divergence at this step."""

    def abstract(self) -> AbstractState:
        """The current concrete state mapped onto the abstract state (real page/row ids)."""

    def concrete_violations(self) -> list[Violation]:
        """What only the concrete state can show (ids C1...): a page in a free list and in a
        live row or tree node, a duplicate in the free lists, row/page congruence, page 0
        handed out, a row both free and held."""

    def close(self) -> None: ...
