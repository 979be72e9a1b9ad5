"""`make bench`'s driver prints one summary with the explorer's old and new figures on
the same scope and the same state count."""
from __future__ import annotations

from benchmarks import summary


def test_summary_compares_old_and_new_explorer_on_the_same_states(capsys, monkeypatch):
    monkeypatch.setattr(summary, "free_cores", lambda: 0.0)
    assert summary.main(["--quick", "--parts", "explore,scale"]) == 0
    out = capsys.readouterr().out
    table = out.split("== summary", 1)[1]
    assert "old explorer, states/CPU-s" in table and "new explorer, states/CPU-s" in table
    assert "NOT THE SAME" not in table
    assert "scale: 1 vs 2 workers" in table and "not measured" in table
    # the whole search's memory per state, every level kept vs every level rebuilt
    row = next(line for line in table.splitlines() if "peak RSS bytes/state" in line)
    kept, rebuilt = (int(x.replace(",", "")) for x in row.split("rebuilt)")[1].split(";")[0].split("->"))
    assert 0 < rebuilt < kept / 4, row


def test_summary_sets_one_process_beside_two_workers_on_the_same_result(capsys, monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",        # no Ray start in a unit test
                        lambda name, *a: None if name == "ray" else real(name, *a))
    assert summary.main(["--quick", "--parts", "parallel"]) == 0
    table = capsys.readouterr().out.split("== summary", 1)[1]
    assert "parallel bench: 1 worker" in table and "parallel bench: 2 workers" in table
    assert "on free cores" in table and "NOT THE SAME" not in table
