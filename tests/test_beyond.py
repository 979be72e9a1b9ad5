"""Under `--accept` the spec follows upstream's recorded behaviour, and where that takes it
past what the model follows the lockstep stops comparing (`checker.Beyond`). The stop is
counted and reported, never silent; and a spec that breaks an invariant (or reaches an
upstream assertion) before any accepted finding's branch was taken fails as it would
without `--accept` (kvcheck/checker.py `Lockstep._took_upstream`)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

import kvcheck.spec.model as M
from kvcheck.checker import SPEC_ASSERTION, Lockstep, run_ops
from kvcheck.check import differential_part
from kvcheck.engines.stats import Stats
from kvcheck.engines.walk import walk
from kvcheck.fuzz import fuzz
from kvcheck.spec import ops as O
from kvcheck.spec.allocator import _free_pages
from kvcheck.spec.config import Config

from spec_patch import plant

ROOT = Path(__file__).resolve().parents[1]

PLAIN_THEN_EVICT = [O.SubmitRequest(1, (1, 2, 3), 4), O.Schedule(1), O.Decode(1, 9), O.Finish(1),
                    O.Evict(8)]
"""A plain request, cached, then evicted: no session, so no accepted finding's branch."""

U1_THEN_CLOSE = [O.OpenSession(2), O.SubmitTurn(2, 3, (1, 2, 3, 4, 5, 4, 1, 2, 3, 4), 6),
                 O.SubmitTurn(2, 6, (2, 1), 1), O.Schedule(6), O.CloseSession(2)]
"""Turn 3 in flight, turn 6 a rejected stub; under U1 the stub's detach clears turn 3's
_inflight (step 3: the accepted branch), so the close at step 4 is carried out under the
running turn: I22, outside U1's ACCEPTED_INVARIANTS (found by the walk, seed 0 index 1)."""

U1 = Config(era="borrow", accept=("U1",))


def _free_pages_twice(real):
    def free(s, pages, full_only=()):
        real(s, pages, full_only)
        real(s, pages[:1], full_only)           # the first page again: a double free
    return free


def test_a_planted_spec_defect_under_accept_fails_as_without_it(monkeypatch):
    plant(monkeypatch, "_free_pages", _free_pages_twice(_free_pages))
    plain = run_ops(Config(), PLAIN_THEN_EVICT)
    assert plain.failure is not None and plain.failure.side == "spec"
    res = run_ops(Config(accept=("U1", "U2")), PLAIN_THEN_EVICT)
    assert res.failure is not None and res.beyond is None      # it used to stop, silently
    f = res.failure
    assert (f.id, f.step, f.side) == (plain.failure.id, plain.failure.step, "spec") == ("I3", 4, "spec")
    assert f.violations[0].page is not None


def test_a_planted_upstream_assertion_under_accept_is_m1(monkeypatch):
    def evict(s, n):
        raise M.ModelError("planted: evict reaches an assertion")
    plant(monkeypatch, "evict", evict)
    res = run_ops(Config(accept=("U1", "U2")), PLAIN_THEN_EVICT)
    assert res.failure is not None and (res.failure.id, res.failure.step) == (SPEC_ASSERTION, 4)


def test_an_accepted_branch_taken_then_an_invariant_outside_its_set_is_beyond():
    """After U1's branch was taken, the spec's own break outside U1's set is a stop."""
    res = run_ops(U1, U1_THEN_CLOSE)
    assert res.ok and res.beyond is not None
    assert (res.beyond.step, res.beyond.reason) == (4, "I22")
    assert "I22" in res.beyond.details[0] and "beyond" in res.beyond.render()
    # the fixed spec (and U2 alone, whose branch these ops never take) compare to the end
    for cfg in (replace(U1, accept=()), replace(U1, accept=("U2",))):
        r = run_ops(cfg, U1_THEN_CLOSE)
        assert r.ok and r.beyond is None


def test_the_fixed_spec_is_followed_until_it_differs():
    lock = Lockstep(U1)
    for op in U1_THEN_CLOSE[:3]:
        lock.apply(op)
        assert lock.fixed is not None       # nothing accepted taken yet
    lock.apply(U1_THEN_CLOSE[3])            # the stub's detach clears turn 3's _inflight
    assert lock.fixed is None and lock.beyond is None
    assert Lockstep(Config()).fixed is None


def test_a_walk_that_goes_beyond_ends_and_is_counted():
    stats = Stats()
    seq = walk(0, 0, None, "spec", stats, cfg=U1, script=list(U1_THEN_CLOSE), length=40)
    assert seq.failure is None and len(seq.ops) == 5
    assert dict(stats.beyond) == {"I22": 1}
    assert stats.not_compared == 40 - 4 and stats.steps == 4     # the 5th was not compared
    merged = Stats()
    merged.merge(stats), merged.merge(stats)
    assert dict(merged.beyond) == {"I22": 2} and merged.not_compared == 72


def test_fuzz_and_check_report_the_sequences_beyond(tmp_path):
    """Seed 0 (check's), its first 8 sequences: two go beyond (an upstream assertion the
    spec reached, and I22)."""
    rep = fuzz(None, 0, "spec", tmp_path, rounds=8, accept=("U1", "U2"), quiet=True)
    assert not rep.found and rep.beyond == {"ModelError": 1, "I22": 1}
    assert rep.not_compared > 0
    line = (f"beyond the accepted findings' model: 2 sequences (I22 x1, ModelError x1), "
            f"{rep.not_compared} steps not compared")
    assert line in rep.render()
    assert "beyond" not in fuzz(None, 0, "spec", tmp_path, rounds=8, quiet=True).render()
    seen: dict = {}
    ok, detail = differential_part("spec", tmp_path, 8, "walk", ("U1", "U2"), beyond=seen)
    assert line in detail
    assert seen == {"sequences": 2, "steps_not_compared": rep.not_compared,
                    "reasons": {"I22": 1, "ModelError": 1}}


def test_check_json_has_the_beyond_summary(tmp_path):
    out = tmp_path / "r.json"
    p = subprocess.run([sys.executable, "-m", "kvcheck.cli", "check", "--backend", "spec",
                        "--accept", "U1,U2", "--examples", "60", "--skip-explore", "--skip-proofs",
                        "--out", str(tmp_path / "f"), "--json", str(out)],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.exists(), p.stdout + p.stderr
    s = json.loads(out.read_text())
    assert s["beyond"]["sequences"] == 9
    assert s["beyond"]["reasons"] == {"I1": 1, "I22": 5, "I26": 1, "ModelError": 1, "P1": 1}
    assert s["beyond"]["steps_not_compared"] > 0
    assert "beyond the accepted findings' model: 9 sequences (I22 x5, I1 x1, I26 x1, ModelError x1, "\
           "P1 x1)" in p.stdout


def test_replay_says_where_it_stopped_comparing(tmp_path, capsys):
    from kvcheck import cli
    from kvcheck.trace import Trace
    path = Trace(U1, U1_THEN_CLOSE).save(tmp_path / "t.json")
    assert cli.main(["replay", str(path), "--backend", "spec"]) == 0
    out = capsys.readouterr().out
    assert "beyond the accepted findings' model at step 4: close_session(sid=2): I22" in out
    assert "PASS up to step 4 (4 steps compared, 1 not: beyond the accepted findings' model, I22)" in out


RETRACT_RETRY_REWRITTEN = [
    O.OpenSession(1), O.SubmitTurn(1, 1, (2,), 3), O.Schedule(1), O.Retract(1), O.Schedule(1),
    O.SubmitTurn(1, 2, (2,), 3), O.SpecDecode(1, 1, 0, 1)]
"""Found on sglang 0.5.14 (docs/upstream-findings.md, "Older releases"): under U2 turn 1's
retract finishes it, so turn 2 is admitted while turn 1 runs again and rewrites turn 1's
prompt (I26 on req 1: accepted); turn 1's finish then saves that rewritten request into
the slot, whose KV no longer stands for the session's tokens (I26 on the slot): past the
model, where 0.5.14 and 0.5.15 keep different lengths."""


def test_i26_on_a_slot_is_past_the_accepted_model():
    cfg = Config(page_size=4, num_pages=4, num_rows=2, max_context_len=16, chunk_size=4,
                 spec_enabled=True, max_drafts=2, overlap=True, accept=("U1", "U2", "U3", "M2"))
    res = run_ops(cfg, RETRACT_RETRY_REWRITTEN)
    assert res.failure is None
    assert res.beyond is not None and (res.beyond.step, res.beyond.reason) == (6, "I26")
    assert any("slot of session 1" in d for d in res.beyond.details), res.beyond.details
    # on a request it is U1/U2's own consequence; on a slot it is not
    from kvcheck.spec.violations import Violation
    assert M.within_accepted(("U2",), [Violation("I26", "", "", "req 1", 3)])
    assert not M.within_accepted(("U2",), [Violation("I26", "", "", "slot of session 1", 3)])
    assert M.within_accepted(("U2",), [Violation("I20", "", "", "session 1", None)])
    assert not M.within_accepted(("U3",), [Violation("I26", "", "", "req 1", 3)])


def test_a_retract_keyed_by_arrays_u1_shortened_frees_a_tree_page():
    """U1's page-level consequence (docs/upstream-findings.md, U1): the release of a turn
    whose `origin_input_ids` a later turn rewrote in place keys by the arrays, as
    0.5.15's `RadixCache.cache_finished_req` does: a page the tree holds is freed (I17)
    and the row's last page leaks (I2), on the spec itself, so the lockstep stops there
    as beyond the accepted model (the release does the same)."""
    from kvcheck.trace import load
    t = load(ROOT / "stateful_tests" / "upstream" / "u1-retract-frees-tree-page-sglang-0.5.15.json")
    res = run_ops(t.config, t.ops, None, backend_name="spec")
    b = res.beyond
    assert res.failure is None and b is not None and (b.step, b.reason) == (11, "I17"), b
    text = b.render()
    assert "tree node's page is in the free list" in text and "page 4" in text, text
    assert "page 5]: page is in no free list" in text, text


def test_a_chunk_checkpoint_keys_the_array_a_later_turn_shortened():
    """U2's retracts let turn 13 in while turn 12 lives; their shared array, rewritten,
    is shorter than turn 12's kv_committed_len at its next chunk. Upstream keys that
    checkpoint by the array (`get_fill_ids()`) and goes on; so does the spec (it stopped
    there with an assertion of its own, ModelError 'cache_unfinished_req: re-match'): both insert nodes
    holding KV of other tokens (I26 on a node), beyond the accepted model at step 13."""
    from kvcheck.trace import load
    for v in ("0.5.15", "0.5.23"):
        t = load(ROOT / "stateful_tests" / "upstream" /
                 f"u2-chunk-checkpoint-keys-rewritten-fill-sglang-{v}.json")
        res = run_ops(t.config, t.ops, None, backend_name="spec")
        b = res.beyond
        assert res.failure is None and b is not None and (b.step, b.reason) == (13, "I26"), (v, b)
        assert "[node [2, 1, 1, 1, 2, 4]; page 4]" in b.render(), b.render()


def test_an_abort_keys_the_array_a_later_turn_shortened_and_frees_past_it():
    """S10: turn 8 (kv_committed_len 18) is aborted after turn 10's submit rewrote their
    shared array to 15 tokens (U1). 0.5.22+ keys the release's insert by the array and
    frees the row past it ([cache_protected_len, owned_kv_len)); the spec keyed it by
    kv_committed_len and leaked row positions 15-17 (I2 at step 14, the release alone:
    no I2). Now both stop at step 14 with I26 on the nodes the abort inserted."""
    from kvcheck.trace import load
    t = load(ROOT / "stateful_tests" / "upstream" / "u1-abort-keys-rewritten-fill-sglang-0.5.23.json")
    res = run_ops(t.config, t.ops, None, backend_name="spec")
    b = res.beyond
    assert res.failure is None and b is not None and (b.step, b.reason) == (14, "I26"), b
    assert not [d for d in b.details if d.startswith(("I1 ", "I2 "))], b.render()


def _release(version, *args):
    return pytest.param(version, *args, marks=pytest.mark.skipif(
        not (ROOT / f".venv-sglang-{version}" / "bin" / "python").exists(),
        reason=f"no .venv-sglang-{version} (make sglang-env)"))


@pytest.mark.parametrize("version,step", [_release("0.5.15", 10), _release("0.5.23", 9)])
def test_u1_crashes_the_scheduler_at_the_assertion_the_spec_stops_at(version, step):
    """U1's crash consequence (docs/upstream-findings.md, U1): the spec stops with
    upstream's own assertion ("streaming session prefix shrank"), and the release, run
    alone past that point, raises that assertion at that step (0.5.15's trace needs a
    speculative step, 0.5.23's does not)."""
    from kvcheck.adapters.sglang.conformance import past_failure
    from kvcheck.trace import load
    t = load(ROOT / "stateful_tests" / "upstream" / f"u1-prefix-shrank-crash-sglang-{version}.json")
    res = run_ops(t.config, t.ops, None, backend_name="spec")
    b = res.beyond
    assert res.failure is None and b is not None and (b.step, b.reason) == (step, "ModelError"), b
    assert "streaming session prefix shrank: prefix_len=3" in b.details[0], b.details
    states, lines = past_failure(t, version)
    assert len(states) == step, lines               # the steps before ran, that one raised
    assert f"step {step:>3} schedule(rid=7, admit=True): raised" in lines[-1], lines
    assert "AssertionError: streaming session prefix shrank: prefix_len=3" in lines[-1], lines


@pytest.mark.parametrize("version,raised", [
    _release("0.5.23", "AssertionError: new_prefix_len=0, len(new_indices)=1, page_aligned_len=2"),
    _release("0.5.22", "RuntimeError: The expanded size of the tensor (1) must match the existing size (2)")])
def test_u1_close_under_a_prefilling_turn_empties_its_record_then_crashes(version, raised):
    """U1 on 0.5.23's shared record (docs/upstream-findings.md, U1): the stub's detach
    clears `_inflight`, so the deferred close is carried out under turn 21, which runs on
    the slot's record. The spec stops at step 5 (its turn keeps its own row: I17, I4, ...);
    the release, alone there, shows a prefilling request without a row (I29) and I22, and
    raises at the turn's next chunk."""
    from kvcheck.adapters.sglang.conformance import past_failure
    from kvcheck.replay import run_replay
    from kvcheck.trace import load
    t = load(ROOT / "stateful_tests" / "upstream" / f"u1-close-under-running-turn-sglang-{version}.json")
    res = run_replay(t, f"sglang:{version}")
    b = res.beyond
    assert res.failure is None and b is not None and (b.step, b.reason) == (5, "I17"), b
    assert b.release.startswith("I22, I29 (outcome 'ok'); not ") and b.release_differs, b.release
    states, lines = past_failure(t, version)
    assert len(states) == 6, lines
    assert "step   6 prefill_chunk(rid=21): raised" in lines[-1], lines
    assert raised in lines[-1], lines


@pytest.mark.parametrize("version", [_release("0.5.23"), _release("0.5.22")])
def test_u1_restore_cuts_a_running_record_and_the_release_asserts(version):
    """U1 on 0.5.23: turn 3, accepted beside queued turn 1, borrows the record turn 1 runs
    on and cuts it to its own prefix 0; the spec reaches ReqToTokenPool.alloc's assertion,
    and the release, alone there, raises its own wording of it (counted as the same:
    `ModelError.upstream`), the assertion that ends the scheduler."""
    from kvcheck.adapters.sglang.conformance import past_failure
    from kvcheck.replay import run_replay
    from kvcheck.trace import load
    t = load(ROOT / "stateful_tests" / "upstream" / f"u1-restore-cuts-running-record-crash-sglang-{version}.json")
    res = run_replay(t, f"sglang:{version}")
    b = res.beyond
    assert res.failure is None and b is not None and (b.step, b.reason) == (6, "ModelError"), b
    assert b.details[0].startswith("ReqToTokenPool.alloc: req 3 reuses row") and b.release == "the same", b
    states, lines = past_failure(t, version)
    assert len(states) == 6, lines
    assert "step   6 schedule(rid=3, admit=True): raised" in lines[-1], lines
    assert "AssertionError: a reused row must carry allocated KV" in lines[-1], lines


@pytest.mark.parametrize("version", [_release("0.5.23")])
def test_explore_writes_the_first_stop_of_each_kind_where_the_release_differed(version, tmp_path):
    """The exhaustive differential, like fuzz, writes the first stop of each reason where
    the release alone did not show what the spec stopped at, and names it (sglang-tiny to
    depth 6 without the plain request: U1's close under a running turn, I17 on the spec,
    I22 and I29 on the release)."""
    from kvcheck.replay import run_replay
    from kvcheck.trace import load
    p = subprocess.run([sys.executable, "-m", "kvcheck.cli", "explore", "--preset",
                        f"check-sglang-{version}", "--scope", "sglang-tiny", "--max-depth", "6",
                        "--plain", "0", "--backend", f"sglang:{version}", "--accept",
                        "U1,U2,U6,M2", "--out", str(tmp_path), "--quiet"],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    path = tmp_path / "beyond" / "I17-sglang-tiny.json"
    assert f"where it differed (I17), the first: kvcheck replay {path}" in p.stdout, p.stdout
    assert sorted(x.name for x in (tmp_path / "beyond").iterdir()) == ["I17-sglang-tiny.json"]
    trace = load(path)
    assert trace.expect.result == "pass" and trace.meta["scope"] == "sglang-tiny"
    assert "alone: I22, I29 (outcome" in trace.meta["beyond"], trace.meta
    res = run_replay(trace, f"sglang:{version}")
    assert res.failure is None and res.beyond.step == len(trace.ops) - 1
    assert res.beyond.reason == "I17" and res.beyond.release_differs, res.beyond.render()


def test_the_system_under_test_is_run_alone_on_the_step_the_spec_stops_at(spec_alone):
    from kvcheck.engines.stats import beyond_line
    same = run_ops(U1, U1_THEN_CLOSE, spec_alone(U1), backend_name="upstream")
    assert same.ok and same.beyond.step == 4 and same.beyond.release == "the same"
    assert not same.beyond.release_differs
    idle = run_ops(U1, U1_THEN_CLOSE, spec_alone(U1, idle_from=4), backend_name="upstream")
    b = idle.beyond
    assert idle.ok and b.reason == "I22" and b.release_differs, b
    assert b.release == "I20 (outcome 'ok'); not I22", b.release    # what it showed instead
    assert "the system under test at that step, alone: I20" in b.render()
    # the same stop where the release also says it is past what the spec follows of it
    # (0.5.19's R1): explained by that, not counted as differing
    past = run_ops(U1, U1_THEN_CLOSE, spec_alone(U1, idle_from=4, past_at=4),
                   backend_name="upstream").beyond
    assert past.release_past == "R1: test" and not past.release_differs, past
    assert past.release == "I20 (outcome 'ok'); not I22; past what the spec follows of it (R1: test)"
    assert run_ops(U1, U1_THEN_CLOSE, spec_alone(U1, past_at=4),
                   backend_name="upstream").beyond.release == "the same"
    # a release that raises at the stop is a kind of its own: never hidden behind an
    # earlier stop of the same reason where it only showed something else
    class Raises(spec_alone):
        def apply(self, op):
            if self.n == 4:
                raise RuntimeError("[upstream] AssertionError")
            return super().apply(op)
    raised = run_ops(U1, U1_THEN_CLOSE, Raises(U1), backend_name="upstream").beyond
    assert raised.release == "raised RuntimeError: [upstream] AssertionError", raised
    assert (raised.kind, b.kind, same.beyond.kind) == ("I22-raised", "I22", "I22")
    from kvcheck.trace import load
    t = load(ROOT / "stateful_tests" / "upstream" / "u1-prefix-shrank-crash-sglang-0.5.23.json")
    crash = run_ops(t.config, t.ops, spec_alone(t.config), backend_name="upstream")
    assert crash.beyond.reason == "ModelError" and crash.beyond.release == "the same"
    assert run_ops(U1, U1_THEN_CLOSE, None, backend_name="spec").beyond.release is None
    stats = Stats()
    stats.record_beyond("I22", 3, "the same"), stats.record_beyond("I17", 2, "I22 (outcome 'ok')")
    stats.record_beyond("I4", 1), stats.record_beyond("I2", 1, "I20 (outcome 'ok'); not I2", past=True)
    stats.record_beyond("I17", 1, "raised RuntimeError: [upstream] AssertionError")
    assert (stats.beyond_checked, dict(stats.beyond_differs), stats.beyond_past) == \
        (4, {"I17": 1, "I17-raised": 1}, 1)
    assert beyond_line(stats.beyond, stats.not_compared, stats.beyond_checked,
                       stats.beyond_differs, stats.beyond_past).endswith(
        "; the system under test, alone at the stop, showed the same in 1, was past what the "
        "spec follows of it in 1, not in 2 (I17 x1, I17-raised x1)")


def test_a_spec_assertion_the_release_does_not_raise_is_said_so(spec_alone, monkeypatch):
    """A stop at an assertion the spec reached (ModelError) where the release, alone on
    that step, raised nothing: what it showed, and that it raised nothing (not the first
    word of the spec's message as a missing invariant)."""
    def close(s, sid):
        raise M.ModelError("planted: close reaches an assertion")
    plant(monkeypatch, "_close_session", close)
    res = run_ops(U1, U1_THEN_CLOSE, spec_alone(U1, idle_from=4), backend_name="upstream")
    b = res.beyond
    assert res.ok and (b.step, b.reason) == (4, "ModelError") and b.release_differs, b
    assert b.release == "I20 (outcome 'ok'); raised nothing", b.release


@pytest.mark.parametrize("version", [_release("0.5.23")])
def test_fuzz_writes_the_first_stop_of_each_kind_where_the_release_differed(version, tmp_path):
    """A stop where the release, alone on the stop's step, did not show what the spec
    stopped at is where to look next: fuzz writes the first of each reason as a trace,
    names it in the report, and the trace replays up to the stop with both verdicts.
    (Seed 5's sequence 9 on 0.5.23: a session closed under a turn that runs on its
    slot's record; the spec frees row and pages the turn still holds, I4; the release's
    free empties the shared record, so only I22 shows; docs/upstream-findings.md.)"""
    from kvcheck.replay import replay_trace
    from kvcheck.trace import load
    rep = fuzz(seed=5, rounds=10, backend=f"sglang:{version}", out_dir=tmp_path, quiet=True,
               accept=("U1", "U2", "U6", "U7", "M2"))
    assert not rep.found and rep.beyond_differs == {"I4": 1}, rep.render()
    path = Path(rep.beyond_traces["I4"])
    assert path == tmp_path / "beyond" / "I4-seed5-r9.json" and path.exists()
    assert f"where it differed (I4), the first: kvcheck replay {path}" in rep.render()
    trace = load(path)
    assert trace.expect.result == "pass" and "alone: I22" in trace.meta["beyond"]
    res, ok = replay_trace(trace, f"sglang:{version}", verbose=False)
    assert ok and res.beyond is not None and res.beyond.step == len(trace.ops) - 1
    assert res.beyond.reason == "I4" and res.beyond.release_differs, res.beyond.render()


@pytest.mark.parametrize("version", [_release("0.5.23")])
def test_an_interrupted_exploration_keeps_the_stops_it_wrote(version, tmp_path, monkeypatch, capsys):
    """Each first differing stop is written as the walk finds it: Ctrl-C right after the
    first leaves its trace on disk and named on stdout, and the interrupt goes on up."""
    import argparse

    from kvcheck import explore_cmd as X
    from kvcheck.engines import exhaustive
    real = exhaustive.check_transitions

    def interrupted(*a, differ, **kw):
        def then_stop(*d):
            differ(*d)
            raise KeyboardInterrupt
        return real(*a, differ=then_stop, **kw)
    monkeypatch.setattr(exhaustive, "check_transitions", interrupted)
    p = argparse.ArgumentParser()
    X.add_arguments(p)
    ns = p.parse_args(["--preset", f"check-sglang-{version}", "--scope", "sglang-tiny",
                       "--max-depth", "6", "--plain", "0", "--backend", f"sglang:{version}",
                       "--accept", "U1,U2,U6,M2", "--out", str(tmp_path), "--quiet"])
    with pytest.raises(KeyboardInterrupt):
        X.run_scope(X.scopes_from_args(ns)[0], ns)
    path = tmp_path / "beyond" / "I17-sglang-tiny.json"
    assert sorted(x.name for x in (tmp_path / "beyond").iterdir()) == [path.name]
    assert f"where it differed (I17), the first: kvcheck replay {path}" in capsys.readouterr().out


@pytest.mark.parametrize("version", [_release("0.5.19")])
def test_a_stop_where_the_release_is_past_its_model_does_not_count_as_differing(version):
    """0.5.19 shares one session record between the slot and its turn (R1). U2 lets turn 2
    match the slot while retracted turn 1 waits; turn 1's retry then matches the same
    record: the wrapper-era spec copies it (row 0 held by both turns and the slot, I4),
    0.5.19 shares it (turn 1 runs on turn 2's lengths and finishes). The release, alone
    there, shows something else, and says why: past what the spec follows of it."""
    ops = [O.OpenSession(1), O.SubmitTurn(1, 1, (2, 2, 2), 2), O.Schedule(1), O.Retract(1),
           O.SubmitTurn(1, 2, (2,), 2), O.Schedule(2), O.Schedule(1)]
    cfg = Config(page_size=1, num_pages=6, num_rows=2, max_context_len=16, era="wrapper",
                 evict_shortfall=True, accept=("U1", "U2", "U3", "M2"))
    from kvcheck.backends import resolve
    factory, name = resolve(f"sglang:{version}")
    res = run_ops(cfg, ops, factory(cfg), backend_name=name)
    b = res.beyond
    assert res.ok and (b.step, b.reason) == (6, "I4") and not b.release_differs, b
    assert b.release_past.startswith("R1: request 1 matched session 1's record while requests "
                                     "[2] hold it"), b.release_past
    assert b.release.startswith("I20 (outcome 'ok'); not I4; past what the spec follows"), b


@pytest.mark.parametrize("version", [_release("0.5.15"), _release("0.5.19")])
def test_u1_two_first_turns_finish_on_one_slot(version):
    """U1 with no slot yet: two turns of one session admitted on fresh rows both finish.
    The spec stops at the second finish (I2: the slot overwritten with turn 12's row and
    pages, turn 11's leaked); 0.5.15 shows the same; 0.5.19, whose slot shares one record,
    fails `assert kv is self.kv` in SessionSlot.save_from_req, and the error names that
    line although upstream's assert has no message."""
    from kvcheck.replay import run_replay
    from kvcheck.trace import load
    t = load(ROOT / "stateful_tests" / "upstream" / f"u1-two-first-turns-finish-sglang-{version}.json")
    res = run_replay(t, f"sglang:{version}")
    b = res.beyond
    assert res.failure is None and (b.step, b.reason) == (11, "I2"), b
    assert "slot of session 2 (row-page 1)" in b.details[0] and any(
        d.startswith("I4 ") and "row 1 is neither free nor held" in d for d in b.details), b.details
    if version == "0.5.15":
        assert b.release == "the same", b.release
    else:
        assert b.release == ("raised RuntimeError: [sglang-0.5.19] AssertionError (at "
                             "sglang/srt/session/streaming_session.py:67 in save_from_req: "
                             "assert kv is self.kv)"), b.release
        assert b.kind == "I2-raised" and b.release_differs


def test_a_long_release_error_keeps_the_sglang_line_it_came_from():
    from kvcheck.checker import _shorten
    at = " (at sglang/srt/session/streaming_session.py:67 in save_from_req: assert kv is self.kv)"
    said = "RuntimeError: [sglang-0.5.19] ValueError: " + "x" * 600 + at
    short = _shorten(said)
    assert short.endswith("x..." + at) and short.startswith("RuntimeError: [sglang-0.5.19]")
    assert len(short) <= 300 + len("...")
    assert _shorten("AssertionError: short") == "AssertionError: short"
    assert _shorten("E: " + "q" * 400) == "E: " + "q" * 297 + "..."
