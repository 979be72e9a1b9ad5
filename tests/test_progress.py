"""The drain (spec/progress.py, `Config.drain`): the scheduler left alone brings every run
to idle, each of its operations compared like any other step, and P1 fires, with a trace
that reproduces it, when a request is never continued or released."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from kvcheck.adapters.impl import ImplBackend
from kvcheck.checker import run_ops
from kvcheck.engines.stats import Stats
from kvcheck.engines.walk import walk
from kvcheck.impl import faults
from kvcheck.spec import ops as O
from kvcheck.spec.config import Config
from kvcheck.spec.model import initial_state, step
from kvcheck.spec.progress import drain_op, idle
from kvcheck.trace import Expect, Trace, parse

from spec_patch import plant

CHUNKED = Config(page_size=2, num_pages=16, num_rows=4, chunk_size=4, drain=True)
TWO_TURNS = [O.OpenSession(1), O.SubmitTurn(1, 1, (1, 2, 3, 4, 5, 6, 7), 3),
             O.SubmitRequest(2, (1, 2, 3, 4, 9), 2), O.ScheduleRound((1, 2))]


def test_a_chunked_round_drains_to_idle_on_spec_and_impl():
    r = run_ops(CHUNKED, TWO_TURNS, ImplBackend(CHUNKED), keep_records=True)
    assert r.ok, r.failure.render()
    drained = [rec.op for rec in r.records[len(TWO_TURNS):]]
    names = {op.name for op in drained}
    assert {"schedule_round", "decode_round", "close_session"} <= names
    assert r.steps == len(TWO_TURNS) + len(drained)


def test_without_drain_the_run_stops_at_the_last_operation():
    cfg = replace(CHUNKED, drain=False)
    r = run_ops(cfg, TWO_TURNS, ImplBackend(cfg), keep_records=True)
    assert r.ok and r.steps == len(TWO_TURNS) and len(r.records) == len(TWO_TURNS)


def test_a_chunked_request_never_continued_is_P1(monkeypatch):
    """A spec whose round never takes the chunked request back (its next chunk refused
    with memory to spare): no safety invariant breaks, the drain names the request."""
    plant(monkeypatch, "_add_chunked_req", lambda s, req, budget, refused: None)
    r = run_ops(CHUNKED, TWO_TURNS)
    assert r.failure is not None and r.failure.id == "P1", r.failure and r.failure.render()
    v = r.failure.violations[0]
    assert v.owner.startswith("req ") and "prefill" in v.message
    assert r.failure.step >= len(TWO_TURNS)      # a drain step, past the trace's operations


def test_a_P1_trace_reads_back_and_fails_the_same_way(monkeypatch):
    plant(monkeypatch, "_add_chunked_req", lambda s, req, budget, refused: None)
    f = run_ops(CHUNKED, TWO_TURNS).failure
    t = parse(json.loads(Trace(CHUNKED, TWO_TURNS, Expect("violation", f.id, f.step, f.side)).dumps()))
    assert t.config.drain and t.expect.step == f.step
    again = run_ops(t.config, t.ops).failure
    assert (again.id, again.step, again.side) == (f.id, f.step, f.side)


def test_a_close_deferred_forever_is_P1(monkeypatch):
    """A session whose close waits for a turn that has ended (issue #27024's wedge)."""
    plant(monkeypatch, "_close_waits", lambda sess: True)
    ops = [O.OpenSession(1), O.SubmitTurn(1, 1, (1, 2, 3), 2), O.ScheduleRound((1,)),
           O.CloseSession(1)]
    r = run_ops(CHUNKED, ops)
    assert r.failure is not None and r.failure.id == "P1"
    assert r.failure.violations[0].owner == "session 1"


def test_pinned_session_KV_is_let_go_before_a_queued_request_waits_forever():
    """Two sessions' slots hold the pool; a plain request needs more than is free: the
    drain closes the idle sessions (their timeouts) and the request then runs."""
    cfg = Config(page_size=1, num_pages=12, num_rows=4, drain=True)
    ops = [O.OpenSession(1), O.SubmitTurn(1, 1, (1, 2, 3, 4, 5), 1), O.ScheduleRound((1,)),
           O.OpenSession(2), O.SubmitTurn(2, 2, (5, 6, 7, 8, 9), 1), O.ScheduleRound((2,)),
           O.SubmitRequest(3, (7, 7, 7, 7, 7, 7, 7, 7), 2)]
    r = run_ops(cfg, ops, ImplBackend(cfg), keep_records=True)
    assert r.ok, r.failure.render()
    drained = [rec.op for rec in r.records[len(ops):]]
    assert drained.index(O.CloseSession(1)) < max(i for i, op in enumerate(drained)
                                                   if 3 in O.acting_rids(op))


def test_drain_op_is_None_only_when_idle():
    s = initial_state(CHUNKED)
    assert drain_op(s) is None and idle(s)
    for op in TWO_TURNS:
        s, _ = step(s, op)
    assert drain_op(s) is not None and not idle(s)


@pytest.mark.parametrize("index", range(6))
def test_walks_end_drained_and_a_planted_round_fault_is_caught(index):
    """Every walk ends with the drain; the walk finds nothing on the fixed impl."""
    seq = walk(11, index, ImplBackend, "impl", Stats())
    assert seq.cfg.drain
    assert seq.failure is None, seq.failure.render()


def test_the_U8_round_is_caught_with_its_fault_planted():
    cfg = Config(page_size=2, num_pages=16, num_rows=4)
    ops = [O.OpenSession(1), O.SubmitTurn(1, 1, (1, 2, 4, 3), 1), O.SubmitTurn(1, 2, (1, 2), 6),
           O.ScheduleRound((1, 2))]
    assert run_ops(cfg, ops, ImplBackend(cfg)).ok
    with faults.planted("round_stub_nukes_slot"):
        f = run_ops(cfg, ops, ImplBackend(cfg)).failure
    assert f is not None and f.step == 3 and f.side == "impl"


def test_the_explorer_checks_progress_from_every_state_and_writes_a_replayable_trace(
        monkeypatch):
    """`Scope.progress`: every new state must drain to idle on the spec alone. With the
    drain made to leave the chunked request behind (and no rescue), the explorer reports
    P1 at the shortest depth, and its trace replays (with `drain`) to the same P1."""
    from kvcheck.explore import explore, preset_scope
    from kvcheck.explore.result import to_trace
    from kvcheck.replay import run_replay
    from kvcheck.spec import progress as PG
    sc = replace(preset_scope("check", "check-progress"), max_depth=5)
    assert not explore(sc).violations
    original = PG._prefill_ops

    def leave_the_chunked_behind(s, waiting):
        return (op for op in original(s, waiting)
                if s.reqs[op.rids[0] if isinstance(op, O.ScheduleRound) else op.rid].phase
                != "prefill")
    monkeypatch.setattr(PG, "_prefill_ops", leave_the_chunked_behind)
    monkeypatch.setattr(PG, "_unblock", lambda s, reqs, waiting, decoding: None)
    res = explore(sc)
    (v,) = res.violations
    assert v.id == "P1" and "prefill" in v.message
    trace = to_trace(res, v)
    assert trace.config.drain and trace.expect.invariant == "P1"
    again = run_replay(trace, "spec")
    assert again.failure is not None and again.failure.id == "P1"
    assert again.failure.step == trace.expect.step
