"""How the fuzz engines draw a value, and the page-biased lengths and prompts they draw.

Every draw goes through a `Drawer`: `RandomDrawer` (a seeded `random.Random`, used by
the walk engine) or `HypothesisDrawer` (Hypothesis's `draw`, used by the state machine,
so Hypothesis still sees and can shrink each choice).
"""
from __future__ import annotations

import random
from typing import Callable, Protocol, Sequence

PREFIXES = ((1, 2, 3, 4, 5, 6, 7, 8), (1, 2, 3, 4, 9, 9, 9, 9), (5, 6, 7, 8, 1, 2, 3, 4))
"""Prompts start with a cut of one of these, so radix matches and splits happen."""
TOKEN_RANGE = (1, 4)


class Drawer(Protocol):
    def integer(self, lo: int, hi: int, label: str = "") -> int: ...
    def choice(self, seq: Sequence, label: str = ""): ...


class RandomDrawer:
    """Draws from a seeded `random.Random` (the walk engine)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def integer(self, lo: int, hi: int, label: str = "") -> int:
        return self.rng.randint(lo, hi)

    def choice(self, seq: Sequence, label: str = ""):
        return seq[self.rng.randrange(len(seq))]


class HypothesisDrawer:
    """Draws through Hypothesis: `st.data()`'s draw (labelled) or a composite's draw."""

    def __init__(self, draw: Callable, labelled: bool = True) -> None:
        self.draw, self.labelled = draw, labelled

    def integer(self, lo: int, hi: int, label: str = "") -> int:
        from hypothesis import strategies as st
        return self._draw(st.integers(lo, hi), label)

    def choice(self, seq: Sequence, label: str = ""):
        from hypothesis import strategies as st
        return self._draw(st.sampled_from(tuple(seq)), label)

    def _draw(self, strategy, label):
        return self.draw(strategy, label=label) if self.labelled and label else self.draw(strategy)


def boolean(d: Drawer, label: str = "") -> bool:
    return d.integer(0, 1, label) == 1


def one_in(d: Drawer, n: int, label: str = "go") -> bool:
    return d.integer(0, n - 1, label) == 0


# -- lengths and prompts -----------------------------------------------------------------

def boundary_lengths(P: int, lo: int, hi: int) -> list:
    """k*P - 1, k*P, k*P + 1 within [lo, hi]."""
    return sorted({x for k in range(1, hi // P + 2) for x in (k * P - 1, k * P, k * P + 1)
                   if lo <= x <= hi})


def draw_length(d: Drawer, P: int, lo: int, hi: int, label: str = "length") -> int:
    """A length in [lo, hi], half the time on either side of a page boundary."""
    near = boundary_lengths(P, lo, hi)
    if near and boolean(d, label + "_near_page"):
        return d.choice(near, label)
    return d.integer(lo, hi, label)


def draw_prompt(d: Drawer, P: int, lo: int = 1, hi: int = 14, label: str = "tokens") -> tuple:
    """A cut of a shared prefix, then random tokens, of a page-biased length."""
    n = draw_length(d, P, lo, hi, label + "_len")
    base = d.choice(PREFIXES + ((),), label + "_prefix")
    cut = d.integer(0, min(n, len(base)), label + "_cut")
    rest = tuple(d.integer(*TOKEN_RANGE, label + "_tok") for _ in range(n - cut))
    return tuple(base[:cut]) + rest


def draw_evict(d: Drawer, P: int, evictable: int) -> int:
    """Evict a page-biased amount, or exactly everything evictable (a full sweep)."""
    if evictable > 0 and one_in(d, 4, "evict_all"):
        return evictable
    return draw_length(d, P, 1, 16, "num_tokens")
