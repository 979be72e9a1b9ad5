"""upstream's `full_untruncated_fill_ids` in the spec (docs/upstream-findings.md O1, O2):
create_req's `carry_fill`, `refresh_fill_ids`' length rule, and what reads the array
(the match, the extend's forward, the inserts). Spec only: the same traces run in
lockstep on the releases in tests/test_sglang_adapter.py and `make check-sglang`."""
from __future__ import annotations

from pathlib import Path

import pytest

from kvcheck.engines.stats import Stats
from kvcheck.checker import run_ops
from kvcheck.engines.walk import walk
from kvcheck.trace import load
from kvcheck.spec import ops as O
from kvcheck.spec.config import Config
from kvcheck.spec.invariants import check_state
from kvcheck.spec.model import step
from kvcheck.spec.token_arrays import carried_fill, refreshed_fill
from kvcheck.spec.state import initial_state
from kvcheck.spec.view import abstract

UP = Path(__file__).resolve().parents[1] / "stateful_tests" / "upstream"


def test_carried_fill_trims_then_extends_by_the_output_not_yet_baked():
    # committed origin (1, 2), fill holds one output already: the rest and the new input
    assert carried_fill((1, 2, 7, 9), 3, 2, (7, 8), (5,)) == ((1, 2, 7, 8, 5), True)
    # whatever the array grew past committed_fill_len is trimmed first
    assert carried_fill((1, 2, 3, 3, 3), 2, 2, (7,), (5,)) == ((1, 2, 7, 5), True)
    # more baked than the output: not carried, the array is still trimmed
    assert carried_fill((1, 2, 7, 8, 9), 5, 2, (7,), (5,)) == ((1, 2, 7, 8, 9), False)
    assert carried_fill((1, 2, 7), 3, 3, (), (5,)) == ((1, 2, 7, 5), True)
    assert carried_fill((1,), 1, 2, (7,), (5,)) == ((1,), False)      # baked < 0


def test_refreshed_fill_trusts_lengths_only():
    assert refreshed_fill((1, 2), (1, 2), [7, 8]) == (1, 2, 7, 8)
    assert refreshed_fill((1, 2, 7), (1, 2), [7, 8]) == (1, 2, 7, 8)
    # a stale array of the right length is extended as if it were right
    assert refreshed_fill((1, 9, 9), (1, 2), [7, 8]) == (1, 9, 9, 8)
    assert refreshed_fill((), (1, 2), [7]) is None                    # fresh: rebuilt
    assert refreshed_fill((1, 2, 7, 8, 9), (1, 2), [7, 8]) is None    # more than the output
    assert refreshed_fill((1,), (1, 2), []) is None                   # the origin grew


def _spec_run(name: str, upto: int):
    """The spec alone over a kept upstream trace: the state after step upto - 1 and the
    invariant violations (id, owner) after each step."""
    tr = load(UP / name)
    s = initial_state(tr.config)
    seen = []
    for op in tr.ops[:upto]:
        s, _ = step(s, op)
        seen.append({(v.id, v.owner) for v in check_state(abstract(s), tr.config)})
    return s, seen


def test_o2_stale_fill_shows_on_the_row_then_the_finish_double_inserts():
    """0.5.15, accepted U1/U2/U3: turn 14's re-prefill (step 25) runs on its stale fill
    (I26 on its row, as on the release); finish(14) keys by origin + output (0.5.15
    `cache_finished_req`), so the page goes under a second node: I2, as on the release."""
    s, seen = _spec_run("o2-stale-fill-ids-sglang-0.5.15.json", 27)
    assert seen[24] == set()
    assert seen[25] == {("I26", "req 14")}
    assert "I2" in {i for i, _ in seen[26]}


def test_o1_reprefill_inserts_under_the_stale_fill_key():
    """0.5.23, accepted U1/U2: detached, twice-retracted turn 6 re-prefilled at step 19
    keys its node and runs its forward by its carried, stale fill array."""
    s, seen = _spec_run("o1-carry-fill-key-sglang-0.5.23.json", 20)
    assert ("I26", "req 6") in seen[19]
    r = dict.get(s.reqs, 6)
    assert r.fill != r.fill_ids[:len(r.fill)]    # the sampled token is not in it yet
    stale = [n.path for n in dict.values(s.nodes)
             if n.path and n.path == r.fill[:len(n.path)] and n.path != r.fill_ids[:len(n.path)]]
    assert stale, "no node keyed by req 6's fill array"


def test_o2_chunk_checkpoint_keys_by_the_stale_fill():
    """0.5.23, accepted U1/U2/U6/M2: retracted, detached turn 7's next chunk (step 16)
    checkpoints under its fill (..., 8, 1, 1), not origin + output (..., 8, 1, 5)."""
    s, _ = _spec_run("o2-stale-fill-chunk-key-sglang-0.5.23.json", 17)
    paths = {n.path for n in dict.values(s.nodes)}
    head = (1, 1, 1, 4, 3, 3, 1, 1, 1, 4, 1, 1, 5, 6, 7, 8)
    assert head + (1, 1) in paths and head + (1, 5) not in paths


def test_carry_follows_req_nodes_request_to_its_rebuilt_array():
    """0.5.15, accepted U1/U2/U3: turn 20, req_nodes' request after its retract,
    rebuilds its fill at the re-prefill (step 13); create_req (step 14) carries that new
    array, so the array retracted turn 11 still holds is left as it was."""
    before, _ = _spec_run("u2-carry-follows-rebuilt-fill-sglang-0.5.15.json", 14)
    after, _ = _spec_run("u2-carry-follows-rebuilt-fill-sglang-0.5.15.json", 15)
    assert dict.get(after.reqs, 11).fill == dict.get(before.reqs, 11).fill
    assert dict.get(after.reqs, 24).fill_of == dict.get(after.reqs, 20).fill_of is not None
    assert dict.get(after.reqs, 24).fill == dict.get(after.reqs, 24).origin


def test_a_reused_rid_is_not_req_nodes_request():
    """Found by `kvcheck explore` (preset check): a new turn reusing the rid of its
    session's req_nodes' request (finished) rebuilds its fill after a pre_abort; the
    session must keep the array req_nodes' request left, or the next turns carry the
    stub's (0,) and a full prefill's forward writes KV of token 0 (I26)."""
    cfg = Config(page_size=2, num_pages=4, num_rows=2, max_context_len=16, overlap=True)
    ops = [O.OpenSession(1), O.SubmitTurn(1, 1, (2,), 1), O.Schedule(1, admit=True),
           O.SubmitTurn(1, 1, (2,), 1), O.PreAbort(1), O.Schedule(1, admit=False),
           O.SubmitTurn(1, 2, (2,), 2), O.Schedule(2, admit=True), O.AbortRunning(2),
           O.SubmitTurn(1, 2, (2,), 2), O.Schedule(2, admit=True)]
    res = run_ops(cfg, ops)
    assert res.ok, res.failure.render()


@pytest.mark.parametrize("era", ["wrapper", "borrow"])
def test_without_u1_u2_the_fill_reads_as_origin_plus_output(era):
    """The fixed spec keeps one array per request: after every extend the acting
    request's fill array, which the forward read up to extend_end, is its origin + output
    (less a token the step sampled; no other live request holds the array)."""
    def observe(before, op, outcome, after, paths):
        r = dict.get(after.reqs, getattr(op, "rid", None))
        if op.name in ("schedule", "prefill_chunk") and outcome == "ok" and r is not None:
            assert r.fill == r.fill_ids[:len(r.fill)] and len(r.fill) >= r.extend_end, \
                (op, r.fill, r.fill_ids)
    for i in range(40):
        walk(3, i, None, "spec", Stats(), config_kw={"era": era}, observe=observe)
