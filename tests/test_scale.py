"""Scale-out: the same campaign in 2 local worker processes and as Ray tasks on a local
Ray with 2 CPUs; failures come back to the driver, deduplicated by root cause, written
once and replayable."""
from __future__ import annotations

import pytest

from kvcheck.impl import faults
from kvcheck.engines.campaign import Campaign, run_chunk
from kvcheck.fuzz import fuzz, root_cause
from kvcheck.replay import replay_trace
from kvcheck.trace import load

FAULT = "free_no_page_dedup"


def _assert_campaign_found_and_wrote(rep, out):
    assert rep.found and not rep.interrupted, rep.render()
    keys = set()
    for f in rep.found:
        t = load(f.path)
        assert f.shrunk and t.meta["planted_fault"] == FAULT and t.expect.invariant == f.id
        with faults.planted(FAULT):
            _, ok = replay_trace(t, "impl", verbose=False)
        assert ok
        keys.add((f.id, f.side, tuple(map(str, t.ops))))
    # deduplicated by root cause as found (the shrunk traces may end at other ops, a drain
    # step's too, but no two are one trace)
    assert len(keys) == len(rep.found), "a root cause was written twice"
    assert sorted(p.name for p in out.glob("*.json")) == sorted(f.path.name for f in rep.found)
    assert all(f.path.with_suffix(".html").exists() for f in rep.found)   # written by the driver


def test_a_chunk_is_the_same_wherever_it_runs():
    c = Campaign("walk", 5, "impl")
    a = run_chunk(c, 0, 30, (FAULT,))
    b = run_chunk(c, a.failure.index, 1, (FAULT,))
    assert a.failure is not None and b.failure is not None
    assert (b.failure.cfg, b.failure.ops) == (a.failure.cfg, a.failure.ops)
    assert root_cause(a.failure.failure) == root_cause(b.failure.failure)
    assert not faults.ACTIVE


def test_two_local_workers_find_and_write_a_planted_fault(tmp_path):
    rep = fuzz(None, 5, "impl", tmp_path, rounds=12, workers=2, planted=(FAULT,), quiet=True)
    assert rep.workers == 2 and rep.sequences >= 1
    _assert_campaign_found_and_wrote(rep, tmp_path)


def test_ray_campaign_on_a_local_two_cpu_ray(tmp_path):
    ray = pytest.importorskip("ray")
    try:
        rep = fuzz(None, 5, "impl", tmp_path, rounds=24, use_ray=True, workers=2,
                   planted=(FAULT,), quiet=True, stop_on_first=True)
    finally:
        if ray.is_initialized():
            ray.shutdown()
    assert rep.workers == 2
    _assert_campaign_found_and_wrote(rep, tmp_path)
