"""The trace shrinker keeps the failure and removes what does not cause it."""
from kvcheck.spec import ops as O
from kvcheck.shrink import shrink


def test_shrink_removes_unrelated_objects_and_ops():
    ops = [O.OpenSession(1), O.SubmitRequest(5, (1, 2), 2), O.SubmitTurn(1, 2, (3,), 2),
           O.Schedule(5), O.Schedule(2), O.Evict(2), O.Decode(2), O.Finish(5)]
    calls = []

    def fails(c):                     # "fails" whenever the schedule of req 2 is present
        calls.append(len(c))
        return any(isinstance(o, O.Schedule) and o.rid == 2 for o in c)

    out = shrink(ops, fails)
    assert out == [O.Schedule(2)]
    assert fails(out)


def test_shrink_keeps_a_list_that_cannot_shrink():
    ops = [O.OpenSession(1), O.SubmitTurn(1, 2, (3,), 2)]
    assert shrink(ops, lambda c: len(c) == 2) == ops
