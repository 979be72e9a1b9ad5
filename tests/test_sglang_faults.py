"""Planted faults in the real sglang releases (adapters/sglang/faults.py): the exhaustive
walk against a release catches them, the clean release passes the same scope, a bad
KVCHECK_SGLANG_PLANT is refused, and a planted run never reuses a clean server.
Each release's tests are skipped when its venv (.venv-sglang-VERSION) is absent."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from kvcheck.adapters.sglang import faults as F
from kvcheck.adapters.sglang import faults_patch
from kvcheck.adapters.sglang import proxy
from kvcheck.engines.exhaustive import check_transitions
from kvcheck.explore import explore, preset_scope

ROOT = Path(__file__).resolve().parents[1]


def need(version):
    return pytest.mark.skipif(not (ROOT / f".venv-sglang-{version}" / "bin" / "python").exists(),
                              reason=f"no .venv-sglang-{version} (adapters/sglang/make_env.sh {version})")


_SMALL: dict = {}


def small(version: str, depth: int, scope: str = "sglang-tiny"):
    """A scope of the release's preset (by default its first: P=2, one session, one plain
    request, overlap), cut to `depth` steps (a few dozen states), with the release's
    recorded findings accepted as `make check-sglang` runs it, explored once, and the
    clean release's walk of it."""
    if (version, depth, scope) not in _SMALL:
        import os
        from kvcheck.adapters.sglang.findings import RELEASES
        sc = preset_scope(f"check-sglang-{version}", scope)
        sc = replace(sc, max_depth=depth, cfg=replace(sc.cfg, accept=RELEASES[version]))
        res = explore(sc, check=False)       # under --accept the lockstep judges
        assert not os.environ.get(F.ENV)
        _SMALL[version, depth, scope] = res, check_transitions(res, f"sglang:{version}")
    return _SMALL[version, depth, scope]


# (release, fault, invariant it fails, step, scope), as the bench finds them: on each
# release's first scope, the Mamba state a session slot holds (PR #23496) on each
# release's Mamba scope, and the round code on its rounds scope
CAUGHT = [("0.5.15", "close_keeps_tree_lock", "I13", 3, "sglang-tiny"),
          ("0.5.23", "lock_not_handed_over", "D1", 2, "sglang-tiny"),
          ("0.5.23", "close_not_deferred", "I22", 2, "sglang-tiny"),
          ("0.5.15", "ephemeral_slot_no_mamba", "L1", 3, "sglang-mamba-tree"),
          ("0.5.23", "close_keeps_mamba", "I44", 4, "sglang-mamba-tree"),
          # upstream's own round code: PrefillAdder's budget, alloc_for_extend's rows
          ("0.5.15", "round_charge_leak", "D2", 3, "sglang-rounds"),
          ("0.5.23", "extend_rows_swapped", "C4", 4, "sglang-rounds"),
          # upstream's own preempt_to_schedule: the two-phase finish, the victims' order
          ("0.5.15", "preempt_takes_finished", "E1", 6, "sglang-priority-finish"),
          ("0.5.15", "preempt_oldest_first", "D1", 5, "sglang-priority"),
          # upstream's own admission (config.admission): the running batch's reservation,
          # the strict memory test
          ("0.5.15", "running_output_unreserved", "D2", 6, "sglang-reserve"),
          ("0.5.23", "admission_not_strict", "D2", 6, "sglang-reserve"),
          # upstream's own calc_priority: the round's order under priority scheduling
          ("0.5.15", "calc_priority_ignores_priority", "D1", 2, "sglang-priority-round")]


@pytest.mark.parametrize("version,fault,inv,step,scope",
                         [pytest.param(*c, marks=need(c[0]), id=f"{c[0]}-{c[1]}") for c in CAUGHT])
def test_a_planted_fault_is_caught_and_the_clean_release_passes(monkeypatch, version, fault, inv,
                                                                 step, scope):
    monkeypatch.delenv(F.ENV, raising=False)
    res, clean = small(version, step + 1, scope)    # the shortest scope with the failing step
    assert clean.failure is None, clean.line()
    monkeypatch.setenv(F.ENV, fault)
    rep = check_transitions(res, f"sglang:{version}")
    assert rep.failure is not None, f"{fault} not caught: {rep.line()}"
    # check_transitions confirms a failure by a fresh replay (no copy) before it reports it
    assert (rep.failure.id, rep.failure.step) == (inv, step), rep.failure.render()
    assert rep.transitions < clean.transitions


def test_unknown_or_inapplicable_fault_names_are_refused_naming_the_known_ones():
    with pytest.raises(F.PlantError, match=r"unknown planted fault 'nope'.*known for sglang "
                                           r"0\.5\.15: .*close_keeps_tree_lock"):
        F.validate(["nope"], "0.5.15")
    with pytest.raises(F.PlantError, match=r"'lock_not_handed_over' does not apply to sglang "
                                           r"0\.5\.15 \(only 0\.5\.23\)"):
        F.validate(["lock_not_handed_over"], "0.5.15")
    F.validate(["lock_not_handed_over", "free_tail_noop"], "0.5.23")
    assert F.requested({F.ENV: " a, b,,a "}) == ("a", "b")
    assert all(f.releases and f.description and f.source for f in F.FAULTS.values())


@need("0.5.15")
def test_the_served_backend_refuses_to_start_with_an_unknown_fault(monkeypatch):
    from kvcheck.spec.config import Config
    monkeypatch.setenv(F.ENV, "no_such_fault")
    with pytest.raises(proxy.SglangUnavailable, match="unknown planted fault 'no_such_fault'.*"
                                                      "free_no_page_dedup"):
        proxy.SglangProxy(Config(page_size=2), version="0.5.15")


@need("0.5.15")
def test_a_planted_run_never_reuses_a_clean_server(monkeypatch):
    from kvcheck.spec.config import Config
    cfg = Config(page_size=2)
    monkeypatch.delenv(F.ENV, raising=False)
    clean = proxy.SglangProxy(cfg, version="0.5.15")
    monkeypatch.setenv(F.ENV, "close_keeps_tree_lock")
    planted = proxy.SglangProxy(cfg, version="0.5.15")
    monkeypatch.setenv(F.ENV, "")
    again = proxy.SglangProxy(cfg, version="0.5.15")
    assert planted._server is not clean._server
    assert again._server is clean._server
    py = str(proxy.venv_python("0.5.15"))
    assert proxy._SERVERS[(py, "close_keeps_tree_lock")] is planted._server
    assert proxy._SERVERS[(py, "")] is clean._server


def test_two_faults_on_one_method_stack_and_uninstall_restores_the_original(monkeypatch):
    """free_tail_noop and free_tail_slot_untouched (or the two release_session faults)
    patch one upstream method: planting both must install both, each wrapping the other,
    and uninstall must give back the upstream function, not a wrapper."""
    import sys
    import types

    class Cache:
        def free(self, x):
            return ["upstream", x]

    mod = types.ModuleType("kvcheck_fake_upstream")
    mod.Cache = Cache
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    original = Cache.__dict__["free"]
    tag = lambda name: lambda orig: lambda self, x: orig(self, x) + [name]  # noqa: E731
    try:
        faults_patch._patch(mod.__name__, "Cache", "free", tag("first"))
        faults_patch._patch(mod.__name__, "Cache", "free", tag("second"))
        assert Cache().free(1) == ["upstream", 1, "first", "second"]
    finally:
        F.uninstall()
    assert Cache.__dict__["free"] is original


def test_a_failure_found_with_a_planted_fault_records_it_and_a_replay_plants_it(monkeypatch):
    """The trace of a failure found with $KVCHECK_SGLANG_PLANT set names the faults
    (#meta.sglang_plant), and `kvcheck replay` on a release plants them again unless the
    variable is set (a trace that reproduces only with the fault would pass otherwise)."""
    import os
    from types import SimpleNamespace

    from kvcheck.backends import planted_upstream
    from kvcheck.replay import upstream_planted
    monkeypatch.setenv(F.ENV, "free_tail_noop")
    assert planted_upstream("sglang:0.5.15") == {"sglang_plant": "free_tail_noop"}
    assert planted_upstream("impl") == {}
    monkeypatch.delenv(F.ENV)
    assert planted_upstream("sglang:0.5.15") == {}
    trace = SimpleNamespace(meta={"sglang_plant": "free_tail_noop"})
    seen = []
    with upstream_planted(trace, "sglang:0.5.15", out=seen.append):
        assert os.environ[F.ENV] == "free_tail_noop"
    assert F.ENV not in os.environ and "free_tail_noop" in seen[0]
    with upstream_planted(trace, "impl", out=seen.append):
        assert F.ENV not in os.environ
    monkeypatch.setenv(F.ENV, "")           # set: the caller decides
    with upstream_planted(trace, "sglang:0.5.15", out=seen.append):
        assert os.environ[F.ENV] == ""
