"""The guided engine: a corpus of sequences that reached new branches, sequences derived
from it (each mutation keeps operations well-formed), reproducible per seed, replayed
through the walk, and planted faults still found."""
from __future__ import annotations

from dataclasses import replace

import random

import pytest

from kvcheck.engines import ENGINES
from kvcheck.engines import guided as G
from kvcheck.engines.draw import RandomDrawer
from kvcheck.engines.guided import (MUTATIONS, Entry, Guided, change_argument, change_config,
                                    derive, effect_features, pick, plan_traits, shape,
                                    step_features)
from kvcheck.engines.stats import Stats
from kvcheck.engines.walk import draw_plan, plan_rng, walk
from kvcheck.spec.model import step
from kvcheck.spec.state import initial_state
from kvcheck.spec import ops as O
from kvcheck.spec.config import Config
from kvcheck.spec.ops import cross_field_error
from kvcheck.spec.fields import field_error


def test_guided_is_an_engine():
    assert "guided" in ENGINES


def test_walk_applies_a_script_first_leaving_out_what_the_spec_refuses():
    script = [O.OpenSession(5), O.Finish(99), O.SubmitTurn(5, 6, (1, 2, 3), 2), O.Schedule(6)]
    seq = walk(0, 0, None, "spec", Stats(), cfg=Config(), script=script, length=10)
    assert seq.ops[:3] == [script[0], script[2], script[3]]      # Finish(99): not enabled
    assert len(seq.ops) <= 10 and seq.cfg == replace(Config(), drain=True)   # walks drain
    new_ids = [o.rid for o in seq.ops[3:] if isinstance(o, (O.SubmitTurn, O.SubmitRequest))]
    assert all(r > 6 for r in new_ids), "fresh ids must not collide with the script's"


def _campaign(n, seed=3):
    g = Guided(seed, "spec")
    seqs = [g.run(i, None, "spec", Stats()) for i in range(n)]
    g.pause()
    return g, seqs


def test_corpus_grows_and_sequences_are_derived_reproducibly():
    g, seqs = _campaign(60)
    assert g.corpus and g.derived > 0.4 * G.MUTATE_SHARE * (60 - G.WARMUP)
    assert all(s.failure is None for s in seqs)
    g2, seqs2 = _campaign(60)
    assert [(s.cfg, s.ops) for s in seqs] == [(s.cfg, s.ops) for s in seqs2]
    plain = [walk(3, i, None, "spec", Stats()) for i in range(60)]
    assert [s.ops for s in plain] != [s.ops for s in seqs]


@pytest.mark.parametrize("how", MUTATIONS)
def test_every_mutation_gives_well_formed_operations(how):
    g, _ = _campaign(25)
    rng = random.Random(how)
    for _ in range(50):
        cfg, script, length = derive(how, g.corpus, rng, Config(page_size=2, num_pages=9))
        assert isinstance(cfg, Config) and length >= len(script)
        for op in script:
            assert not field_error(op, op.name) and not cross_field_error(op), op


def test_change_argument_keeps_spec_decode_consistent():
    rng = random.Random(0)
    op = O.SpecDecode(3, 3, 3, 1)
    for _ in range(200):
        new = change_argument(op, [3, 4], rng)
        assert 0 <= new.accepted <= new.drafts <= 3 and new.rid in (3, 4)


def test_change_config_takes_one_field_or_the_fresh_config():
    base, fresh = Config(page_size=1, num_pages=8), Config(page_size=4, num_pages=6, chunk_size=8)
    assert change_config(base, fresh, "num_rows").num_rows == fresh.num_rows
    got = change_config(base, fresh, "page_size")
    assert (got.page_size, got.num_pages, got.chunk_size) == (4, 6, 8)


def test_guided_campaign_still_finds_a_planted_fault(tmp_path):
    from kvcheck.fuzz import Console, fuzz
    rep = fuzz(None, 0, "impl", tmp_path, rounds=40, engine="guided", stop_on_first=True,
               planted=("free_no_page_dedup",), shrink_replays=0, console=Console(quiet=True))
    assert rep.found and rep.engine == "guided"


def test_step_features_name_outcome_shape_previous_step_arguments_and_paths():
    sh = shape(Config(page_size=2, num_pages=8, spec_enabled=True))
    op = O.SubmitRequest(7, (1, 2, 3), 4, None)
    got = step_features(sh, op, "ok", ["retract-retry"], "finish:ok")
    assert got == ["submit_request:ok", f"{sh}|submit_request:ok",
                   "finish:ok>submit_request:ok", f"{sh}|submit_request:ok(2,3,None)",
                   "path:retract-retry", f"{sh}|path:retract-retry"]
    assert sh == "P2s--wra--"
    other = step_features(sh, O.SubmitRequest(9, (4, 5, 6), 4, None), "ok", [], "finish:ok")
    assert set(other) <= set(got), "ids and token values are not features"


def test_corpus_entries_found_something_new_and_rare_ones_are_picked_more():
    g, _ = _campaign(40)
    assert len(g.corpus) == len(g.found) and all(g.found)
    assert all(0 < e.rarity <= 1 for e in g.corpus)
    rare, common = Entry(Config(), [], rarity=1.0), Entry(Config(), [], rarity=0.01)
    corpus = [rare] + [common] * 20
    rng = random.Random(0)
    picks = [pick(corpus, rng) for _ in range(400)]
    assert picks.count(rare) > 100         # half by rarity (~1/1.2 of those), half recent


def test_a_drawn_plan_runs_the_walk_engines_own_sequence_and_observe_changes_nothing():
    seen = []
    for i in range(6):
        own = walk(4, i, None, "spec", Stats())
        plan = draw_plan(RandomDrawer(plan_rng(4, i)))
        assert replace(plan.cfg, drain=True) == own.cfg
        got = walk(4, i, None, "spec", Stats(), plan=plan,
                   observe=lambda b, op, out, a, paths: seen.append((b, op, out, a)))
        assert got.ops == own.ops and got.cfg == own.cfg
        assert [x[1] for x in seen[-len(got.ops):]] == got.ops if got.ops else True
    assert all(b is not a and step(b, op)[1] == out for b, op, out, a in seen)
    assert len(seen) == sum(len(walk(4, i, None, "spec", Stats()).ops) for i in range(6))


def test_fresh_walks_preview_plans_and_run_the_one_with_the_rarest_traits(monkeypatch):
    g = Guided(7, "spec")
    first = g.preview(0, None)
    own = draw_plan(RandomDrawer(plan_rng(7, 0)))
    assert first.cfg == own.cfg and first.weights == own.weights, "a tie keeps the walk's own"
    plans = [draw_plan(RandomDrawer(plan_rng(7, 1, f"plan{k}" if k else ""))) for k in range(4)]
    g.traits.clear()
    for p in plans[:3]:                     # every trait of three plans seen many times
        g.traits.update({t: 50 for t in plan_traits(p)})
    assert g.preview(1, None).cfg == plans[3].cfg
    monkeypatch.setattr(G, "PREVIEW", 1)
    assert g.preview(1, None).cfg == plans[0].cfg


def test_previewed_fresh_walks_spread_over_more_traits_than_the_walks_own():
    g = Guided(0, "spec")
    guided = [g.preview(i, None) for i in range(40)]
    own = [draw_plan(RandomDrawer(plan_rng(0, i))) for i in range(40)]

    def spread(plans):
        return len({t for p in plans for t in plan_traits(p)})
    assert spread(guided) > spread(own) + 5


def test_effect_features_name_pages_taken_a_full_pool_and_the_page_boundary():
    cfg = Config(page_size=4, num_pages=2, num_rows=2)
    s0 = initial_state(cfg)
    s1, out1 = step(s0, O.SubmitRequest(1, (1, 2, 3, 4, 5), 4, None))
    s2, out2 = step(s1, O.Schedule(1))
    feats = effect_features("sh", s1, O.Schedule(1), out2, s2)
    assert f"schedule:{out2}:pages-1:2" in feats                  # two pages taken
    assert f"schedule:{out2}:queued>prefill" in feats or f"schedule:{out2}:queued>decode" in feats
    assert any(f.startswith(f"P4|schedule:{out2}:c+1") for f in feats)   # 5 tokens: one past
    assert f"sh|schedule:{out2}:kv-full" in feats                 # both pages in use
    quiet = effect_features("sh", s0, O.SubmitRequest(1, (1, 2, 3, 4, 5), 4, None), out1, s1)
    assert not any("full" in f for f in quiet) and f"submit_request:{out1}:pages0:0" in quiet


def test_derived_sequences_keep_their_parents_configuration():
    g, _ = _campaign(30)
    assert "config" not in G.DERIVE_MUTATIONS
    parents = {e.cfg for e in g.corpus}
    rng = random.Random(1)
    for how in G.DERIVE_MUTATIONS:
        for _ in range(20):
            cfg, _, _ = derive(how, g.corpus, rng, Config(page_size=2, num_pages=9))
            assert cfg in parents, how


def test_bench_coverage_reads_tune_settings_and_prints_no_found_lines_unless_verbose(tmp_path,
                                                                                   capfd):
    from benchmarks.bench_coverage import TUNE, first_report, parse_settings
    assert parse_settings("PREVIEW=1,DERIVE_MUTATIONS=('extend','swap')") == {
        "PREVIEW": 1, "DERIVE_MUTATIONS": ("extend", "swap")}
    assert all(hasattr(G, k) for spec in TUNE for k in parse_settings(spec))
    _, seqs = first_report("free_no_page_dedup", "guided", 0, 20, tmp_path / "a")
    assert seqs < 20
    assert "FOUND" not in capfd.readouterr().err
    first_report("free_no_page_dedup", "guided", 0, 20, tmp_path / "b", verbose=True)
    assert "FOUND" in capfd.readouterr().err
