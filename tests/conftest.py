"""Shared test helpers (pytest fixtures)."""
from __future__ import annotations

import pytest


@pytest.fixture
def assert_invariant_fires():
    """check(state, cfg, inv_id): spec/invariants.py's check_state reports inv_id on the
    abstract state, and its message carries the invariant's name."""
    from spec.invariants import INVARIANT_IDS, check_state

    def check(state, cfg, inv_id):
        vs = check_state(state, cfg)
        hit = [v for v in vs if v.id == inv_id]
        assert hit, f"{inv_id} did not fire; got {[str(v) for v in vs]}"
        assert INVARIANT_IDS[inv_id] in str(hit[0])
    return check
