"""Priority scheduling: `preempt_to_schedule` in the spec (its trigger, threshold, victim
order and token test), the two-phase finish, 0.5.23's filter before each round, the U9
fix, and the operations' `priority` field (docs/semantics.md, "Priority scheduling")."""
from __future__ import annotations

import pytest

from kvcheck.checker import run_ops
from kvcheck.spec import model as M
from kvcheck.spec import ops as O
from kvcheck.spec.admission import _Budget
from kvcheck.spec.allocator import NO_ROW
from kvcheck.spec.config import Config, ConfigError
from kvcheck.spec.state import initial_state

PRIO = Config(page_size=1, num_pages=32, num_rows=2, enable_priority_scheduling=True)


def run(cfg, ops):
    s = initial_state(cfg)
    outs = []
    for op in ops:
        s, out = M.step(s, op)
        outs.append(out)
    return s, outs


def phases(s) -> dict:
    return {rid: r.phase for rid, r in dict.items(s.reqs)}


TWO_RUNNING = [O.SubmitRequest(1, (1, 2, 3), 8), O.SubmitRequest(2, (4, 5, 6), 8),
               O.ScheduleRound((1, 2)), O.DecodeRound((1, 2))]
"""Both rows taken by two priority-0 requests that decode; request 2 entered last."""


def test_a_higher_priority_request_preempts_the_latest_entered_of_the_lowest():
    s, outs = run(PRIO, TWO_RUNNING + [O.SubmitRequest(3, (7, 8), 2, priority=30),
                                       O.Schedule(3)])
    assert outs[-1] == "ok"
    assert phases(s) == {1: "decode", 2: "queued", 3: "decode"}
    r2 = s.reqs[2]
    assert r2.is_retracted and r2.row is None and not r2.locked
    assert r2.entered == max(r.entered for r in dict.values(s.reqs))   # it re-entered last


def test_the_lowest_priority_goes_before_a_later_entry():
    ops = [O.SubmitRequest(1, (1, 2, 3), 8), O.SubmitRequest(2, (4, 5, 6), 8, priority=5),
           O.ScheduleRound((2, 1)), O.SubmitRequest(3, (7, 8), 2, priority=30), O.Schedule(3)]
    s, _ = run(PRIO, ops)
    assert phases(s) == {1: "queued", 2: "decode", 3: "decode"}


@pytest.mark.parametrize("priority,preempts", [(10, False), (11, True)])
def test_the_priority_must_exceed_by_more_than_the_threshold(priority, preempts):
    s, outs = run(PRIO, TWO_RUNNING + [O.SubmitRequest(3, (7, 8), 2, priority=priority),
                                       O.Schedule(3)])
    assert (outs[-1] == "ok") == preempts
    assert (phases(s)[2] == "queued") == preempts
    assert M.preempted_by(run(PRIO, TWO_RUNNING + [
        O.SubmitRequest(3, (7, 8), 2, priority=priority)])[0], O.Schedule(3)) == \
        ([2] if preempts else [])


def test_no_preemption_while_a_row_is_free():
    cfg = Config(page_size=1, num_pages=32, num_rows=3, enable_priority_scheduling=True)
    s, outs = run(cfg, TWO_RUNNING + [O.SubmitRequest(3, (7, 8), 2, priority=30),
                                      O.Schedule(3)])
    assert outs[-1] == "ok" and phases(s) == {1: "decode", 2: "decode", 3: "decode"}


def test_the_token_test_takes_victims_until_their_remaining_output_covers_the_request():
    """A pool of 16 pages: the two running requests hold 4 each (8 free, none evictable)
    and may each still produce 6; the new request has no fill yet. rem_total_tokens =
    8 - 12 = -4, so it is short by max_new_tokens + 4: 6 (one victim covers it), 7 (two
    do), 13 (two do not: no preemption, the round ends)."""
    cfg = Config(page_size=1, num_pages=16, num_rows=2, enable_priority_scheduling=True)
    for max_new, left in ((2, {1: "decode", 2: "queued"}), (3, {1: "queued", 2: "queued"}),
                          (9, {1: "decode", 2: "decode"})):
        s, outs = run(cfg, TWO_RUNNING + [O.SubmitRequest(3, (7, 8), max_new, priority=30),
                                          O.Schedule(3)])
        assert {r: p for r, p in phases(s).items() if r != 3} == left, max_new
        assert outs[-1] == ("rejected" if max_new == 9 else "ok"), max_new


def test_a_finished_request_stays_in_the_batch_until_the_next_decode_step():
    """The two-phase finish: request 1 finishes (a stop token) and is released, but its
    remaining output still counts in the next round's budget; a decode step filters it."""
    ops = TWO_RUNNING + [O.Finish(1)]
    s, _ = run(PRIO, ops)
    assert 1 not in s.reqs and s.unfiltered == (6,)
    assert _Budget(s).offset == 6 + 6          # request 2's remaining output too
    s, _ = run(PRIO, ops + [O.DecodeRound((2,))])
    assert s.unfiltered == ()


def test_0_5_23_filters_the_finished_requests_before_each_round():
    cfg = Config(page_size=1, num_pages=32, num_rows=2, enable_priority_scheduling=True,
                 filter_before_prefill=True)
    s, _ = run(cfg, TWO_RUNNING + [O.Finish(1), O.SubmitRequest(3, (7,), 1), O.Schedule(3)])
    assert s.unfiltered == ()
    s, _ = run(PRIO, TWO_RUNNING + [O.Finish(1), O.SubmitRequest(3, (7,), 1), O.Schedule(3)])
    assert s.unfiltered == (6,)


TURN_RUNNING = [O.OpenSession(1), O.SubmitTurn(1, 1, (1, 2, 3, 4), 8), O.Schedule(1),
                O.DecodeRound((1,)), O.SubmitRequest(2, (5, 6, 7), 2, priority=30)]
"""One row, held by a streaming turn that decodes; a plain request of priority 30 waits."""
ONE_ROW = Config(page_size=1, num_pages=32, num_rows=1, era="borrow",
                 enable_priority_scheduling=True, filter_before_prefill=True)


def test_u9_fixed_a_preempted_turn_keeps_its_row_so_the_request_waits():
    s, outs = run(ONE_ROW, TURN_RUNNING + [O.Schedule(2)])
    assert outs[-1] == "rejected"
    assert phases(s) == {1: "queued", 2: "queued"}
    assert s.slots[1].row is not None and not s.free_rows     # the slot kept the row


def test_u9_accepted_raises_upstreams_error():
    from dataclasses import replace
    s, _ = run(replace(ONE_ROW, accept=("U2", "U9")), TURN_RUNNING)
    with pytest.raises(M.ModelError, match=NO_ROW):
        M.step(s, O.Schedule(2))


def test_impl_agrees_with_the_spec_on_each_scenario():
    for cfg, ops in ((PRIO, TWO_RUNNING + [O.SubmitRequest(3, (7, 8), 2, priority=30),
                                           O.Schedule(3), O.Finish(1),
                                           O.SubmitRequest(4, (9,), 2, priority=30),
                                           O.Schedule(4)]),
                     (ONE_ROW, TURN_RUNNING + [O.Schedule(2)])):
        res = run_ops(cfg, ops)
        assert res.failure is None, res.failure.render()


def test_priority_is_a_quiet_field_and_needs_the_switch():
    plain = O.SubmitRequest(1, (1, 2), 3)
    assert "priority" not in plain.to_json() and "priority" not in str(plain)
    high = O.SubmitRequest(1, (1, 2), 3, priority=30)
    assert high.to_json()["priority"] == 30 and O.op_from_json(high.to_json()) == high
    assert "priority=30" in str(high)
    assert "enable_priority_scheduling" in M.refusal(initial_state(Config()), high)
    assert M.refusal(initial_state(PRIO), high) is None
    assert "enable_priority_scheduling" not in Config().to_json()
    assert Config.from_json(PRIO.to_json()) == PRIO


def test_priority_scheduling_is_refused_with_the_hybrid_pools():
    with pytest.raises(ConfigError, match="enable_priority_scheduling"):
        Config(enable_priority_scheduling=True, swa_window=2)


def test_the_drain_takes_the_queue_by_priority_then_entry():
    from kvcheck.spec.progress import drain_op
    s, _ = run(PRIO, [O.SubmitRequest(1, (1,), 1), O.SubmitRequest(2, (2,), 1, priority=5),
                      O.SubmitRequest(3, (3,), 1, priority=5)])
    assert drain_op(s) == O.ScheduleRound((2, 3, 1))


def test_a_round_names_the_waiting_requests_in_calc_priority_order():
    """`calc_priority` sorts the waiting queue by priority, then entry, before the round:
    a round naming them otherwise is refused, with the pair it puts the other way."""
    ops = [O.SubmitRequest(1, (1, 2, 3), 8), O.SubmitRequest(2, (4, 5, 6), 8, priority=5),
           O.SubmitRequest(3, (7, 8), 8, priority=5)]
    s, _ = run(PRIO, ops)
    assert M.refusal(s, O.ScheduleRound((1, 2))) == (
        "under priority scheduling calc_priority puts request 2 (priority 5, entry 2) before "
        "request 1 (priority 0, entry 1)")
    assert "puts request 2" in M.refusal(s, O.ScheduleRound((3, 2)))    # a tie: entry order
    assert M.enabled(s, O.ScheduleRound((2, 3, 1))) and M.enabled(s, O.ScheduleRound((3, 1)))
    fcfs = [O.SubmitRequest(rid, (rid, 9), 8) for rid in (1, 2, 3)]
    assert M.enabled(run(Config(page_size=1, num_pages=32, num_rows=2), fcfs)[0],
                     O.ScheduleRound((3, 1, 2)))     # FCFS alone: the order is left open
