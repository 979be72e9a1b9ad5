"""Shared test helpers (pytest fixtures)."""
from __future__ import annotations

import pytest


@pytest.fixture
def assert_invariant_fires():
    """check(state, cfg, inv_id): spec/invariants.py's check_state reports inv_id on the
    abstract state, and its message carries the invariant's name."""
    from kvcheck.spec.invariants import INVARIANT_IDS, check_state

    def check(state, cfg, inv_id):
        vs = check_state(state, cfg)
        hit = [v for v in vs if v.id == inv_id]
        assert hit, f"{inv_id} did not fire; got {[str(v) for v in vs]}"
        assert INVARIANT_IDS[inv_id] in str(hit[0])
    return check


class SpecAlone:
    """The spec itself as a system under test, under the run's own config: it shows what
    the spec shows. `idle_from`: from that step on it applies nothing (a release that does
    something else); `past_at`: from the step after it says its state is past the model
    (`past_model`, as sglang 0.5.19's R1)."""

    def __init__(self, cfg, idle_from=None, past_at=None):
        from kvcheck.spec.model import initial_state
        self.state, self.n = initial_state(cfg), 0
        self.idle_from, self.past_at = idle_from, past_at

    def apply(self, op):
        from kvcheck.spec.model import step
        self.n += 1
        if self.idle_from is not None and self.n > self.idle_from:
            return "ok"
        self.state, out = step(self.state, op)
        return out

    def abstract(self):
        from kvcheck.spec.view import abstract
        return abstract(self.state)

    def concrete_violations(self):
        return []

    def past_model(self):
        return "R1: test" if self.past_at is not None and self.n > self.past_at else None


@pytest.fixture
def spec_alone():
    """SpecAlone, the class (a system under test that is the spec)."""
    return SpecAlone
