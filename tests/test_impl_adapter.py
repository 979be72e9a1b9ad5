"""adapters/impl.py: the abstract view of impl/ matches the spec step by step on
hand-written traces (P = 1 and 4, both eras, overlap and spec)."""
import pytest

from kvcheck.adapters.impl import ImplBackend
from kvcheck.checker import run_ops
from kvcheck.spec import ops as O
from kvcheck.spec.abstract import canonical
from kvcheck.spec.config import Config
from kvcheck.spec.model import initial_state, step
from kvcheck.spec.view import abstract

T1 = tuple(range(10, 20))


def worked_example():
    # the 4th decode and the turn-2 decode reach max_new_tokens: check_finished ends the turn
    return [O.OpenSession(1), O.SubmitTurn(1, 1, T1, 5), O.Schedule(1)] + [O.Decode(1, 7)] * 4 + \
        [O.SubmitTurn(1, 2, (30, 31, 32), 2), O.Schedule(2), O.CloseSession(1),
         O.Decode(2, 9)]


def mixed(P):
    a = (1, 2, 3, 4, 5, 6, 7, 8)
    return [
        O.OpenSession(1), O.OpenSession(2),
        O.SubmitRequest(10, a + (9, 9), 3), O.Schedule(10, admit=False), O.Schedule(10),
        O.SubmitTurn(1, 1, a[:4] + (7, 7, 7), 6), O.Schedule(1), O.Decode(1, 2),
        O.SubmitTurn(1, 2, (5,), 2), O.SubmitTurn(2, 3, a, 2), O.PreAbort(3), O.Schedule(3),
        O.Schedule(2), O.Decode(10, 4), O.Retract(1), O.Schedule(1), O.Decode(1, 3),
        O.Finish(1), O.SubmitTurn(1, 4, (6, 6), 3), O.Schedule(4, admit=False), O.Schedule(4),
        O.AbortRunning(4), O.Evict(3), O.Finish(10), O.CloseSession(1), O.CloseSession(2),
        O.Evict(100),
    ]


CASES = [
    ("worked-p4-overlap", Config(page_size=4, num_pages=16, num_rows=4, overlap=True), worked_example()),
    ("worked-p1", Config(page_size=1, num_pages=40, num_rows=4), worked_example()),
    ("mixed-p1", Config(page_size=1, num_pages=48, num_rows=4), mixed(1)),
    ("mixed-p4-borrow", Config(page_size=4, num_pages=16, num_rows=4, era="borrow"), mixed(4)),
    ("mixed-p4-chunk-overlap", Config(page_size=4, num_pages=16, num_rows=4, chunk_size=4, overlap=True),
     mixed(4)),
]


def with_chunks(cfg, ops):
    """Insert the PrefillChunk ops a chunked config needs before a request decodes."""
    s = initial_state(cfg)
    out = []
    for op in ops:
        rid = getattr(op, "rid", None)
        while not isinstance(op, (O.PrefillChunk, O.AbortRunning)) and rid in s.reqs \
                and s.reqs[rid].phase == "prefill":
            s, _ = step(s, O.PrefillChunk(rid))
            out.append(O.PrefillChunk(rid))
        s, _ = step(s, op)
        out.append(op)
    return out


@pytest.mark.parametrize("name,cfg,ops", CASES, ids=[c[0] for c in CASES])
def test_trace_matches_spec(name, cfg, ops):
    ops = with_chunks(cfg, ops)
    res = run_ops(cfg, ops, ImplBackend(cfg))
    assert res.ok, res.failure.render()
    assert res.steps == len(ops)


def test_abstract_of_worked_example_turn1():
    cfg = Config(page_size=4, num_pages=16, num_rows=4, overlap=True)
    b = ImplBackend(cfg)
    s = initial_state(cfg)
    for op in worked_example()[:8]:
        b.apply(op)
        s, _ = step(s, op)
    a = b.abstract()
    assert a.free_pages == tuple(range(5, 17)) and a.free_rows == (1, 2, 3)
    (node,) = a.nodes
    assert (node.path, node.parent, node.pages, node.lock_ref) == (T1[:8], (), (1, 2), 1)
    (slot,) = a.slots
    assert (slot.row, slot.committed, slot.allocated, slot.protected, slot.last_node, slot.row_pages) == \
        (0, 15, 15, 8, ("node", T1[:8]), (1, 2, 3, 4))
    assert a.content_map()[4] == (7, 7, 7, None)
    assert (a.evictable_size, a.protected_size) == (0, 8)
    assert canonical(a) == canonical(abstract(s))
    assert b.concrete_violations() == [] and b.leak_violations() == []


def test_outcomes_are_the_vocabulary():
    cfg = Config(page_size=1, num_pages=4, num_rows=1)
    b = ImplBackend(cfg)
    outs = [b.apply(op) for op in [O.OpenSession(1), O.SubmitTurn(1, 1, (1, 2), 3), O.SubmitTurn(1, 2, (3,), 3),
                                   O.CloseSession(1), O.SubmitRequest(5, (1, 2, 3, 4, 5), 1), O.Schedule(5)]]
    assert outs == ["ok", "ok", "stub", "deferred", "ok", "rejected"]
