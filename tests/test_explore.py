"""kvcheck explore: the check preset is clean on the spec; planted spec defects are found
with a shortest trace that replays (run_ops) to the same violation; symmetry reduction
agrees with the unreduced search; the step-invariant prefilter is sound."""
from __future__ import annotations

import argparse
import json
from dataclasses import replace

import pytest

from kvcheck import explore as E
from kvcheck import explore_cmd as EC
from kvcheck.errors import ROOT
from kvcheck.explore import frontier, search
from kvcheck.checker import run_ops
from kvcheck.trace import load
from kvcheck.spec import model as M
from kvcheck.spec.allocator import _free_pages
from kvcheck.spec.invariants import check_step
from kvcheck.spec.pages import row_pages
from kvcheck.spec.sessions import _free_tail, find_active_slot
from kvcheck.spec.view import abstract

from spec_patch import plant

TINY = E.PRESETS["tiny"][0]


# ---------------------------------------------------------------------------
# planted defects: buggy variants of the spec's functions (planted by `spec_patch.plant`)
# ---------------------------------------------------------------------------

def _free_tail_unaligned(s, slot, req, prefix_len):
    """_free_tail freeing from prefix_len instead of ceil_align(prefix_len): the partial
    page that still holds committed KV goes back to the allocator."""
    r = s.rows[slot.row]
    _free_pages(s, [r[k] for k in row_pages(prefix_len, slot.allocated, s.cfg.page_size)])
    slot.allocated = prefix_len
    slot.committed = min(slot.committed, prefix_len)
    req.allocated = prefix_len
    req.committed = min(req.committed, prefix_len)


_orig_find = find_active_slot


def _find_popping_slot(s, req):
    """restore clears the slot (pops it from the session's slot map)."""
    slot = _orig_find(s, req)
    if slot is not None:
        del s.slots[req.session]
    return slot


def _abort_req_unconditional(s, sid, req, unconditional=False):
    """Session.abort_req clears _inflight whoever the request is (hazard H3), as upstream
    does (the model's `unconditional`, on for any caller)."""
    sess = s.sessions.get(sid)
    if sess is not None:
        sess.inflight_rid = None


DEFECTS = {
    "free_tail_unaligned": ("_free_tail", _free_tail_unaligned),
    "restore_clears_slot": ("find_active_slot", _find_popping_slot),
    "abort_req_unconditional": ("_abort_req", _abort_req_unconditional),
}


def _args(**kw):
    ap = argparse.ArgumentParser()
    EC.add_arguments(ap)
    argv = []
    for k, v in kw.items():
        flag = "--" + k.replace("_", "-")
        if v is True:
            argv.append(flag)
        else:
            argv += [flag, str(v)]
    return ap.parse_args(argv)


# ---------------------------------------------------------------------------

def test_zz_check_preset_clean_and_covers_its_goals():
    """The `check` preset's scopes, each cut to 8 steps (`make check` explores them whole,
    357,263 states): clean, and together they reach every goal that applies to one of
    them, which is what `kvcheck check`'s reachability part requires of the whole run."""
    from kvcheck.check import unreached_goals
    goals = []
    for sc in E.PRESETS["check"]:
        res = E.explore(replace(sc, max_depth=min(sc.max_depth, 8)))
        assert not res.violations, [v.message for v in res.violations]
        assert res.states > 1000
        goals.append({"missed": E.missed(res), "reached": sorted({*res.op_first, *res.reached})})
    assert unreached_goals(goals) == [], unreached_goals(goals)
    assert len({sc.name for sc in E.PRESETS["check"]}) == len(E.PRESETS["check"])


def test_a_goal_is_unreached_only_when_no_scope_reaches_it():
    from kvcheck.check import unreached_goals
    a = {"missed": ["split_under_lock", "retract"], "reached": ["schedule", "decode"]}
    b = {"missed": ["split_under_lock"], "reached": ["retract", "schedule"]}
    assert unreached_goals([a, b]) == ["split_under_lock"]
    assert unreached_goals([a]) == ["retract", "split_under_lock"]
    assert unreached_goals([b, {"missed": [], "reached": ["split_under_lock"]}]) == []


@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_planted_defect_found_shortest_and_replays(defect, monkeypatch, tmp_path):
    fname, fn = DEFECTS[defect]
    plant(monkeypatch, fname, fn)
    red = E.explore(TINY, symmetric=True)
    assert red.violations, f"{defect} not found"
    v = red.violations[0]
    # the trace file replays on the (still defective) spec to the same violation and step
    path = E.to_trace(red, v).save(tmp_path / "t.json")
    tr = load(path)
    assert tr.expect.result == "violation" and tr.expect.backend == "spec"
    rr = run_ops(tr.config, tr.ops)
    assert rr.failure is not None
    assert (rr.failure.id, rr.failure.step) == (tr.expect.invariant, tr.expect.step) == (v.id, v.depth - 1)
    # shortest: breadth-first, and the unreduced search finds it at the same depth
    unred = E.explore(TINY, symmetric=False)
    assert unred.violations and unred.violations[0].depth == v.depth
    # on the correct spec the same ops pass
    monkeypatch.undo()
    assert run_ops(tr.config, tr.ops).ok


def test_reduced_and_unreduced_agree_on_all_violations(monkeypatch):
    """With --all, the two searches record the same violation ids at the same depths, for
    the correct spec and for each planted defect; the reduced one visits fewer states."""
    for defect in [None] + sorted(DEFECTS):
        with monkeypatch.context() as mp:
            if defect:
                plant(mp, *DEFECTS[defect])
            a = E.explore(TINY, symmetric=True, all_violations=True)
            b = E.explore(TINY, symmetric=False, all_violations=True)
        ids = lambda r: sorted((v.id, v.depth) for v in r.violations)
        assert ids(a) == ids(b), defect
        assert a.states < b.states, defect
        if defect is None:
            assert not a.violations
            assert a.reached == b.reached
            assert a.op_first == b.op_first


_orig_free_tail = _free_tail


def _free_tail_shrinking_slot(s, slot, req, prefix_len):
    """every restore takes one more committed token off the slot, so a restore retried
    after a rejected admission changes the slot (I25)."""
    _orig_free_tail(s, slot, req, prefix_len)
    slot.committed = max(0, slot.committed - 1)


STEP_DEFECTS = {
    "restore_shrinks_slot": ("_free_tail", _free_tail_shrinking_slot),
}


def test_step_prefilter_is_sound(monkeypatch):
    """Whenever check_step reports something, step_check_needed said so (correct spec and
    planted defects, every transition of the tiny scope, without dedup shortcuts). The
    defects make I10 and I25 fire; I16's clause is checked on a hand-made transition."""
    fired_ids = set()
    defects = {**DEFECTS, **STEP_DEFECTS}
    for defect in [None] + sorted(defects):
        with monkeypatch.context() as mp:
            if defect:
                plant(mp, *defects[defect])
            sc = replace(TINY, max_depth=7)
            frontier, seen, fired = [M.initial_state(sc.cfg)], set(), 0
            for _ in range(sc.max_depth):
                nxt = []
                for s in frontier:
                    a = abstract(s)
                    for op in E.candidate_ops(s, sc):
                        try:
                            s2, out = M.step(s, op)
                            a2 = abstract(s2)       # a defect may leave a dangling anchor
                        except Exception:
                            continue
                        vs = check_step(a, op, out, a2)
                        if vs:
                            fired += 1
                            fired_ids.update(v.id for v in vs)
                            assert E.step_check_needed(s, op, out, s2), (defect, op)
                        k = E.state_key(s2)
                        if k not in seen:
                            seen.add(k)
                            nxt.append(s2)
                frontier = nxt
    assert {"I10", "I25"} <= fired_ids, fired_ids
    # I16: a locked node that a step removes (a defect that evicts one leaves a dangling
    # anchor that no view can show, so the clause is checked on a hand-made transition)
    from kvcheck.spec import ops as O
    s = M.initial_state(TINY.cfg)
    for op in (O.SubmitRequest(1, (2, 2, 3), 2), O.Schedule(1)):
        s, _ = M.step(s, op)
    locked = [nid for nid, n in dict.items(s.nodes) if nid != 0 and n.lock_ref > 0]
    assert locked
    after = s.clone()
    del after.nodes[locked[0]]
    assert E.step_check_needed(s, O.Evict(2), "ok", after)


def test_state_key_is_invariant_under_renaming():
    """Renaming sids/rids/pages/rows of a state leaves its symmetric key unchanged."""
    from kvcheck.spec import ops as O
    cfg = TINY.cfg
    ops = [O.OpenSession(1), O.SubmitTurn(1, 1, (2, 2, 2), 2), O.SubmitRequest(2, (2, 2, 3), 2),
           O.Schedule(1), O.Schedule(2)]
    ops2 = [O.OpenSession(5), O.SubmitRequest(7, (2, 2, 3), 2), O.SubmitTurn(5, 3, (2, 2, 2), 2),
            O.Schedule(7), O.Schedule(3)]
    s, t = M.initial_state(cfg), M.initial_state(cfg)
    for op in ops:
        s, _ = M.step(s, op)
    for op in ops2:
        t, _ = M.step(t, op)
    assert E.state_key(s) == E.state_key(t)
    assert E.state_key(s, False) != E.state_key(t, False)


def test_budget_stops_cleanly_and_cli(tmp_path, capsys, monkeypatch):
    res = E.explore(E.preset_scope("check", "check-overlap"), max_states=500)
    assert res.stopped and res.states == 500 and not res.violations
    assert EC.main(_args(preset="tiny", quiet=True, out=tmp_path)) == 0
    assert "no violation" in capsys.readouterr().out
    assert EC.main(_args(preset="nope")) == 2
    assert EC.main(_args(preset="tiny", page_size=3)) == 2      # ctx 16 % 3: bad config
    plant(monkeypatch, *DEFECTS["abort_req_unconditional"])
    assert EC.main(_args(preset="tiny", quiet=True, out=tmp_path)) == 1
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1
    data = json.loads(files[0].read_text())
    assert data["expect"]["result"] == "violation" and data["#meta"]["source"] == "explore"


def _snapshot(s) -> str:
    """Every field of a spec state, read without copy-on-write (plain dict snapshots)."""
    maps = tuple(sorted(dict(m).items()) for m in (s.nodes, s.reqs, s.slots, s.sessions, s.rows))
    return repr((maps, sorted(s.content.items()), s.free_pages, s.free_rows, s.next_node_id,
                 s.evictable_size, s.protected_size, s.tick, s.swa_free_pages,
                 sorted(s.full_to_swa_index_mapping.items()), s.mamba_free_slots, s.forward_iter))


@pytest.mark.parametrize("preset", ["tiny", "hybrid", "mamba-tree"])
def test_a_step_never_mutates_its_argument(preset):
    """Copy-on-write (kvcheck.spec.state.CowMap): on every state of the preset (depth-bounded),
    every enabled operation leaves the state it was applied to exactly as it was, and two
    steps from one state do not see each other's effects."""
    sc = replace(E.PRESETS[preset][0], max_depth=6)
    frontier, seen, checked = [M.initial_state(sc.cfg)], set(), 0
    for _ in range(sc.max_depth):
        nxt = []
        for s in frontier:
            before = _snapshot(s)
            succ = [(op,) + M.step(s, op) for op in E.candidate_ops(s, sc)]
            assert _snapshot(s) == before
            for op, s2, _ in succ:
                again, _ = M.step(s, op)
                assert _snapshot(again) == _snapshot(s2), op
                checked += 1
                k = E.state_key(s2)
                if k not in seen:
                    seen.add(k)
                    nxt.append(s2)
        frontier = nxt
    assert checked > 1000


@pytest.mark.parametrize("preset", ["tiny", "hybrid", "mamba-tree"])
def test_clone_copies_every_mutable_field(preset):
    """State.clone copies field for field: every list, dict and CowMap of the clone is its
    own (a field added to State later is covered without naming it here)."""
    from kvcheck.spec.state import State
    sc = E.PRESETS[preset][0]
    s = M.initial_state(sc.cfg)
    for op in E.candidate_ops(s, sc)[:1]:
        s, _ = M.step(s, op)
    c = s.clone()
    for f in State.__dataclass_fields__:
        a, b = getattr(s, f), getattr(c, f)
        assert a == b, f
        if isinstance(a, (list, dict)):
            assert a is not b, f"State.clone shares the field {f}"


@pytest.mark.parametrize("preset", ["tiny", "hybrid", "mamba-tree"])
def test_tree_key_memo_matches_a_fresh_key(preset):
    """state_key reuses the tree's key fragment kept on the node map (CowMap._memo) when a
    step touched no node; on every successor of the preset (depth-bounded), with and
    without symmetry, the key equals the key computed with the memo dropped."""
    sc = replace(E.PRESETS[preset][0], max_depth=5)
    reused = 0
    for s in E.reachable_states(sc):
        for op in E.candidate_ops(s, sc):
            for sym in (True, False):
                E.state_key(s, sym)             # the parent's memo, inherited by the fork
                s2, _ = M.step(s, op)
                memo = s2.nodes._memo
                reused += memo is not None and memo[0] is sym
                k = E.state_key(s2, sym)
                s2.nodes._memo = None
                assert k == E.state_key(s2, sym), op
    assert reused > 500


def _search_record(r) -> tuple:
    """Everything a search decides: its counts, levels, visited set and parent links,
    violations with their traces, goals reached."""
    return (r.states, r.transitions, r.level_sizes, r.complete_depth, r.exhausted, r.stopped,
            r.visited[0], list(r.visited[1]), list(r.visited[2]), [str(o) for o in r.op_table],
            [(v.id, v.depth, [str(o) for o in v.ops]) for v in r.violations],
            r.reached, dict(r.op_counts), dict(r.outcome_counts))


@pytest.mark.parametrize("scope", [TINY, replace(E.preset_scope("hybrid", "check-hybrid"), max_depth=7),
                                   replace(E.preset_scope("mamba-tree", "mamba-tree"), max_depth=6),
                                   replace(E.preset_scope("check", "check-overlap"), max_depth=7)],
                         ids=lambda sc: sc.name)
def test_a_frontier_rebuilt_by_re_execution_gives_the_same_search(scope):
    """A level over `frontier_states` is not kept but rebuilt from the parent links when
    it is expanded (`_level_states`): never kept (0), kept until a level passes 40 states
    (the switch in the middle of a level) and always kept (None) give the same states,
    transitions, parent links, goals and violations."""
    kept = _search_record(E.explore(scope, frontier_states=None))
    assert kept[0] > 400
    for budget in (0, 40):
        assert _search_record(E.explore(scope, frontier_states=budget)) == kept, budget


@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_a_rebuilt_frontier_finds_the_same_violations(defect, monkeypatch):
    plant(monkeypatch, *DEFECTS[defect])
    for first_only in (True, False):
        kept = E.explore(TINY, frontier_states=None, all_violations=not first_only)
        assert kept.violations
        assert (_search_record(E.explore(TINY, frontier_states=0, all_violations=not first_only))
                == _search_record(kept))


def test_a_level_is_rebuilt_state_for_state():
    """Each rebuilt state of every level has the key of the state the search kept there."""
    sc = replace(E.preset_scope("check", "check-overlap"), max_depth=7)
    states = E.reachable_states(sc)
    r = E.explore(sc, frontier_states=None, check=False)
    assert r.states == len(states)
    _, parents, via = r.visited
    starts = [0]
    for n in r.level_sizes:
        starts.append(starts[-1] + n)
    s0 = M.initial_state(sc.cfg)
    for d in range(len(r.level_sizes)):
        rebuilt = list(frontier._level_states(s0, d, starts, parents, via, r.op_table))
        assert [i for i, _, _ in rebuilt] == list(range(starts[d], starts[d + 1]))
        assert [E.state_key(s) for _, s, _ in rebuilt] == [E.state_key(s) for s in states[starts[d]:starts[d + 1]]]


def test_explore_frontier_states_flag(tmp_path, capsys, monkeypatch):
    """`kvcheck explore --frontier-states N` reaches the search: 0 rebuilds every level
    past the first, the default keeps tiny's small levels."""
    rebuilt = []
    real = search._level_states
    monkeypatch.setattr(search, "_level_states", lambda s0, d, *a: rebuilt.append(d) or real(s0, d, *a))
    assert EC.main(_args(preset="tiny", quiet=True, out=tmp_path)) == 0
    assert rebuilt == []
    assert EC.main(_args(preset="tiny", quiet=True, out=tmp_path, frontier_states=0)) == 0
    assert rebuilt == list(range(1, TINY.max_depth + 1))
    out = capsys.readouterr().out
    assert "no violation" in out
    assert f"depths not kept in memory (over 0 states; rebuilt by re-execution where expanded): {rebuilt}" in out


def test_the_progress_line_says_the_peak_memory(capsys):
    """A long run's progress line names the process's peak RSS in MiB."""
    res = E.explore(TINY, max_states=50)
    EC._progress(res, 3, 7, 1.5)
    line = capsys.readouterr().err
    assert line.startswith("[explore tiny] depth 4: 50 states (33/s), ")
    mib = float(line.split("peak RSS ")[1].split(" MiB")[0].replace(",", ""))
    assert 20 < mib < 100_000 and abs(mib - EC.peak_rss() / (1 << 20)) < 64


PEAK = """
import sys
from kvcheck.explore_cmd import peak_rss
a = peak_rss()
b = bytearray(200 << 20)            # touched: 200 MiB resident
print(a >> 20, peak_rss() >> 20)
"""


def test_peak_rss_is_this_programs_own_and_in_bytes():
    """`peak_rss` (the progress line, `bench_explore --memory`) counts what this program
    holds, in bytes: a child started from this large test process begins small (Linux's
    ru_maxrss would begin at the parent's size), and 200 MiB it allocates show as 200."""
    import subprocess
    import sys
    ballast = bytearray(300 << 20)      # this process: over 300 MiB resident
    p = subprocess.run([sys.executable, "-c", PEAK], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    del ballast
    assert p.returncode == 0, p.stderr
    before, after = map(int, p.stdout.split())
    assert before < 250 and 190 <= after - before <= 260, (before, after)
