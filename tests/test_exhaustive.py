"""kvcheck/engines/exhaustive.py: every transition of an explored scope on the spec and impl
side by side (`kvcheck explore --backend impl`, `make check`'s exhaustive differential)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from kvcheck import cli
from kvcheck.backends import resolve
from kvcheck import explore as E
from kvcheck.checker import Lockstep, run_ops
from kvcheck.engines import exhaustive as X
from kvcheck.trace import load

TINY = E.PRESETS["tiny"][0]


def test_every_transition_and_state_of_the_scope_is_checked_once():
    res = E.explore(TINY)
    rep = X.check_transitions(res)
    assert rep.failure is None, rep.line()
    assert (rep.states, rep.transitions) == (res.states, res.transitions)


@pytest.mark.parametrize("scope,depth", [("impl-hybrid", 7), ("impl-mamba-tree-0515", 5),
                                         ("impl-hybrid-borrow", 5), ("impl-p4-spec-chunk", 5)])
def test_a_copied_backend_is_the_backend_a_fresh_replay_builds(scope, depth):
    """At every state of the tree walk, the impl side (reached through copies) has the
    abstract state a fresh replay of the state's path gives: nothing the copy left behind
    (a closure over the original scheduler made the SWA lock walk ask the original's
    requests, a false D1 on check-hybrid)."""
    res = E.explore(replace(E.preset_scope("check-impl", scope), max_depth=depth))
    seen = []

    def visit(path, lock):
        fresh = Lockstep(lock.cfg, resolve("impl")[0](lock.cfg), "impl")
        for op in path:
            assert fresh.apply(op)[1] is None
        assert lock.backend.abstract() == fresh.backend.abstract(), path
        seen.append(len(path))
    rep = X.check_transitions(res, visit=visit)
    assert rep.failure is None and len(seen) == res.states and max(seen) == res.max_depth


def test_a_planted_fault_is_found_at_its_shortest_and_the_trace_replays(tmp_path, capsys):
    from kvcheck.impl import faults
    with faults.planted("free_tail_unaligned"):
        rc = cli.main(["explore", "--preset", "tiny", "--backend", "impl", "--quiet",
                       "--out", str(tmp_path)])
        out = capsys.readouterr().out
        assert rc == 1 and "FAILED:\nFAIL at step 4" in out, out
        path = tmp_path / "tiny-C1-impl.json"
        t = load(path)
        assert (t.expect.invariant, t.expect.step, t.expect.backend, len(t.ops)) == ("C1", 4, "impl", 5)
        from kvcheck.adapters.impl import ImplBackend
        again = run_ops(t.config, t.ops, ImplBackend(t.config)).failure
        assert (again.id, again.step) == ("C1", 4)
        assert (tmp_path / "tiny-C1-impl.html").exists()
    rc = cli.main(["explore", "--preset", "tiny", "--backend", "impl", "--quiet",
                   "--out", str(tmp_path / "clean")])
    assert rc == 0 and "every step agreed" in capsys.readouterr().out


def test_a_failure_a_fresh_replay_does_not_show_is_a_fork_error(monkeypatch):
    """A copy that shares the backend (so copies step each other's state) makes
    divergences no replay shows: reported as a ForkError, never as a finding."""
    import copy
    monkeypatch.setattr(Lockstep, "fork", lambda self: copy.copy(self))
    res = E.explore(TINY)
    with pytest.raises(X.ForkError, match="fresh replay"):
        X.check_transitions(res)


def test_the_spec_alone_is_no_system_under_test():
    res = E.explore(replace(TINY, max_depth=2))
    with pytest.raises(ValueError, match="needs a system under test"):
        X.check_transitions(res, "spec")


def test_accept_needs_a_release(tmp_path, capsys):
    """Under --accept the search judges nothing itself: the lockstep against a release
    does, so --accept with the spec alone or impl/ is a usage error."""
    for backend in ("spec", "impl"):
        rc = cli.main(["explore", "--preset", "tiny", "--backend", backend, "--accept", "U1",
                       "--quiet", "--out", str(tmp_path)])
        assert rc == 2, backend
    err = capsys.readouterr().err
    assert "--accept needs --backend sglang:VERSION" in err and "impl/ implements" in err
