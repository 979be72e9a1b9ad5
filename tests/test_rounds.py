"""Scheduling rounds in the spec: the prefill round's shared budgets, the decode round's
retraction order, U7's interleaving, and `schedule` as the round of one."""
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvcheck import explore as X
from kvcheck.spec import ops as O
from kvcheck.spec.config import Config
from kvcheck.spec.finish import retraction_order
from kvcheck.spec.model import ModelError, enabled, refusal, step
from kvcheck.spec.state import initial_state

ROOT = Path(__file__).resolve().parent.parent
BORROW = Config(page_size=2, num_pages=8, num_rows=3, max_context_len=32, era="borrow")


def run(cfg, ops):
    s = initial_state(cfg)
    outs = []
    for op in ops:
        assert enabled(s, op), refusal(s, op)
        s, out = step(s, op)
        outs.append(out)
    return s, outs


def plain(rid, n, max_new=4, first=1):
    return O.SubmitRequest(rid, tuple(range(first, first + n)), max_new)


def test_the_row_budget_is_shared_by_the_round():
    cfg = replace(BORROW, num_rows=1)
    s, outs = run(cfg, [plain(1, 3), plain(2, 3, first=10), O.ScheduleRound((1, 2))])
    assert outs[-1] == "rejected"
    assert s.reqs[1].phase == "decode" and s.reqs[2].phase == "queued"
    assert not s.reqs[2].locked and s.reqs[2].row is None


def test_the_kv_budget_counts_what_the_round_admitted_before():
    # 8 pages of 2 tokens; a 7-token prompt takes 4: two fit in one round, a third only
    # alone
    cfg = replace(BORROW, num_rows=3)
    s, outs = run(cfg, [plain(1, 7), plain(2, 7, first=20), plain(3, 7, first=40),
                        O.ScheduleRound((1, 2, 3))])
    assert outs[-1] == "rejected"
    assert [s.reqs[r].phase for r in (1, 2, 3)] == ["decode", "decode", "queued"]
    alone = initial_state(cfg)
    for op in (plain(3, 7, first=40), O.Schedule(3)):
        alone, out = step(alone, op)
    assert out == "ok"      # alone it fits: the refusal above is the round's budget


def test_the_chunk_budget_ends_the_round_and_cuts_the_request_that_crosses_it():
    cfg = replace(BORROW, chunk_size=4)
    s, outs = run(cfg, [plain(1, 3), plain(2, 5, first=10), O.ScheduleRound((1, 2))])
    # request 1 charges ceil(3 / 2) * 2 = 4 tokens: the chunk is spent, 2 is not matched
    assert outs[-1] == "rejected" and s.reqs[2].last_node is None
    s, outs = run(cfg, [plain(1, 2), plain(2, 5, first=10), O.ScheduleRound((1, 2))])
    # request 1 takes 2, request 2 gets the 2 left: the new chunked request
    assert outs[-1] == "ok"
    assert s.reqs[2].phase == "prefill" and s.reqs[2].extend_end == 2


def test_a_round_continues_the_chunked_request_first():
    cfg = replace(BORROW, chunk_size=4)
    s, _ = run(cfg, [plain(1, 7), O.Schedule(1), plain(2, 2, first=10)])
    assert s.reqs[1].phase == "prefill"
    assert not enabled(s, O.ScheduleRound((2,)))        # the chunked request comes first
    s, out = step(s, O.ScheduleRound((1, 2)))
    assert out == "rejected"        # 1 takes its last 3 tokens (4 with the page): spent
    assert s.reqs[1].phase == "decode" and s.reqs[2].phase == "queued"


def test_retract_decode_victims_fewest_outputs_then_longest_prompt():
    def req(rid, prompt, outputs):
        return SimpleNamespace(rid=rid, origin=(0,) * prompt, output=[0] * outputs)
    order = [r.rid for r in retraction_order([req(1, 2, 3), req(2, 4, 1), req(3, 1, 1)])]
    assert order == [1, 3, 2]       # kept first: most output; then the shorter prompt
    ties = [r.rid for r in retraction_order([req(4, 2, 1), req(5, 2, 1)])]
    assert ties == [4, 5]           # a stable sort: the later one in the batch is popped


def test_a_short_decode_round_retracts_in_that_order():
    # 5 one-token pages: three 1-token prompts decode until the pool is short
    cfg = Config(page_size=1, num_pages=5, num_rows=3, max_context_len=32)
    ops = [plain(1, 1, 8), plain(2, 1, 8, first=5), O.ScheduleRound((1, 2)),
           O.DecodeRound((1, 2))]
    s, outs = run(cfg, ops)
    assert outs == ["ok", "ok", "ok", "ok"]
    s, out = step(s, O.DecodeRound((2, 1)))
    assert out == "oom"
    # equal outputs and prompts: the stable order keeps batch order, so the later one in
    # the batch (1 here) is popped
    assert s.reqs[1].phase == "queued" and s.reqs[1].is_retracted
    assert s.reqs[2].phase == "decode"


U7_OPS = [O.OpenSession(1), O.SubmitTurn(1, 1, (1, 2, 3), 4), O.SubmitTurn(1, 2, (4,), 4),
          O.ScheduleRound((1, 2))]


def test_u7_fixed_the_stub_leaves_the_turns_slot_alone():
    s, outs = run(BORROW, U7_OPS)
    assert outs[2] == "stub" and outs[3] == "ok"
    assert 2 not in s.reqs                          # the stub finished (aborted)
    slot = s.slots[1]
    assert s.reqs[1].row == slot.row                 # turn 1 still runs on its slot


def test_u7_accepted_stops_at_upstreams_assertion():
    with pytest.raises(ModelError, match="already has a slot"):
        run(replace(BORROW, accept=("U7",)), U7_OPS)


def test_schedule_is_the_round_of_one():
    """On every state of a small scope, `schedule(rid, admit)` and
    `schedule_round((rid,), None or 0)` give the same state and outcome."""
    seen = 0
    for s in X.reachable_states(replace(X.preset_scope("tiny", "tiny"), max_depth=6)):
        for rid, r in sorted(dict.items(s.reqs)):
            if r.phase != "queued" or not enabled(s, O.Schedule(rid)):
                continue
            for admit in (True, False):
                a, out_a = step(s, O.Schedule(rid, admit))
                b, out_b = step(s, O.ScheduleRound((rid,), None if admit else 0))
                assert out_a == out_b and X.state_key(a) == X.state_key(b)
                seen += 1
    assert seen > 50


@pytest.mark.parametrize("version", ["0.5.22", "0.5.23"])
def test_u7_the_release_raises_the_assertion_the_spec_stops_at(version):
    """U7 on the release (docs/upstream-findings.md): four client requests; upstream's own
    `prepare_for_extend` of the round raises at the stub's `take`. Without `--accept U7`
    that is an E1 on the release where the fixed spec goes on; with it the spec stops at
    the same assertion and the release, alone on that step, raises it ("the same")."""
    from kvcheck.checker import RELEASE_SAME
    from kvcheck.replay import run_replay
    from kvcheck.trace import load
    if not (ROOT / f".venv-sglang-{version}" / "bin" / "python").exists():
        pytest.skip(f"no .venv-sglang-{version} (make sglang-env SGLANG_VERSIONS={version})")
    up = ROOT / "stateful_tests" / "upstream"
    res = run_replay(load(up / f"u7-stub-in-first-round-sglang-{version}.json"), f"sglang:{version}")
    assert res.failure is not None and (res.failure.id, res.failure.step) == ("E1", 3)
    assert "already has a slot" in res.failure.render()
    res = run_replay(load(up / f"u7-stub-in-first-round-accepted-sglang-{version}.json"),
                     f"sglang:{version}")
    b = res.beyond
    assert res.failure is None and (b.step, b.reason) == (3, "ModelError")
    assert b.release == RELEASE_SAME, b.release
