"""Pre-abort as upstream does it, recorded findings as a switch
(`Config.accept`), the queue-door refusal, the wrapper-era creation tick, and the
conformance step's refusal of shapes upstream cannot produce. Spec and impl/ only; the
real-release side is in test_sglang_adapter.py."""
from __future__ import annotations

import dataclasses

import pytest

from kvcheck.checker import run_ops
from kvcheck.trace import Trace, load
from kvcheck.spec import ops as O
from kvcheck.spec.config import Config, ConfigError
from kvcheck.spec.model import enabled, initial_state, step
from kvcheck.spec.view import abstract

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def run(cfg, ops):
    s = initial_state(cfg)
    outs = []
    for op in ops:
        s, out = step(s, op)
        outs.append(out)
    return s, outs


TURN1 = [O.OpenSession(1), O.SubmitTurn(1, 1, (11, 12, 13, 14, 15), 3), O.Schedule(1),
         O.Decode(1, 7), O.Decode(1, 8)]                       # turn 1 finishes at max_new


# -- pre_abort ------------------------------------------------------------------------

def test_pre_abort_of_a_fresh_turn_gets_the_one_token_prompt():
    s, _ = run(Config(num_pages=32), TURN1 + [O.SubmitTurn(1, 2, (21, 22), 3), O.PreAbort(2)])
    assert s.reqs[2].origin == (0,) and s.reqs[2].to_finish


def test_pre_abort_of_a_retracted_turn_keeps_its_arrays():
    ops = TURN1 + [O.SubmitTurn(1, 2, (21, 22), 4), O.Schedule(2), O.Decode(2, 9), O.Retract(2)]
    s, _ = run(Config(num_pages=32), ops)
    origin = s.reqs[2].origin
    s, _ = step(s, O.PreAbort(2))
    assert s.reqs[2].origin == origin == (11, 12, 13, 14, 15, 1, 7, 8, 21, 22)


def test_impl_pre_abort_matches_the_spec():
    from kvcheck.adapters.impl import ImplBackend
    cfg = Config(num_pages=32)
    ops = TURN1 + [O.SubmitTurn(1, 2, (21, 22), 3), O.PreAbort(2), O.Schedule(2)]
    assert run_ops(cfg, ops, ImplBackend(cfg)).ok


# -- Config.accept --------------------------------------------------------------------

def test_accept_is_validated_and_round_trips():
    with pytest.raises(ConfigError, match="config.accept"):
        Config(accept=("U99",))
    cfg = Config.from_json(Config(accept=("U1", "U2")).to_json() | {"accept": ["U1", "U2"]})
    assert cfg.accept == ("U1", "U2")
    assert Config.from_json({}).accept == ()


H3 = TURN1 + [O.SubmitTurn(1, 2, (21, 22), 3), O.Schedule(2), O.SubmitTurn(1, 3, (31,), 2),
              O.Schedule(3), O.SubmitTurn(1, 4, (41,), 2)]


def test_fixed_spec_keeps_the_running_turn_in_flight():
    s, outs = run(Config(num_pages=32), H3)
    assert s.sessions[1].inflight_rid == 2 and outs[-1] == "stub"


def test_accept_u1_takes_upstreams_unconditional_abort_req_and_shared_arrays():
    s, outs = run(Config(num_pages=32, accept=("U1",)), H3)
    assert outs[-1] == "ok"                       # turn 4 accepted while turn 2 runs
    assert s.sessions[1].inflight_rid == 4
    assert s.reqs[2].origin == s.reqs[4].origin   # _share_token_arrays rewrote turn 2's


def test_accept_u2_retract_runs_finish_req():
    ops = TURN1 + [O.SubmitTurn(1, 2, (21, 22), 4), O.Schedule(2), O.Decode(2, 9), O.Retract(2)]
    fixed, _ = run(Config(num_pages=32), ops)
    known, _ = run(Config(num_pages=32, accept=("U2",)), ops)
    assert fixed.sessions[1].inflight_rid == 2
    assert known.sessions[1].inflight_rid is None
    assert known.sessions[1].checkpoint == known.reqs[2].fill_ids


# S5 (docs/upstream-findings.md): a session holds one token array per checkpoint request,
# not one array (the trace kept as stateful_tests/upstream/u1-two-arrays-one-session-*).
TWO_ARRAYS = [O.OpenSession(1), O.SubmitTurn(1, 1, (11, 12), 3), O.Schedule(1),
              O.SubmitTurn(1, 2, (13,), 2), O.Schedule(2),            # stub detach: U1
              O.SubmitTurn(1, 3, (21, 22, 23, 24, 25, 26, 27), 1),    # no checkpoint: own array
              O.Decode(1, 7), O.Decode(1, 8),                         # turn 1 finishes
              O.SubmitTurn(1, 4, (31,), 2),                           # on turn 1's array
              O.Schedule(3),                                          # turn 3 finishes
              O.SubmitTurn(1, 5, (41,), 2)]                           # extends turn 3's array


@pytest.mark.parametrize("era", ["wrapper", "borrow"])
def test_accept_u1_a_new_turn_rewrites_only_req_nodes_array(era):
    s, outs = run(Config(num_pages=32, era=era, accept=("U1",)), TWO_ARRAYS)
    assert outs[-1] == "ok"
    assert s.reqs[4].origin == (11, 12, 1, 7, 8, 31)              # turn 1's array: untouched
    assert s.reqs[5].origin == (21, 22, 23, 24, 25, 26, 27, 1, 41)


def test_accept_u1_a_new_turn_rewrites_the_live_turn_on_its_array():
    ops = TWO_ARRAYS[:9] + [O.Schedule(4), O.Retract(4)]
    s, _ = run(Config(num_pages=32, accept=("U1", "U2")), ops)    # turn 4 is req_nodes' now
    s, _ = step(s, O.SubmitTurn(1, 6, (51,), 2))
    assert s.reqs[4].origin == s.reqs[6].origin == (11, 12, 1, 7, 8, 31, 1, 51)


def test_accept_u2_a_detached_turn_still_holds_its_slots_record():
    tr = load(ROOT / "stateful_tests/upstream/u2-detached-turn-keeps-slot-record-sglang-0.5.23.json")
    s, _ = run(tr.config, tr.ops)
    assert s.reqs[3].session is None                          # the next turn's finish_req
    assert s.reqs[3].committed == s.slots[2].committed == 13  # req.kv is slot.kv


def test_accept_u2_a_detached_turn_moves_the_checkpoint_as_it_finishes():
    tr = load(ROOT / "stateful_tests/upstream/u2-detached-turn-moves-checkpoint-sglang-0.5.23.json")
    s, _ = run(tr.config, tr.ops)
    assert 5 not in s.reqs                                    # finished at its last sample
    assert s.sessions[3].checkpoint == (5, 6, 3, 3, 1, 1, 3, 1, 3, 4, 2, 1)


STUB_DROP = [O.OpenSession(6), O.SubmitTurn(6, 9, (1, 3, 2, 3), 3),
             O.SubmitTurn(6, 10, (3, 4), 1), O.QueueReject(10)]


@pytest.mark.parametrize("accept,inflight", [((), 9), (("U6",), None)])
def test_accept_u6_queue_drop_of_a_stub(accept, inflight):
    s, outs = run(Config(era="borrow", accept=accept), STUB_DROP)
    assert outs[2] == "stub" and s.sessions[6].inflight_rid == inflight


def test_queue_reject_only_before_the_next_match():
    s, _ = run(Config(), [O.SubmitRequest(1, (1, 2, 3), 2)])
    assert enabled(s, O.QueueReject(1))
    s, _ = step(s, O.Schedule(1, admit=False))
    assert not enabled(s, O.QueueReject(1))


class SpecAsBackend:
    """A system under test that is the spec under its own config (for the checker), seen
    through the checker's view (`view_cfg`): a request's fill array is in the view only
    where `Config.aliases_token_arrays`."""

    def __init__(self, cfg, view_cfg=None):
        self.state = initial_state(cfg)
        self.view_cfg = view_cfg or cfg

    def apply(self, op):
        self.state, out = step(self.state, op)
        return out

    def abstract(self):
        a = abstract(self.state)
        if self.view_cfg.aliases_token_arrays:
            return a
        return dataclasses.replace(a, reqs=tuple(dataclasses.replace(r, fill=None) for r in a.reqs))

    def concrete_violations(self):
        return []


def test_checker_lets_through_what_the_spec_shows_itself():
    known = Config(num_pages=32, accept=("U1",))
    assert run_ops(known, H3, SpecAsBackend(known), backend_name="upstream").ok
    fixed = dataclasses.replace(known, accept=())
    res = run_ops(fixed, H3, SpecAsBackend(known, fixed), backend_name="upstream")
    assert res.failure is not None and res.failure.id == "I20" and res.failure.side == "upstream"


def test_known_trigger_skips_only_without_accept():
    from kvcheck.adapters.sglang.findings import known_trigger
    s, _ = run(Config(num_pages=32), TURN1 + [O.SubmitTurn(1, 2, (21, 22), 3)])
    busy = O.SubmitTurn(1, 3, (31,), 2)
    assert known_trigger("0.5.15")(s, busy) == "U1"
    assert known_trigger("0.5.15", ("U2",)) is None     # --accept: every path is driven


def test_accept_flag_is_refused_for_impl():
    from kvcheck.backends import BackendError, parse_accept
    assert parse_accept("U1,U2", "sglang:0.5.23") == ("U1", "U2")
    with pytest.raises(BackendError, match="--accept"):
        parse_accept("U1", "impl")
    with pytest.raises(BackendError, match="unknown finding"):
        parse_accept("U99", "sglang:0.5.23")


# -- S4: wrapper-era LRU tick of created nodes -----------------------------------------

def test_a_node_a_walk_creates_is_newer_than_the_walk():
    tr = load(ROOT / "stateful_tests/upstream/close-then-evict-sglang-0.5.15.json")
    s, _ = run(tr.config, tr.ops[:-1])
    by_path = {}
    for n in s.nodes.values():
        from kvcheck.spec.model import node_path
        by_path[node_path(s, n.id)] = n
    leaf, lower = by_path[(3, 3, 1)], by_path[(3, 3, 2, 4, 4, 3, 4, 4, 1)]
    assert leaf.tick > lower.tick
    s, _ = step(s, tr.ops[-1])                     # evict(2) takes the older lower half
    assert (3, 3, 1) in {node_path(s, n.id) for n in s.nodes.values()}


def test_impl_evicts_in_the_same_order():
    from kvcheck.adapters.impl import ImplBackend
    tr = load(ROOT / "stateful_tests/upstream/close-then-evict-sglang-0.5.15.json")
    assert run_ops(tr.config, tr.ops, ImplBackend(tr.config)).ok


# -- conformance: shapes upstream cannot produce are refused ----------------------------

def test_conformance_refuses_a_fresh_pre_abort_with_a_full_prompt():
    from kvcheck.adapters.sglang.conformance import shape_errors
    ops = TURN1 + [O.SubmitTurn(1, 2, (21, 22), 3), O.PreAbort(2)]
    tr = Trace(Config(num_pages=32), ops)
    assert shape_errors(tr) == []
    s, _ = run(tr.config, ops[:-1])
    full = abstract(s)                            # an upstream side that kept the prompt
    states = [None] * (len(ops) - 1) + [full]
    errs = shape_errors(tr, states)
    assert errs and "one-token prompt" in errs[0]


def test_conformance_refuses_an_operation_the_scheduler_cannot_issue():
    from kvcheck.adapters.sglang.conformance import shape_errors
    tr = Trace(Config(), [O.SubmitRequest(1, (1, 2), 2), O.Schedule(1), O.PreAbort(1)])
    errs = shape_errors(tr)
    assert errs and "step 2" in errs[0]
