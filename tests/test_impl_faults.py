"""Planted faults: registry hygiene, and each fault is caught by the differential check
(spec vs ImplBackend) on a small scenario that passes without it."""
import pytest

from kvcheck.impl import faults
from kvcheck.spec import ops as O
from kvcheck.spec.config import Config

P4 = Config(page_size=4, num_pages=16, num_rows=3, max_context_len=64)
P4_SPEC = Config(page_size=4, num_pages=16, num_rows=3, max_context_len=64, spec_enabled=True)
P1_OVERLAP = Config(page_size=1, num_pages=32, num_rows=3, max_context_len=64, overlap=True)
MAMBA_TREE = Config(page_size=1, num_pages=32, num_rows=3, max_context_len=64, era="borrow",
                    mamba_slots=4, mamba_tree=True)


def turn1(new=(1, 2, 3, 4, 5, 6), max_new=4, decodes=1):
    return [O.OpenSession(1), O.SubmitTurn(1, 1, tuple(new), max_new), O.Schedule(1)] + \
        [O.Decode(1, 2)] * decodes


SCENARIOS = {
    "restore_clears_slot": (P4, turn1() + [O.Finish(1), O.SubmitTurn(1, 2, (7, 8), 2),
                                           O.Schedule(2, admit=False), O.Schedule(2)]),
    "free_tail_unaligned": (P4_SPEC, turn1(new=(1, 2, 3, 4, 5), max_new=2, decodes=0) + [O.SpecDecode(1, 2, 0, 3)]),
    "save_keeps_row": (P4, turn1() + [O.Finish(1)]),
    "preabort_no_detach": (P4, turn1() + [O.Finish(1), O.SubmitTurn(1, 2, (7, 8), 2),
                                          O.PreAbort(2), O.Schedule(2)]),
    "close_skips_dec_lock": (P4, turn1(new=tuple(range(1, 10))) + [O.Finish(1), O.CloseSession(1)]),
    "close_not_deferred": (P4, turn1() + [O.CloseSession(1), O.Finish(1)]),
    "ephemeral_slot_no_lock_node": (P4, turn1(new=tuple(range(1, 10))) + [O.AbortRunning(1)]),
    "free_no_page_dedup": (P4, [O.SubmitRequest(1, (1, 2, 3, 4, 5, 6), 2), O.Schedule(1), O.Finish(1)]),
    "free_tail_slot_untouched": (P1_OVERLAP, turn1(new=(1, 2, 3)) + [O.Retract(1), O.Schedule(1, admit=False),
                                                                       O.Schedule(1)]),
    "split_no_lock_copy": (P4, [O.SubmitRequest(1, tuple(range(1, 10)), 2), O.Schedule(1),
                                O.SubmitRequest(2, (1, 2, 3, 4, 9, 9), 2), O.Schedule(2)]),
    "overalloc_free_from_committed": (P4_SPEC, [O.SubmitRequest(1, (1, 2, 3, 4, 5, 6), 3), O.Schedule(1),
                                                O.SpecDecode(1, 2, 1, 3)]),
    "retract_advances_checkpoint": (P4, turn1() + [O.Retract(1)]),
    "abort_req_unconditional": (P4, [O.OpenSession(1), O.SubmitTurn(1, 1, (1, 2), 2),
                                     O.SubmitTurn(1, 2, (3,), 2), O.AbortQueued(2)]),
    "queued_abort_keeps_inflight": (P4, [O.OpenSession(1), O.SubmitTurn(1, 1, (1, 2), 2), O.AbortQueued(1)]),
    # the second finish keys the same prompt, whose node already has a state
    "mamba_donate_when_node_has_state": (MAMBA_TREE, [O.SubmitRequest(1, (1, 2, 3, 4, 5), 1), O.Schedule(1),
                                                      O.SubmitRequest(2, (1, 2, 3, 4, 5), 1), O.Schedule(2)]),
}


def _run(cfg, ops):
    from kvcheck.adapters.impl import ImplBackend
    from kvcheck.checker import run_ops
    return run_ops(cfg, ops, ImplBackend(cfg))


def test_registry_is_off_by_default_and_planted_restores():
    assert faults.ACTIVE == set()
    assert len(faults.FAULTS) >= 8 and all(isinstance(v, str) and v for v in faults.FAULTS.values())
    with faults.planted("free_no_page_dedup", "split_no_lock_copy"):
        assert faults.ACTIVE == {"free_no_page_dedup", "split_no_lock_copy"}
    assert faults.ACTIVE == set()
    with pytest.raises(KeyError):
        with faults.planted("no_such_fault"):
            pass


def test_every_fault_has_a_scenario():
    """A hand-written scenario here, or the fuzzer's shrunk trace under
    stateful_tests/regressions/planted/ (replayed by stateful_tests/test_differential.py)."""
    from pathlib import Path
    planted = {p.stem for p in (Path(__file__).resolve().parents[1] / "stateful_tests" /
                                "regressions" / "planted").glob("*.json")}
    assert set(SCENARIOS) <= set(faults.FAULTS)
    assert set(faults.FAULTS) <= set(SCENARIOS) | planted


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_fault_is_caught_and_scenario_clean_without_it(name):
    cfg, ops = SCENARIOS[name]
    clean = _run(cfg, ops)
    assert clean.ok, clean.failure.render()
    with faults.planted(name):
        res = _run(cfg, ops)
    assert not res.ok, f"planted fault {name} went unnoticed"
