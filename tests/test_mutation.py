"""kvcheck.mutation's own logic (the mutmut run itself is `make mutation-sample`, in CI):
the fixed-seed sample, the score over non-equivalent mutants, the equivalents read from
docs/coverage.md."""
from __future__ import annotations

from kvcheck.mutation import Score, equivalent_mutants, sample, to_run, wilson_interval

NAMES = [f"kvcheck.impl.common.x_f__mutmut_{i}" for i in range(1, 50)]


def test_sample_is_fixed_by_seed_and_count():
    a, b, c = sample(NAMES, 10, 0), sample(reversed(NAMES), 10, 0), sample(NAMES, 10, 1)
    assert a == b and a != c and len(a) == 10 and set(a) <= set(NAMES)
    assert sample(NAMES[:3], 10, 0) == sorted(NAMES[:3])


def test_score_leaves_out_equivalents_and_unchecked_and_lists_survivors():
    res = {"m1": "killed", "m2": "survived", "m3": "timeout", "m4": "no tests",
           "m5": "survived", "m6": "not checked"}
    s = Score(res, equivalent={"m5"})
    assert (s.killed, len(s.judged), s.survivors) == (2, 4, ["m2", "m4"])
    assert s.score == 50.0
    text = s.render()
    assert "2/4 non-equivalent mutants killed (50.0%, 95% CI 15.0-85.0% Wilson)" in text
    assert "SURVIVED (no tests) m4" in text and "equivalent m5" in text


def test_equivalents_come_from_their_section_of_docs_coverage(tmp_path):
    doc = tmp_path / "coverage.md"
    doc.write_text("## Mutation\n\n* `kvcheck.impl.a.x_f__mutmut_1`: a gap\n\n"
                   "## Equivalent mutants\n\n* `kvcheck.impl.a.xǁCǁg__mutmut_2`, `kvcheck.impl.b.x_h__mutmut_3`: why\n"
                   "\n## Later\n\n* `kvcheck.impl.c.x_k__mutmut_4`\n")
    assert equivalent_mutants(doc) == {"kvcheck.impl.a.xǁCǁg__mutmut_2", "kvcheck.impl.b.x_h__mutmut_3"}
    assert len(equivalent_mutants()) >= 3            # the project's own list parses


def test_exit_status_gates_on_min_score(monkeypatch, capsys):
    """`make mutation-sample` (CI) fails when the sample's score falls under its floor."""
    import kvcheck.mutation as M
    results = {f"m{i}": ("killed" if i < 3 else "survived") for i in range(4)}     # 75%
    monkeypatch.setattr(M, "run", lambda *a, **k: Score(results, equivalent=set()))
    assert M.main(["--sample", "4", "--min-score", "75"]) == 0
    assert M.main(["--sample", "4", "--min-score", "80"]) == 1
    assert "3/4 non-equivalent mutants killed (75.0%, 95% CI" in capsys.readouterr().out


def test_wilson_interval():
    lo, hi = wilson_interval(180, 200)             # 90%: a textbook value
    assert (round(100 * lo, 1), round(100 * hi, 1)) == (85.1, 93.4)
    assert wilson_interval(20, 20)[1] == 1.0 and wilson_interval(20, 20)[0] > 0.83
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_a_growing_sample_runs_only_the_mutants_without_a_verdict():
    results = {"a": "killed", "b": "survived", "c": "not checked",
               "d": "check was interrupted by user"}
    assert to_run(["a", "b", "c", "d", "e"], results, reuse=True) == ["c", "d", "e"]
    assert to_run(["a", "b", "c"], results, reuse=False) == ["a", "b", "c"]
    assert set(sample(NAMES, 10, 4)) < set(sample(NAMES, 20, 4)) < set(sample(NAMES, 45, 4))


def test_run_reuses_verdicts_only_for_the_same_examples_and_oracle(monkeypatch, tmp_path):
    """`make mutation` (no --sample) and a sample both go through run(): the mutants
    without a verdict are run, in one mutmut call; another --examples runs them all."""
    import kvcheck.mutation as M
    calls, verdicts = [], {"a": "killed", "b": "not checked", "c": "survived"}
    monkeypatch.setattr(M, "RUN_RECORD", tmp_path / "kvcheck-run.json")
    monkeypatch.setattr(M, "_mutmut", lambda *names, env=None: calls.append(names))
    monkeypatch.setattr(M, "_generate", lambda env=None: calls.append(("generate",)) or 0)
    monkeypatch.setattr(M, "mutant_results", lambda: dict(verdicts))
    monkeypatch.setattr(M, "equivalent_mutants", lambda: set())
    s = M.run(None, examples=60)                        # no record yet: every mutant
    assert calls == [("generate",), ("a", "b", "c")] and s.results == verdicts
    calls.clear()
    M.run(None, examples=60)                            # same examples: only "b"
    assert calls == [("generate",), ("b",)]
    calls.clear()
    M.run(2, seed=0, examples=30)                       # other examples: both sampled
    assert calls[1] == tuple(sample(verdicts, 2, 0))
    calls.clear()
    M.run(None, examples=30)                            # same examples and oracle: only "b"
    assert calls == [("generate",), ("b",)]
    calls.clear()
    monkeypatch.setattr(M, "oracle_fingerprint", lambda: "a new corpus trace")
    M.run(None, examples=30)                            # another oracle: every mutant again
    assert calls == [("generate",), ("a", "b", "c")]


def test_the_oracle_fingerprint_moves_with_a_corpus_trace(monkeypatch, tmp_path):
    import kvcheck.mutation as M
    (tmp_path / "stateful_tests").mkdir()
    trace = tmp_path / "stateful_tests" / "t.json"
    trace.write_text("{}")
    monkeypatch.setattr(M, "ROOT", tmp_path)
    monkeypatch.setattr(M, "ORACLE", ("stateful_tests",))
    before = M.oracle_fingerprint()
    assert M.oracle_fingerprint() == before
    trace.write_text('{"ops": []}')
    assert M.oracle_fingerprint() != before


def test_report_scores_the_recorded_verdicts_without_running(monkeypatch, capsys):
    import kvcheck.mutation as M
    monkeypatch.setattr(M, "_mutmut", lambda *a, **k: (_ for _ in ()).throw(AssertionError))
    monkeypatch.setattr(M, "mutant_results", lambda: {"a": "killed", "b": "survived"})
    monkeypatch.setattr(M, "equivalent_mutants", lambda: {"b"})
    monkeypatch.setattr(M, "MUTANTS", M.ROOT)                  # a folder that exists
    assert M.main(["--report", "--min-score", "100"]) == 0
    assert "1/1 non-equivalent mutants killed" in capsys.readouterr().out


def test_run_does_not_run_the_mutants_judged_equivalent(monkeypatch, tmp_path, capsys):
    """A mutant docs/coverage.md judges equivalent would survive the whole test command
    (the slowest verdict): it is not run, and the score leaves it out as before."""
    import kvcheck.mutation as M
    calls, verdicts = [], {"a": "not checked", "b": "not checked", "c": "not checked"}
    monkeypatch.setattr(M, "RUN_RECORD", tmp_path / "kvcheck-run.json")
    monkeypatch.setattr(M, "_mutmut", lambda *names, env=None: calls.append(names))
    monkeypatch.setattr(M, "_generate", lambda env=None: calls.append(("generate",)) or 0)
    monkeypatch.setattr(M, "mutant_results", lambda: dict(verdicts))
    monkeypatch.setattr(M, "equivalent_mutants", lambda: {"b"})
    s = M.run(None, examples=60)
    assert calls == [("generate",), ("a", "c")]
    assert "3 mutant(s): 1 judged equivalent (docs/coverage.md, not run), 0 judged before " \
           "(reused), 2 to run" in capsys.readouterr().out
    assert s.equivalent == {"b"} and "b" not in s.judged
    assert "  equivalent b (not run)" in s.render()
