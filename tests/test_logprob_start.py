"""`logprob_start_len`, the turn parameter upstream accepts that changes
the prefix match (`Req._compute_max_prefix_len`), in the vocabulary, spec and impl/."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from kvcheck.adapters.impl import ImplBackend
from kvcheck.checker import run_ops
from kvcheck.trace import load
from kvcheck.spec import ops as O
from kvcheck.spec.model import initial_state, node_path, step

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "stateful_tests/upstream/logprob-start-caps-match-sglang-0.5.15.json"


def tree_after(tr, ops):
    s = initial_state(tr.config)
    for op in ops:
        s, _ = step(s, op)
    return {node_path(s, n.id) for n in s.nodes.values() if n.id}


def test_a_logprob_start_caps_the_match():
    tr = load(TRACE)
    assert tr.ops[3].logprob_start_len == 2
    assert (1, 2) in tree_after(tr, tr.ops[:5])             # the match stopped at 2: a split
    plain = dataclasses.replace(tr.ops[3], logprob_start_len=None)
    assert (1, 2) not in tree_after(tr, tr.ops[:3] + [plain, tr.ops[4]])


def test_the_default_start_caps_a_retried_request_at_its_prompt():
    from kvcheck.spec.admission import _key_limit
    tr = load(TRACE)
    s = initial_state(tr.config)
    for op in tr.ops[:10]:                                  # ... retract(3)
        s, _ = step(s, op)
    r = s.reqs[3]
    assert r.seqlen - 1 > len(r.origin) == _key_limit(r)


@pytest.mark.parametrize("name", ["logprob-start-caps-match-sglang-0.5.15.json",
                                  "logprob-start-caps-match-sglang-0.5.23.json"])
def test_impl_caps_as_the_spec_does(name):
    tr = load(ROOT / "stateful_tests/upstream" / name)
    assert run_ops(tr.config, tr.ops, ImplBackend(tr.config)).ok


def test_impl_without_the_cap_diverges(monkeypatch):
    from kvcheck.impl.schedule_batch import Req
    tr = load(TRACE)
    monkeypatch.setattr(Req, "max_prefix_len", lambda self: len(self.fill_ids) - 1)
    res = run_ops(tr.config, tr.ops, ImplBackend(tr.config))
    assert not res.ok and res.failure.step == 4


@pytest.mark.parametrize("value,message", [
    (3, "logprob_start_len must be <= len(tokens) (2), got 3"),
    (-2, "logprob_start_len must be an integer in [-1, 16384], got -2")])
def test_out_of_range_starts_are_refused(value, message):
    with pytest.raises(O.OpError, match=message.replace("[", r"\[").replace("(", r"\(")
                       .replace(")", r"\)")):
        O.op_from_json({"op": "submit_request", "rid": 1, "tokens": [1, 2],
                        "max_new_tokens": 2, "logprob_start_len": value})
