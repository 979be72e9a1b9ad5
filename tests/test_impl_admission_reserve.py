"""impl/ under upstream's own PrefillAdder admission (`Config.admission` 'reserve' and
'reserve-held-rows': impl/prefill_budget.py, impl/schedule_policy.py
`_admit_reserve_round`) in lockstep with the spec (spec/admission.py): the reservations
and NO_TOKEN, a new chunk cut at a page boundary, the chunked request always continued
and cut by what the budget has left, the batch-full test before each match (the rows the
round's requests already hold: 0.5.23 only), 0.5.23's check of the chunk budget before the
match, priority preemption, the allocation that fails after admission, and a random sweep
drawn by kvcheck's walk. Each scenario first asserts, on the spec alone, that it reaches
the path it is about, then runs spec and impl in lockstep; the chunk cut by the budget,
which the spec's operations cannot reach, is checked on impl alone."""
from __future__ import annotations

import random
from dataclasses import replace

import pytest

from kvcheck.adapters.impl import ImplBackend
from kvcheck.checker import SPEC_ASSERTION, run_ops
from kvcheck.engines.configs import draw_config
from kvcheck.engines.draw import RandomDrawer
from kvcheck.engines.stats import Stats
from kvcheck.engines.walk import walk
from kvcheck.impl.scheduler import Scheduler
from kvcheck.spec import model as M
from kvcheck.spec import ops as O
from kvcheck.spec.admission import _Budget
from kvcheck.spec.allocator import available_size
from kvcheck.spec.config import Config
from kvcheck.spec.state import initial_state

ADMISSIONS = ("reserve", "reserve-held-rows")
ERAS = ("wrapper", "borrow")
PAGES = (1, 2, 4)


def backend(cfg: Config) -> ImplBackend:
    b = ImplBackend(cfg)
    assert b.sched.admission == cfg.admission
    return b


def lockstep(cfg: Config, ops: list) -> None:
    res = run_ops(cfg, ops, backend(cfg))
    assert res.ok, res.failure.render()


def spec_run(cfg: Config, ops: list):
    s, outs = initial_state(cfg), []
    for op in ops:
        s, out = M.step(s, op)
        outs.append(out)
    return s, outs


def toks(base: int, n: int) -> tuple:
    return tuple(range(base, base + n))


def phases(s) -> dict:
    return {rid: r.phase for rid, r in dict.items(s.reqs)}


every = pytest.mark.parametrize("admission", ADMISSIONS)
eras = pytest.mark.parametrize("era", ERAS)
pages = pytest.mark.parametrize("P", PAGES)


@every
@eras
@pages
def test_a_round_admits_while_the_reservations_fit_and_ends_on_no_token(admission, era, P):
    """Each admitted request reserves its page-ceiled extend, a page and max_new_tokens:
    the first (4P + 1 of 8P) is admitted, the second's input + output + page (4P + 1) is
    not below what is left (4P - 1: NO_TOKEN), and the third is never matched."""
    cfg = Config(page_size=P, num_pages=8, era=era, admission=admission)
    ops = [O.SubmitRequest(rid, toks(20 * rid, 2 * P), P + 1) for rid in (1, 2, 3)]
    ops.append(O.ScheduleRound((1, 2, 3)))
    s, outs = spec_run(cfg, ops)
    assert outs[-1] == "rejected"
    assert phases(s) == {1: "decode", 2: "queued", 3: "queued"}
    assert s.reqs[2].last_node is not None and s.reqs[3].last_node is None
    lockstep(cfg, ops)


@every
@eras
def test_the_round_ends_when_its_extends_reach_the_free_kv(admission, era):
    """`cur_rem_tokens`: a finished request 7 tokens past its max_new_tokens reserves -7,
    so a 31-token prompt is admitted against 32 free tokens with 6 of rem_total_tokens
    left; but its extend and page (32) reach the free KV, so the round ends (NO_TOKEN)
    before the 2-token request after it, which would fit rem_total_tokens but not the
    pool."""
    cfg = Config(page_size=1, num_pages=32, spec_enabled=True, max_drafts=7, era=era,
                 admission=admission)
    ops = [O.SubmitRequest(1, (1, 2), 2), O.Schedule(1), O.SpecDecode(1, 7, 7),
           O.SubmitRequest(2, toks(10, 31), 1), O.SubmitRequest(3, (50, 51), 1),
           O.ScheduleRound((2, 3))]
    s, outs = spec_run(cfg, ops)
    assert outs[-1] == "rejected" and phases(s) == {3: "queued"}
    assert s.reqs[3].last_node is None                           # never matched
    lockstep(cfg, ops)


@every
@pages
@pytest.mark.parametrize("short", [0, 1])
def test_a_request_is_admitted_only_strictly_below_the_remaining_tokens(admission, P, short):
    """input + remaining output + a page must stay strictly below rem_total_tokens: equal
    to the 8P free tokens it is refused, one token less it is admitted."""
    cfg = Config(page_size=P, num_pages=8, admission=admission)
    ops = [O.SubmitRequest(1, toks(10, 7 * P - 2 - short), 2), O.Schedule(1)]
    _, outs = spec_run(cfg, ops)
    assert outs[-1] == ("ok" if short else "rejected")
    lockstep(cfg, ops)


@every
def test_a_preempted_turn_keeps_its_row_so_the_request_waits(admission):
    """FIX(U9) under the reserve rule: the preempted streaming turn's row stays with its
    session's slot, so the request it was preempted for finds no row and waits."""
    cfg = Config(num_pages=32, num_rows=1, era="borrow", enable_priority_scheduling=True,
                 filter_before_prefill=True, admission=admission)
    ops = [O.OpenSession(1), O.SubmitTurn(1, 1, (1, 2, 3, 4), 8), O.Schedule(1),
           O.DecodeRound((1,)), O.SubmitRequest(2, (5, 6, 7), 2, priority=30), O.Schedule(2)]
    s, outs = spec_run(cfg, ops)
    assert outs[-1] == "rejected" and phases(s) == {1: "queued", 2: "queued"}
    assert s.slots[1].row is not None and not s.free_rows
    lockstep(cfg, ops)


@every
@eras
@pages
def test_a_new_chunk_ends_at_a_page_boundary_and_the_chunked_request_always_continues(
        admission, era, P):
    """The chunk budget 3P - 1 (2 at P = 1): a new request's chunk ends at 2P (a page
    boundary); its next round continues it by the whole budget, to 5P - 1 (no page
    boundary for P > 1), and spends it: 0.5.23 then matches no one, 0.5.14-0.5.22 match the
    next request (its match splits the first chunk's node at P) and refuse it (OTHER)."""
    cfg = Config(page_size=P, num_pages=16, chunk_size=2 * P + P - 1, era=era,
                 admission=admission)
    ops = [O.SubmitRequest(1, toks(10, 5 * P + 1), 2),
           O.SubmitRequest(2, toks(10, P) + toks(90, P), 2),
           O.ScheduleRound((1,)), O.ScheduleRound((1, 2))]
    s, outs = spec_run(cfg, ops[:3])
    assert outs[-1] == "ok" and s.reqs[1].extend_end == 2 * P and s.reqs[1].phase == "prefill"
    s, outs = spec_run(cfg, ops)
    assert outs[-1] == "rejected" and s.reqs[1].extend_end == 5 * P - 1
    matched = s.reqs[2].prefix_len
    assert matched == (P if admission == "reserve" else 0)
    lockstep(cfg, ops + [O.ScheduleRound((1, 2))])


@every
@eras
def test_a_chunk_the_free_kv_cannot_hold_fails_after_admission(admission, era):
    """A plain request that finished 7 tokens past its max_new_tokens (a speculative
    decode) stays in the running batch with -7 tokens of remaining output (no decode step
    filters it while a chunk is in flight), so the budget counts 7 tokens more than there
    are: a 36-token prompt is admitted against 32 free tokens, its third chunk does not fit
    and the allocation fails ("Prefill out of memory": the spec reaches upstream's
    assertion, impl raises it)."""
    cfg = Config(page_size=1, num_pages=32, chunk_size=16, spec_enabled=True, max_drafts=7,
                 era=era, admission=admission)
    ops = [O.SubmitRequest(1, (1, 2), 2), O.Schedule(1), O.SpecDecode(1, 7, 7),
           O.SubmitRequest(2, toks(10, 36), 1), O.Schedule(2), O.ScheduleRound((2,)),
           O.ScheduleRound((2,))]
    s, outs = spec_run(cfg, ops[:-1])
    assert outs[-2:] == ["ok", "ok"] and s.reqs[2].extend_end == 32
    assert _Budget(s).remaining_total(s) == 7 and available_size(s) + s.evictable_size == 0
    res = run_ops(cfg, ops, backend(cfg))
    assert res.failure is not None and res.failure.id == SPEC_ASSERTION
    assert res.failure.step == len(ops) - 1 and res.failure.side == "spec"
    assert "Prefill out of memory" in res.failure.details[0]
    b = backend(cfg)
    for op in ops[:-1]:
        b.apply(op)
    with pytest.raises(RuntimeError, match="Prefill out of memory"):
        b.apply(ops[-1])


@every
@eras
def test_impl_cuts_the_chunked_request_to_what_the_budget_leaves(admission, era):
    """impl alone (no lockstep: the spec starts no decode step while a chunk is in flight,
    and without one the budget never drops below the chunked request's remaining input):
    a speculative decode takes 8 tokens for a request that reserved 1, so the chunked
    request's next chunk is cut to the 2 tokens rem_total_tokens leaves; with nothing left
    it still continues, by its whole chunk (upstream: "otherwise, it will cause a memory
    leak")."""
    sched = Scheduler(page_size=1, num_pages=24, chunk_size=4, spec_enabled=True, era=era,
                      admission=admission)
    assert sched.submit_request(1, (1, 2), 10) == "ok" and sched.schedule(1) == "ok"
    assert sched.submit_request(2, toks(3, 10), 1) == "ok" and sched.schedule(2) == "ok"
    req = sched.reqs[2]
    assert (req.phase, req.extend_end) == ("prefill", 4)
    assert sched.spec_decode(1, 3, 0) == "ok"         # 18 free - 8 taken - 8 reserved
    assert sched.schedule_round([2]) == "ok" and req.extend_end == 6
    assert sched.token_to_kv_pool_allocator.available_size() + \
        sched.tree_cache.evictable_size() - 8 <= 0     # rem_total_tokens: nothing left
    assert sched.schedule_round([2]) == "ok" and req.extend_end == 10
    assert req.phase == "finished"                      # max_new_tokens 1: done at prefill


@every
@eras
@pytest.mark.parametrize("P", [2, 4])
def test_a_chunk_after_an_unaligned_prefix_ends_at_a_page_boundary_of_the_sequence(
        admission, era, P):
    """A session's next turn resumes after its last turn's KV, P + P/2 tokens (not a page
    boundary): its chunk of 2P tokens is cut back to the page boundary before it."""
    cfg = Config(page_size=P, num_pages=16, chunk_size=2 * P, era=era, admission=admission)
    prefix = P + P // 2
    ops = [O.OpenSession(1), O.SubmitTurn(1, 1, toks(10, prefix), 1), O.Schedule(1),
           O.SubmitTurn(1, 2, toks(20, 10), 2), O.Schedule(2)]
    s, outs = spec_run(cfg, ops)
    assert outs[-1] == "ok" and s.reqs[2].prefix_len == prefix
    assert s.reqs[2].extend_end == (prefix + 2 * P) // P * P
    lockstep(cfg, ops)


@every
@eras
def test_a_retracted_request_reserves_only_the_output_it_has_left(admission, era):
    """Retracted after 5 of its 10 output tokens, a request needs its 9-token fill, the 5
    tokens left and a page (15 < 16) where its whole max_new_tokens would not fit."""
    cfg = Config(page_size=1, num_pages=16, era=era, admission=admission)
    ops = [O.SubmitRequest(1, toks(10, 4), 10), O.Schedule(1)] + [O.Decode(1)] * 4 + \
        [O.Retract(1), O.Schedule(1)]
    s, outs = spec_run(cfg, ops)
    assert outs[-1] == "ok" and s.reqs[1].phase == "decode" and len(s.reqs[1].output) == 6
    lockstep(cfg, ops)


@every
@eras
@pages
def test_the_batch_is_full_before_the_match_when_the_free_rows_are_taken(admission, era, P):
    """Two rows, one held by the chunked request: 0.5.14-0.5.22 count it against the one
    free row and end the round before the first waiting request; 0.5.23 adds the rows the
    round's requests hold back and admits one more."""
    cfg = Config(page_size=P, num_pages=16, num_rows=2, chunk_size=3 * P, era=era,
                 admission=admission)
    ops = [O.SubmitRequest(1, toks(10, 4 * P), 2), O.Schedule(1),
           O.SubmitRequest(2, toks(50, P), 2), O.SubmitRequest(3, toks(70, P), 2),
           O.ScheduleRound((1, 2, 3))]
    s, outs = spec_run(cfg, ops)
    assert outs[-1] == "rejected"
    assert phases(s) == {1: "decode", 2: "decode" if admission == "reserve-held-rows" else
                         "queued", 3: "queued"}
    assert s.reqs[3].last_node is None                           # never matched
    lockstep(cfg, ops)


@every
@eras
@pages
def test_a_turn_on_its_sessions_row_holds_it(admission, era, P):
    """A session's next turn runs on the row its slot keeps: 0.5.23 does not count it
    against the one free row, 0.5.14-0.5.22 do."""
    cfg = Config(page_size=P, num_pages=24, num_rows=2, era=era, admission=admission)
    ops = [O.OpenSession(1), O.SubmitTurn(1, 1, toks(10, 2 * P), 1), O.Schedule(1),
           O.SubmitTurn(1, 2, toks(20, P), 2), O.SubmitRequest(3, toks(50, P), 2),
           O.SubmitRequest(4, toks(70, P), 2), O.ScheduleRound((2, 3, 4))]
    s, outs = spec_run(cfg, ops)
    assert outs[-1] == "rejected"
    assert phases(s) == {2: "decode", 3: "decode" if admission == "reserve-held-rows" else
                         "queued", 4: "queued"}
    lockstep(cfg, ops)


@every
@eras
@pages
@pytest.mark.parametrize("filter_before_prefill", [False, True])
def test_priority_scheduling_preempts_for_a_full_batch(admission, era, P, filter_before_prefill):
    """Both rows run priority-0 requests: a request of priority 30 preempts the latest
    entered (its remaining output released from the reservations, its row freed) and is
    admitted; one of priority 5 cannot preempt and ends the round."""
    cfg = Config(page_size=P, num_pages=24, num_rows=2, era=era, admission=admission,
                 enable_priority_scheduling=True, filter_before_prefill=filter_before_prefill)
    ops = [O.SubmitRequest(1, toks(10, 2 * P), 8), O.SubmitRequest(2, toks(30, 2 * P), 8),
           O.ScheduleRound((1, 2)), O.DecodeRound((1, 2)),
           O.SubmitRequest(3, toks(50, P), 2, priority=30),
           O.SubmitRequest(4, toks(70, P), 2, priority=5), O.ScheduleRound((3, 4))]
    s, outs = spec_run(cfg, ops)
    assert outs[-1] == "rejected"
    assert phases(s) == {1: "decode", 2: "queued", 3: "decode", 4: "queued"}
    assert s.reqs[2].is_retracted
    lockstep(cfg, ops)


@every
def test_a_finished_request_still_in_the_running_batch_reserves_its_remaining_output(admission):
    """`finish` (a stop token) leaves 7 of the request's 8 output tokens unproduced: until a
    decode step filters the batch the next round still reserves them, and a request that
    fits only without them is refused."""
    cfg = Config(page_size=1, num_pages=16, admission=admission)
    ops = [O.SubmitRequest(1, toks(10, 2), 8), O.Schedule(1), O.Finish(1),
           O.SubmitRequest(2, toks(100, 12), 1), O.Schedule(2)]    # 12 + 1 + 1 of 16 - 7
    s, outs = spec_run(cfg, ops)
    assert outs[-1] == "rejected"
    lockstep(cfg, ops)


@every
@pages
@pytest.mark.parametrize("priority", [False, True])
def test_a_streaming_turn_that_overshot_reserves_nothing_once_trimmed(admission, P, priority):
    """A speculative decode takes a turn 3 tokens past its max_new_tokens; the release
    trims its output back (`_trim_overshoot`), so the next round reserves 0 for it, and a
    request whose input, output and page reach exactly the free and evictable KV is
    refused."""
    cfg = Config(page_size=P, num_pages=12, spec_enabled=True, admission=admission,
                 enable_priority_scheduling=priority)
    ops = [O.OpenSession(1), O.SubmitTurn(1, 1, toks(10, 2 * P), 2), O.Schedule(1),
           O.SpecDecode(1, 3, 3)]
    s, _ = spec_run(cfg, ops)
    room = available_size(s) + s.evictable_size
    ops += [O.SubmitRequest(2, toks(100, room - P - 1), 1), O.Schedule(2)]
    _, outs = spec_run(cfg, ops)
    assert outs[-1] == "rejected"
    lockstep(cfg, ops)


def test_the_scheduler_takes_only_the_admissions_it_implements():
    with pytest.raises(ValueError, match="admission must be one of"):
        Scheduler(admission="tokens")
    with pytest.raises(ValueError, match="without the hybrid pools"):
        Scheduler(admission="reserve", swa_window=4)
    assert Scheduler(admission="reserve-held-rows").admission == "reserve-held-rows"


SWEEP = 80


@every
def test_random_walks_in_lockstep(admission):
    """kvcheck's walk (the fuzz engine's sequences) under configurations drawn as the fuzz
    campaign draws them (no hybrid pools, the tree on), with this admission: no
    divergence, no invariant broken, no exception, over SWEEP sequences ending in a drain."""
    failures = []
    for i in range(SWEEP):
        d = RandomDrawer(random.Random(f"admission-sweep:{admission}:{i}"))
        cfg = replace(draw_config(d, hybrid=False, tree_off=False), admission=admission)
        seq = walk(5, i, backend, "impl", Stats(), cfg=cfg)
        if seq.failure is not None:
            failures.append(f"sequence {i}, {cfg}:\n{seq.failure.render()}\n{seq.ops}")
    assert not failures, f"{len(failures)} of {SWEEP} failed; the first:\n{failures[0]}"
