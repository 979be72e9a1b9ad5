"""sglang 0.5.19: the wrapper-era session design with one `ReqKvInfo` per session, which
the slot and the turn running on it share (`restore_to_req`: `req.kv = self.kv`), where
0.5.14-0.5.18 copy it. With one turn on a record at a time the two free, keep and lock the
same pages and rows; a state where two live requests hold one record (only past accepted
U1/U2) is past what the wrapper-era spec follows, and the backend says so
(`SglangBackend.past_model`, "R1"), which the lockstep counts as beyond the accepted
findings' model (`checker.Beyond`). docs/upstream-findings.md, "Releases between".

The tests that drive a release run when its .venv-sglang-VERSION is built."""
from __future__ import annotations

from pathlib import Path

import pytest

from kvcheck.checker import run_ops
from kvcheck.spec import ops as O
from kvcheck.spec.config import Config

ROOT = Path(__file__).resolve().parents[1]
ACCEPT = ("U1", "U2", "U3", "M2")
CFG = Config(page_size=1, num_pages=6, num_rows=2, max_context_len=16, overlap=True,
             era="wrapper", accept=ACCEPT, evict_shortfall=True)

QUEUED_BORROWER = [O.OpenSession(1), O.SubmitTurn(1, 1, (2, 2, 2), 2), O.Schedule(1),
                   O.Retract(1), O.SubmitTurn(1, 2, (2,), 2), O.Schedule(2, admit=False),
                   O.Schedule(1)]
"""The exhaustive walk's first failure on 0.5.19 (scope sglang-p1) before R1: turn 1 is
retracted (U2: the slot takes its record, `finish_req`), turn 2 is matched (it holds the
slot's record) and turned down, then turn 1 is matched again (step 6) and finishes on the
same record. On 0.5.14-0.5.18 turn 2 keeps its copy (4 tokens); on 0.5.19 it sees turn 1's
6 (D1 on request 2 before the stop)."""


def test_a_backend_past_the_model_stops_the_comparison_under_accept(spec_alone):
    res = run_ops(CFG, QUEUED_BORROWER, spec_alone(CFG, past_at=6), backend_name="past")
    assert res.ok and res.beyond is not None
    assert (res.beyond.step, res.beyond.reason) == (6, "R1")
    assert "past: R1: test" in res.beyond.details[0]
    # without --accept the backend is not asked: every step is compared
    plain = Config(page_size=1, num_pages=6, num_rows=2, max_context_len=16, overlap=True,
                   evict_shortfall=True)
    ops = QUEUED_BORROWER[:3]
    res = run_ops(plain, ops, spec_alone(plain, past_at=0), backend_name="past")
    assert res.ok and res.beyond is None


def _venv(version):
    return pytest.mark.skipif(
        not (ROOT / f".venv-sglang-{version}" / "bin" / "python").exists(),
        reason=f"no .venv-sglang-{version} (make sglang-env SGLANG_VERSIONS={version})")


@_venv("0.5.19")
def test_0_5_19_stops_where_two_requests_hold_one_record():
    from kvcheck.adapters.sglang.proxy import make_backend
    res = run_ops(CFG, QUEUED_BORROWER, make_backend(CFG, "0.5.19"), backend_name="sglang-0.5.19")
    assert res.ok and res.beyond is not None, res.failure and res.failure.render()
    assert (res.beyond.step, res.beyond.reason) == (6, "R1")
    assert "matched session 1's record while requests [2] hold it" in res.beyond.details[0]
    # the same ops up to the stop agree step by step, the slot shown as its copy
    assert run_ops(CFG, QUEUED_BORROWER[:6], make_backend(CFG, "0.5.19")).ok


@_venv("0.5.19")
def test_0_5_19_runs_the_unified_tree_it_builds():
    from kvcheck.adapters.sglang.proxy import SglangProxy
    assert SglangProxy(CFG, "0.5.19").api == "flat"
    two_turns = [O.OpenSession(1), O.SubmitTurn(1, 1, (1, 2, 3), 3), O.Schedule(1),
                 O.Decode(1, 5), O.Finish(1), O.SubmitTurn(1, 2, (4,), 3), O.Schedule(2),
                 O.Decode(2, 6), O.Finish(2), O.CloseSession(1)]
    cfg = Config(num_pages=32, max_context_len=64, accept=ACCEPT, evict_shortfall=True)
    res = run_ops(cfg, two_turns, SglangProxy(cfg, "0.5.19"), backend_name="sglang-0.5.19")
    assert res.ok and res.beyond is None, res.failure and res.failure.render()


@pytest.mark.parametrize("version", ["0.5.20", "0.5.21"])
def test_0_5_20_and_0_5_21_are_refused_naming_the_prompt_split(version):
    if not (ROOT / f".venv-sglang-{version}" / "bin" / "python").exists():
        pytest.skip(f"no .venv-sglang-{version}")
    from kvcheck.adapters.sglang.proxy import SglangProxy, SglangUnavailable
    with pytest.raises(SglangUnavailable, match="prompt boundary.*0.5.20-0.5.21 are not driven"):
        SglangProxy(CFG, version)
