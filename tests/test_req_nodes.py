"""S8 (docs/upstream-findings.md): req_nodes' request is the one `finish_req` recorded,
not any live request that reuses its rid. Spec only (the release side is the trace
stateful_tests/upstream/s8-reused-rid-not-req-nodes-sglang-*.json)."""
from __future__ import annotations

from pathlib import Path

import pytest

from kvcheck.trace import load
from kvcheck.spec.model import initial_state, step
from kvcheck.spec.view import abstract

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("version", ["0.5.15", "0.5.23"])
def test_a_reused_rid_is_not_req_nodes_request(version):
    tr = load(ROOT / "stateful_tests" / "upstream" / f"s8-reused-rid-not-req-nodes-sglang-{version}.json")
    s = initial_state(tr.config)
    for op in tr.ops:
        s, _ = step(s, op)
    # the retracted turn (U2: finish_req ran) produced token 1 before it ended; upstream
    # reads the checkpoint from that request, origin[:committed] + output
    [sess] = abstract(s).sessions
    assert sess.checkpoint == (2, 2, 2, 1)
    new = s.reqs[tr.ops[-1].rid]
    assert not new.req_nodes       # the new turn under the reused rid is not req_nodes'
