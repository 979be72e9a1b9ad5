"""`Config.admission` 'reserve' / 'reserve-held-rows' in the spec: upstream's own
PrefillAdder budget (the reservation of input, output and a page; NO_TOKEN; the running
batch's remaining output; the chunk cut at the sequence's page boundary; the chunked
request always continued; the rows counted before each match), each figure worked out by
hand from the release's code (spec/admission.py cites the lines)."""
from dataclasses import replace

import pytest

from kvcheck.spec import ops as O
from kvcheck.spec.config import Config, ConfigError
from kvcheck.spec.model import ModelError, refusal, step
from kvcheck.spec.pages import reserve_chunk_end
from test_rounds import plain, run

P1 = Config(page_size=1, num_pages=16, num_rows=4, max_context_len=32, era="borrow",
            admission="reserve-held-rows", filter_before_prefill=True)
BOTH = ("reserve", "reserve-held-rows")


@pytest.mark.parametrize("admission", BOTH)
def test_a_request_is_admitted_only_strictly_below_what_is_left(admission):
    # 16 tokens free: a 12-token prompt with max_new 3 reserves 12 + 3 + 1 = 16 (refused:
    # `total_tokens >= rem_total_tokens`); with max_new 2, 15 < 16 (admitted). The page
    # rule admits both (12 tokens fit).
    cfg = replace(P1, admission=admission)
    _, outs = run(cfg, [plain(1, 12, max_new=3), O.Schedule(1)])
    assert outs[-1] == "rejected"
    _, outs = run(cfg, [plain(1, 12, max_new=2), O.Schedule(1)])
    assert outs[-1] == "ok"
    _, outs = run(replace(cfg, admission="pages"), [plain(1, 12, max_new=3), O.Schedule(1)])
    assert outs[-1] == "ok"


@pytest.mark.parametrize("admission", BOTH)
def test_the_running_batch_keeps_its_remaining_output(admission):
    # request 1 (4 tokens, max_new 9) runs with one output token: 8 more are reserved.
    # 16 - 5 (its KV) = 11 free; request 2 (3 tokens, max_new 1) needs 3 + 1 + 1 = 5,
    # and 5 >= 11 - 8 = 3: refused. Once request 1 has finished (and been filtered),
    # request 2 fits.
    cfg = replace(P1, admission=admission)
    s, outs = run(cfg, [plain(1, 4, max_new=9), O.Schedule(1), plain(2, 3, max_new=1, first=20),
                        O.Schedule(2)])
    assert outs[-1] == "rejected" and s.reqs[2].phase == "queued"
    s, outs = run(cfg, [plain(1, 4, max_new=9), O.Schedule(1), plain(2, 3, max_new=1, first=20),
                        O.Finish(1), O.Schedule(2)])
    assert outs[-1] == "ok"


def test_a_finished_request_still_in_the_batch_is_reserved_until_filtered():
    # request 1 finished with 1 of 9 outputs: its 4 tokens are now in the tree
    # (evictable), 16 tokens in all. 0.5.15 (no filter before the round) still counts its
    # 8 remaining outputs: request 2 (6 + 1 + 1 = 8) is refused; 0.5.23 filters it first.
    ops = [plain(1, 4, max_new=9), O.Schedule(1), plain(2, 6, max_new=1, first=20),
           O.Finish(1), O.Schedule(2)]
    old = replace(P1, admission="reserve", era="wrapper", filter_before_prefill=False)
    s, outs = run(old, ops[:-1])
    assert s.unfiltered == (8,)
    _, outs = run(old, ops)
    assert outs[-1] == "rejected"
    _, outs = run(P1, ops)
    assert outs[-1] == "ok"


P2 = replace(P1, page_size=2, num_pages=8)


@pytest.mark.parametrize("admission", BOTH)
def test_no_token_ends_the_round_after_the_request_that_spent_it(admission):
    # 16 tokens, P = 2. Request 1 (6 tokens, max_new 2): 6 + 2 + 2 = 10 < 16, charged
    # 6 + 2 + 2 = 10: 6 left. Request 2 (1 token, max_new 1): 1 + 1 + 2 = 4 < 6, charged
    # its page-ceiled extend 2 + 2 + 1 = 5: 1 left, budget_state() CONTINUE, and request 3
    # (1 + 1 + 2 = 4 >= 1) is matched and refused. With request 2's max_new 2 (5 < 6,
    # charged 6: nothing left) NO_TOKEN ends the round before request 3's match.
    cfg = replace(P2, admission=admission)
    for max_new, matched in ((1, True), (2, False)):
        s, outs = run(cfg, [plain(1, 6, max_new=2), plain(2, 1, max_new=max_new, first=20),
                            plain(3, 1, max_new=1, first=40), O.ScheduleRound((1, 2, 3))])
        assert outs[-1] == "rejected"       # 2 decodes, or finished at its first token
        assert s.reqs[1].phase == "decode" and s.reqs.get(2, None) is None or \
            s.reqs[2].phase == "decode"
        assert s.reqs[3].phase == "queued"
        assert (s.reqs[3].last_node is not None) is matched


@pytest.mark.parametrize("prefix, n, chunk, P, end", [
    (0, 7, 8, 4, 7),        # ceil(7) = 8 fits the chunk: the whole input
    (0, 20, 8, 4, 8),       # cut to whole pages
    (2, 20, 8, 4, 8),       # (2 + 8) // 4 * 4: the sequence's page boundary, 6 tokens
    (2, 20, 9, 4, 8),       # the chunk's slack below a page is not used
    (0, 20, 3, 4, 0),       # 3 // 4 * 4 = 0: nothing (AddReqResult.OTHER)
    (3, 20, 4, 4, 4),       # one token to the boundary
    (5, 9, None, 2, 9),     # no chunked prefill
])
def test_the_chunk_ends_at_a_page_boundary_of_the_sequence(prefix, n, chunk, P, end):
    assert reserve_chunk_end(prefix, n, chunk, P) == end


def _chunked(admission, **kw):
    # 16 tokens, chunk 4: request 1 (10 tokens, max_new 1: 10 + 1 + 1 < 16) is cut at 4
    cfg = replace(P1, admission=admission, chunk_size=4, **kw)
    return cfg, [plain(1, 10, max_new=1), O.ScheduleRound((1,))]


def _squeezed(admission, max_new):
    """Request 2 (2 tokens) runs; request 1 (8 tokens, max_new 1) is admitted in chunks of
    4 (8 + 1 + 1 < 16 - 2 - (max_new - 1)); then a speculative step of request 2
    over-allocates 8 tokens. Under 'reserve' no decode step runs while a chunk is in
    flight (`_prefill_first`), so the state is reached under 'pages' and the round run
    under `admission`."""
    cfg = replace(P1, chunk_size=4, spec_enabled=True, admission="pages")
    s, _ = run(cfg, [plain(2, 2, max_new=max_new, first=30), O.Schedule(2),
                     plain(1, 8, max_new=1), O.ScheduleRound((1,)),
                     O.SpecDecode(2, 3, 0, 5)])
    s.cfg = replace(cfg, admission=admission)
    return s


@pytest.mark.parametrize("admission", BOTH)
def test_the_chunked_request_always_continues_cut_to_what_is_left(admission):
    # 16 - 2 - 4 - 8 = 2 free; request 2 (max_new 3, 2 outputs) keeps 1 reserved: the
    # chunk is cut to min(4, 2 - 1) = 1 token, not a page multiple
    s = _squeezed(admission, max_new=3)
    s, out = step(s, O.ScheduleRound((1,)))
    assert out == "ok" and s.reqs[1].extend_end == 4 + 1


@pytest.mark.parametrize("admission", BOTH)
def test_a_chunk_taken_with_nothing_left_fails_as_upstream_does(admission):
    # max_new 4: 2 reserved, 2 - 2 = 0 left: rem_total_tokens <= 0 takes the whole chunk
    # (4 tokens), which 2 free tokens cannot hold: "Prefill out of memory"
    s = _squeezed(admission, max_new=4)
    with pytest.raises(ModelError, match="Prefill out of memory"):
        step(s, O.ScheduleRound((1,)))


@pytest.mark.parametrize("admission", BOTH)
def test_the_chunked_request_continues_only_in_a_round(admission):
    cfg, ops = _chunked(admission)
    s, _ = run(cfg, ops + [plain(2, 2, first=30)])
    assert "continues in a prefill round" in refusal(s, O.PrefillChunk(1))
    assert "chunked request in flight" in refusal(s, O.Schedule(2))
    assert "always continues" in refusal(s, O.ScheduleRound((1, 2), limit=0))
    assert refusal(s, O.ScheduleRound((1, 2), limit=1)) is None
    s, _ = run(cfg, [plain(2, 2, max_new=2, first=30), O.Schedule(2)] + ops)
    assert s.reqs[1].phase == "prefill" and s.reqs[2].phase == "decode"
    assert "prefill rounds come first" in refusal(s, O.Decode(2, 5))
    assert "prefill rounds come first" in refusal(s, O.DecodeRound((2,)))
    assert "prefill rounds come first" in refusal(s, O.Retract(2))
    assert refusal(s, O.Finish(2)) is None      # a decode result already under way


def test_the_rows_are_counted_before_the_match_by_release():
    # one row free, one held by session 1's slot: a turn of session 1 then a plain
    # request. 0.5.14-0.5.22 count every admitted request against the free rows: the
    # turn fills the round and the plain request is never matched. 0.5.23 adds back the
    # row the turn holds: both are admitted.
    base = replace(P1, num_rows=2, num_pages=32)
    ops = [O.OpenSession(1), O.SubmitTurn(1, 1, (1, 2, 3), 2), O.Schedule(1), O.Decode(1, 7),
           O.SubmitTurn(1, 2, (4, 5), 2), plain(3, 3, first=20),
           O.ScheduleRound((2, 3))]
    s, outs = run(replace(base, admission="reserve"), ops)
    assert outs[-1] == "rejected" and s.reqs[3].last_node is None
    s, outs = run(replace(base, admission="reserve-held-rows"), ops)
    assert outs[-1] == "ok"


def test_a_spent_chunk_ends_the_round_before_the_match_only_on_0_5_23():
    # the chunked request's continuation spends the chunk (4 of 4): 0.5.23 checks
    # `budget_state() == OTHER` before the next request; 0.5.15 matches it first (its
    # chunk is then cut to nothing: OTHER)
    for admission, matched in (("reserve", True), ("reserve-held-rows", False)):
        cfg, ops = _chunked(admission)
        s, outs = run(cfg, ops + [plain(2, 3, first=30), O.ScheduleRound((1, 2))])
        assert outs[-1] == "rejected"
        assert (s.reqs[2].last_node is not None) is matched, admission


@pytest.mark.parametrize("bad", [dict(swa_window=2), dict(mamba_slots=2),
                                 dict(disable_radix_cache=True)])
def test_the_rule_is_refused_with_the_hybrid_pools_and_a_disabled_tree(bad):
    with pytest.raises(ConfigError, match="config.admission"):
        replace(P1, **bad)


@pytest.mark.parametrize("filtered", [False, True])
def test_u10_a_request_a_speculative_step_took_past_its_max_new_tokens_reserves_less_than_nothing(
        filtered):
    """U10 (docs/upstream-findings.md): a streaming session holds 13 of the pool's 32
    tokens; a plain request with max_new_tokens 2 accepts 5 tokens in one speculative step
    (6 output tokens) and finishes, still in the running batch: -4 remaining output. A
    20-token request against 19 free and evictable tokens then reserves 20 + 1 + 1 = 22
    < 19 + 4, is admitted, and its allocation fails (upstream's "out of memory"
    RuntimeError, where the spec stops). Filtering the finished request out first
    (0.5.23) refuses it."""
    trace = "u10-overshoot-reserve-prefill-oom-sglang-0.5.15.json"
    from kvcheck.errors import ROOT
    from kvcheck.trace import load
    tr = load(ROOT / "stateful_tests" / "upstream" / trace)
    cfg = replace(tr.config, filter_before_prefill=filtered)
    s, _ = run(cfg, tr.ops[:-1])
    assert tuple(s.unfiltered) == (-4,)        # the finished request, still in the batch
    if filtered:
        assert step(s, tr.ops[-1])[1] == "rejected"
    else:
        with pytest.raises(ModelError, match="Prefill out of memory"):
            step(s, tr.ops[-1])
