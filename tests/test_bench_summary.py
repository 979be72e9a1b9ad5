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



def test_the_parallel_bench_sets_one_process_beside_two_workers(capsys):
    from benchmarks import bench_parallel
    assert bench_parallel.main(["--preset", "tiny"]) == 0
    out = capsys.readouterr().out
    assert "1 worker " in out and "2 workers " in out and "on free cores" in out
    assert "projection to 100,000 states/s" in out and "NOT THE SAME" not in out
