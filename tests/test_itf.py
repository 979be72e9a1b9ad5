"""ITF export: what itf-py (PyPI) reads back from `kvcheck replay --itf` is the replay's
own sequence of states, operations and outcomes."""
from __future__ import annotations

import json
from pathlib import Path

import itf_py
import pytest

from kvcheck.impl import faults
from kvcheck import cli
from kvcheck.itf import itf_trace, value
from kvcheck.replay import run_replay
from kvcheck.trace import load

ROOT = Path(__file__).resolve().parents[1]
REG = ROOT / "stateful_tests" / "regressions"


def _tag(v):
    return type(v).__name__


def _opt(v):
    """An optional field read back: the variant's payload, or None for its empty tag."""
    return None if v.value == "U_OF_UNIT" else v.value


def _anchor(v):
    t = _tag(v)
    return {"NoAnchor": None, "Root": ("root",)}.get(t, (t.lower(), _seq(_opt(v))))


def _seq(x):
    return tuple(_seq(y) for y in x) if isinstance(x, list) else x


def _holes(m, n):
    return tuple(m.get(i) for i in range(n))


def assert_state_is(rec, s):
    """An ITF state record against the AbstractState it stands for, field by field."""
    assert tuple(rec.free_pages) == s.free_pages and tuple(rec.free_rows) == s.free_rows
    assert (rec.evictable_size, rec.protected_size) == (s.evictable_size, s.protected_size)
    assert {tuple(k) for k in rec.nodes} == {n.path for n in s.nodes}
    for n in s.nodes:
        got = rec.nodes[_key(rec.nodes, n.path)]
        assert (tuple(got.parent), tuple(got.pages), got.lock_ref, _opt(got.lru_rank)) == \
            (n.parent, n.pages, n.lock_ref, n.lru_rank)
    assert set(rec.reqs) == {r.rid for r in s.reqs}
    for r in s.reqs:
        g = rec.reqs[r.rid]
        assert (_opt(g.session), _opt(g.row), _anchor(g.anchor)) == (r.session, r.row, r.anchor)
        assert (g.phase, tuple(g.fill_ids), g.committed, g.allocated, g.protected, g.locked) == \
            (r.phase, r.fill_ids, r.committed, r.allocated, r.protected, r.locked)
        assert _holes(g.row_pages, len(r.row_pages)) == r.row_pages
    assert set(rec.slots) == {t.sid for t in s.slots}
    for t in s.slots:
        g = rec.slots[t.sid]
        assert (_opt(g.row), g.committed, g.allocated, _anchor(g.last_node)) == \
            (t.row, t.committed, t.allocated, t.last_node)
    assert {sid: (x.inflight, tuple(x.checkpoint)) for sid, x in rec.sessions.items()} == \
        {x.sid: (x.inflight, x.checkpoint) for x in s.sessions}
    assert {p: _holes(c, s.page_size) for p, c in rec.content.items()} == dict(s.content)


def _key(m, path):
    return next(k for k in m if tuple(k) == path)


def _read(path):
    return itf_py.trace_from_json(json.loads(Path(path).read_text()))


@pytest.mark.parametrize("name,fault", [("planted/free_tail_unaligned.json", "free_tail_unaligned"),
                                        ("planted/free_no_page_dedup.json", "free_no_page_dedup"),
                                        ("worked_example_5_4.json", None),
                                        ("shared_prefix_split_under_lock.json", None)])
def test_itf_py_reads_the_replay_back(tmp_path, capsys, name, fault):
    out = tmp_path / "t.itf.json"
    with faults.planted(*([fault] if fault else [])):
        assert cli.main(["replay", str(REG / name), "--itf", str(out), "-q"]) == 0
        res = run_replay(load(REG / name), "impl")
    assert f"ITF trace: {out}" in capsys.readouterr().out
    t = _read(out)
    assert t.vars == ["step", "action", "op", "outcome", "sut_outcome", "spec", "sut"]
    assert t.meta["format"] == "ITF" and t.meta["backend"] == "impl"
    assert len(t.states) == len(res.records) + 1
    assert [s.meta["index"] for s in t.states] == list(range(len(t.states)))
    init = t.states[0].values
    assert (init["step"], init["action"], _tag(init["op"])) == (-1, "init", "init")
    for st, rec in zip(t.states[1:], res.records):
        v = st.values
        assert v["step"] == rec.index and v["action"] == rec.op.name == _tag(v["op"])
        assert {k: _opt(x) if _tag(x) in ("Some", "NoValue") else _seq(x)
                for k, x in v["op"]._asdict().items()} == \
            {k: x for k, x in rec.op.to_json().items() if k != "op"} | \
            {k: tuple(x) for k, x in rec.op.to_json().items() if isinstance(x, list)}
        assert (v["outcome"], v["sut_outcome"]) == (rec.outcome, rec.backend_outcome)
    for side, var in (("spec", "spec"), ("impl", "sut")):
        for st, s in zip(t.states, res.states(side)):
            assert_state_is(st.values[var], s)
    if fault:
        exp = load(REG / name).expect
        assert (t.meta["failure"]["id"], t.meta["failure"]["step"]) == (exp.invariant, exp.step)
    if fault == "free_no_page_dedup":       # a double free survives the export
        pages = list(t.states[-1].values["sut"].free_pages)
        assert len(pages) > len(set(pages))


def test_a_step_without_a_backend_state_ends_the_itf_trace():
    trace = load(REG / "planted" / "save_keeps_row.json")
    with faults.planted("save_keeps_row"):
        res = run_replay(trace, "impl")
    assert res.failure.id == "E1" and res.records[-1].backend_state is None
    data = itf_trace(trace, res, "save_keeps_row.json")
    assert len(data["states"]) == len(res.records)          # initial + all but the failing step
    assert "step 3" in data["#meta"]["last_state_omitted"]
    assert itf_py.trace_from_json(data).states[-1].values["step"] == 2


def test_spec_alone_has_no_sut_var_and_big_ints_are_bigint():
    trace = load(REG / "worked_example_5_4.json")
    data = itf_trace(trace, run_replay(trace, "spec"))
    assert data["vars"] == ["step", "action", "op", "outcome", "spec"]
    assert value(2 ** 60) == {"#bigint": str(2 ** 60)} and value(7) == 7
    assert itf_py.value_from_json(value((2 ** 60, -3))) == [2 ** 60, -3]


@pytest.mark.parametrize("name", ["planted/save_keeps_row.json", "worked_example_5_4.json"])
def test_replay_reads_its_own_itf_output_back(tmp_path, capsys, name):
    """`kvcheck replay T --itf T.itf` then `kvcheck replay T.itf`: the same operations,
    configuration, expectation and planted fault, the same verdict; also from a file
    without #meta.ops (an older export), whose operations come from its states."""
    out = tmp_path / "t.itf.json"
    assert cli.main(["replay", str(REG / name), "--itf", str(out), "-q"]) == 0
    first = capsys.readouterr().out
    back = load(out)
    orig = load(REG / name)
    assert (back.config, back.ops, back.expect) == (orig.config, orig.ops, orig.expect)
    assert back.meta.get("planted_fault") == orig.meta.get("planted_fault")
    assert cli.main(["replay", str(out), "-q"]) == 0
    again = capsys.readouterr().out
    assert again.splitlines()[-1] == first.splitlines()[-1]      # expected: ... -> as expected
    data = json.loads(out.read_text())
    del data["#meta"]["ops"]
    old = tmp_path / "old.itf.json"
    old.write_text(json.dumps(data))
    if "last_state_omitted" in data["#meta"]:   # the failing step's operation is not there
        assert cli.main(["replay", str(old), "-q"]) == 2
        assert "expect.step must be an index into ops" in capsys.readouterr().err
    else:
        assert load(old).ops == orig.ops
