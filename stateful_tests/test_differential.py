"""Spec vs impl/ under the differential state machine (fixed budget, derandomised), and
the regression corpus: DOMAIN.md scenarios pass; each planted-fault trace still fails
the same way with its fault switched on, and passes with it off."""
from pathlib import Path

import pytest
from hypothesis import settings

from kvcheck.adapters.impl import ImplBackend
from kvcheck.impl import faults
from kvcheck.checker import run_ops
from kvcheck.trace import load
from kvcheck.spec.ops import OP_NAMES
from kvcheck.engines import hypothesis_machine as M

HERE = Path(__file__).parent
DiffMachine = M.make_machine(ImplBackend, "impl")
TestDifferential = DiffMachine.TestCase
TestDifferential.settings = settings(settings.get_profile("kvcheck-check"), max_examples=60)


def test_differential_reaches_every_operation():
    """Each operation is applied (enabled and run on both sides), with speculative
    decoding on and off."""
    from hypothesis.stateful import run_state_machine_as_test
    M.STATS.clear()
    for spec_on in (False, True):
        machine = M.make_machine(ImplBackend, "impl", M.configs(spec_enabled=spec_on))
        run_state_machine_as_test(machine, settings=settings(settings.get_profile("kvcheck-check"),
                                                             max_examples=50))
    missing = [n for n in OP_NAMES if M.STATS.coverage[n] == 0]
    assert not missing, f"never applied: {missing}"


@pytest.mark.parametrize("path", sorted((HERE / "regressions").glob("*.json")), ids=lambda p: p.stem)
def test_regression_corpus(path):
    t = load(path)
    res = run_ops(t.config, t.ops, ImplBackend(t.config))
    if t.expect.result == "pass":
        assert res.ok, res.failure.render()
    else:
        assert res.failure is not None and res.failure.id == t.expect.invariant, \
            res.failure.render() if res.failure else "passed"


PLANTED = sorted((HERE / "regressions" / "planted").glob("*.json"))


@pytest.mark.parametrize("path", PLANTED, ids=lambda p: p.stem)
def test_planted_fault_trace_still_caught(path):
    t = load(path)
    fault = t.meta["planted_fault"]
    assert run_ops(t.config, t.ops, ImplBackend(t.config)).ok, "fails without its fault"
    with faults.planted(fault):
        res = run_ops(t.config, t.ops, ImplBackend(t.config))
    assert res.failure is not None, f"{fault} no longer caught by its trace"
    assert (res.failure.id, res.failure.step) == (t.expect.invariant, t.expect.step), res.failure.render()


def test_every_planted_fault_has_a_trace():
    """One trace per fault, `<fault>.json`; a further one (reaching another finding of the
    same fault) is `<fault>-<what>.json`."""
    named = {p: load(p).meta["planted_fault"] for p in PLANTED}
    assert set(named.values()) == set(faults.FAULTS)
    assert all(p.stem.split("-")[0] == fault for p, fault in named.items())
