"""The spec alone under its Hypothesis state machine: all invariants after every step."""
from hypothesis import settings

from kvcheck.engines.hypothesis_machine import STATS, make_machine
from kvcheck.spec.ops import OP_NAMES

SpecMachine = make_machine(None)
TestSpecMachine = SpecMachine.TestCase
TestSpecMachine.settings = settings(settings.get_profile("kvcheck-check"), max_examples=120)


def test_every_operation_runs():
    """The machine reaches every operation of the vocabulary (not just generates it)."""
    from hypothesis import given, settings as s_
    from hypothesis.stateful import run_state_machine_as_test
    from kvcheck.engines.hypothesis_machine import configs
    STATS.clear()
    for spec_on in (False, True):
        run_state_machine_as_test(make_machine(None, config_strategy=configs(spec_enabled=spec_on)),
                                  settings=settings(settings.get_profile("kvcheck-check"), max_examples=80))
    missing = [n for n in OP_NAMES if STATS.coverage[n] == 0]
    assert not missing, f"operations never applied: {missing}; coverage {dict(STATS.coverage)}"


def test_spec_machine_under_crosshair_backend():
    """The same spec machine, with draws made symbolic by CrossHair (profile
    kvcheck-crosshair); every invariant after every step."""
    from hypothesis.stateful import run_state_machine_as_test
    STATS.clear()
    run_state_machine_as_test(make_machine(None), settings=settings.get_profile("kvcheck-crosshair"))
    assert STATS.sequences >= 1 and STATS.steps >= 1
