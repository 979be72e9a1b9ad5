"""`prove` (and check's proofs part) prints each result as it completes, verbose or not."""
from __future__ import annotations

from kvcheck import proofs
from kvcheck.proofs import induction, lemmas
from kvcheck.proofs.core import Result


def test_results_stream_one_line_each_before_the_run_ends(monkeypatch, capsys):
    seen_before_second = []

    def fake_lemma(lem):
        seen_before_second.append(capsys.readouterr().err)
        return [Result(f"lemma {lem}", "lemma", "proved", 0.01, detail="long detail")]

    monkeypatch.setattr(lemmas, "LEMMAS", ["a", "b"])
    monkeypatch.setattr(lemmas, "run_lemma", fake_lemma)
    monkeypatch.setattr(induction, "units", lambda: [])
    res = proofs.run_all(verbose=False, crosshair=False)
    assert [r.name for r in res] == ["lemma a", "lemma b"]
    assert seen_before_second[0] == "" and "lemma a" in seen_before_second[1]
    tail = capsys.readouterr().err
    assert "lemma b" in tail and "long detail" not in seen_before_second[1] + tail
