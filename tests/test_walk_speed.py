"""The walk engine's per-step cuts keep what they replace: the same draws, the same
SWA mapping view, the same impl behaviour under inference mode; and the benchmarks
that report them (bench_diff --against, bench_scale's CPU time, summary --force)."""
from __future__ import annotations

import random
import subprocess
import sys

import torch

from kvcheck.adapters.impl import ImplBackend
from benchmarks import bench_diff, bench_scale, summary
from kvcheck.impl.checks import snapshot
from kvcheck.engines.stats import Stats
from kvcheck.engines.walk import walk, weighted_pick
from kvcheck.spec import ops as O
from kvcheck.spec.config import Config


def test_weighted_pick_draws_what_random_choices_draws():
    names, weights = ["a", "b", "c", "d"], [1.0, 0.25, 4.0, 2.0]
    pick = weighted_pick(names, weights, random.Random(5))
    ref = random.Random(5)
    assert [pick() for _ in range(500)] == [ref.choices(names, weights)[0] for _ in range(500)]


SWA = Config(page_size=2, num_pages=12, num_rows=3, swa_window=2, swa_num_pages=8)


def test_hybrid_view_reads_the_swa_mapping_as_swa_page_of_does():
    b = ImplBackend(SWA)
    ops = [O.SubmitRequest(1, (1, 2, 3, 4, 5, 6, 7), 9), O.Schedule(1)] + [O.Decode(1, 3)] * 5 + \
        [O.SubmitRequest(2, (1, 2, 3, 4, 9), 4), O.Schedule(2), O.Decode(2, 1), O.Finish(1)]
    seen = 0
    for op in ops:
        b.apply(op)
        alloc = b.sched.token_to_kv_pool_allocator
        want = tuple((p, w) for p in range(1, SWA.num_pages + 1) if (w := alloc.swa_page_of(p)) != 0)
        assert b._hybrid_view(snapshot(b.sched))["swa_map"] == want
        seen += bool(want)
    assert seen     # the mapping was not empty throughout


def test_impl_under_inference_mode_behaves_as_without_it():
    """ImplBackend.apply runs under torch.inference_mode (upstream's DynamicGradMode);
    the same walks without it give the same outcomes and states, step by step."""
    plain = ImplBackend.apply.__wrapped__
    for i in range(6):
        seq = walk(2, i, None, "spec", Stats())
        a = ImplBackend(seq.cfg)
        with torch.inference_mode(False):
            b = ImplBackend.__new__(ImplBackend)
            b.cfg, b.sched = seq.cfg, ImplBackend._scheduler(seq.cfg, None)
        assert a.sched.kv_buffer.token_of.is_inference()
        assert not b.sched.kv_buffer.token_of.is_inference()
        for op in seq.ops:
            assert a.apply(op) == plain(b, op)
            assert a.observe() == b.observe()


def test_cpu_seconds_counts_a_reaped_child():
    c0 = bench_scale.cpu_seconds()
    subprocess.run([sys.executable, "-c", "import time\nt = time.process_time()\n"
                    "while time.process_time() - t < 0.3: pass"], check=True)
    assert bench_scale.cpu_seconds() - c0 >= 0.25


def test_summary_force_measures_workers_without_a_free_core(capsys, monkeypatch):
    monkeypatch.setattr(summary, "free_cores", lambda: 0.0)
    runs = {1: bench_scale.ScaleRun(1, 10.0, 9.0, 30, 9000, 3.0),
            2: bench_scale.ScaleRun(2, 8.0, 12.0, 30, 9000, 3.5)}
    monkeypatch.setattr(bench_scale, "measure", lambda rounds, seed, workers: runs[workers])
    assert summary.main(["--quick", "--parts", "scale", "--force"]) == 0
    table = capsys.readouterr().out.split("== summary", 1)[1]
    assert "not measured" not in table
    assert "x1.25 wall, x0.75 steps/CPU-s" in table and "forced" in table


def test_side_by_side_alternates_the_two_trees(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(bench_diff, "export_rev", lambda rev, dest: None)
    monkeypatch.setattr(bench_diff, "walk_rate_in",
                        lambda tree, n, s: calls.append(tree == bench_diff.ROOT) or 100.0 * (1 + calls[-1]))
    res = bench_diff.side_by_side("main", 5, 11, 2, out=lambda *a, **k: None)
    assert calls == [False, True, False, True]
    assert res == {"main": [100.0, 100.0], "this tree": [200.0, 200.0]}
    lines = []
    bench_diff.print_side_by_side(res, out=lines.append)
    assert "main 100, this tree 200 (x2.00" in lines[0]


def test_export_rev_unpacks_the_revision(tmp_path):
    bench_diff.export_rev("HEAD", tmp_path)
    assert (tmp_path / "benchmarks" / "bench_diff.py").is_file()



def test_fuzz_imports_its_engine_before_catching_ctrl_c(monkeypatch, tmp_path):
    """An interrupt inside a lazy import surfaces as RuntimeError, not KeyboardInterrupt:
    the inline chunk's modules are imported before the handler is installed."""
    from contextlib import contextmanager

    from kvcheck import fuzz as F
    from kvcheck.engines import ENGINES
    order = []
    real = F.Interrupts.installed

    @contextmanager
    def installed(self):
        order.append("handler")
        with real(self):
            yield self

    monkeypatch.setattr(F, "preload_engine", lambda e: order.append(f"preload {e}"))
    monkeypatch.setattr(F.Interrupts, "installed", installed)
    F.fuzz(None, 1, "spec", tmp_path, rounds=1, quiet=True)
    assert order == ["preload walk", "handler"]
    assert set(F.ENGINE_MODULES) == set(ENGINES)
