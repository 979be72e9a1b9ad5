"""The real-sglang conformance adapter (adapters/sglang). Needs .venv-sglang-0.5.15
(adapters/sglang/make_env.sh 0.5.15); skipped when it is absent."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PY515 = ROOT / ".venv-sglang-0.5.15" / "bin" / "python"
need_515 = pytest.mark.skipif(not PY515.exists(), reason="no .venv-sglang-0.5.15 "
                              "(build it with adapters/sglang/make_env.sh 0.5.15)")


def test_wire_roundtrip():
    from kvcheck.adapters.sglang.wire import state_from_json, state_to_json
    from kvcheck.spec.config import Config
    from kvcheck.spec.model import initial_state, step
    from kvcheck.spec import ops as O
    from kvcheck.spec.view import abstract
    s = initial_state(Config(page_size=4))
    for op in (O.OpenSession(1), O.SubmitTurn(1, 1, (1, 2, 3, 4, 5), 2), O.Schedule(1)):
        s, _ = step(s, op)
    a = abstract(s)
    assert state_from_json(json.loads(json.dumps(state_to_json(a)))) == a


def test_unknown_version_refused():
    from kvcheck.adapters.sglang.proxy import SglangUnavailable, resolve_python
    with pytest.raises(SglangUnavailable, match="make_env.sh 9.9.9"):
        resolve_python("9.9.9")


PY523 = ROOT / ".venv-sglang-0.5.23" / "bin" / "python"


@pytest.mark.skipif(not PY523.exists(), reason="no .venv-sglang-0.5.23")
@pytest.mark.parametrize("path", sorted(glob.glob(str(ROOT / "stateful_tests/upstream/*-sglang-0.5.23.json"))),
                         ids=lambda p: Path(p).stem)
def test_upstream_trace_0523(path):
    from kvcheck.adapters.sglang.conformance import check_trace
    ok, line = check_trace(path, "0.5.23")
    assert ok, line


@need_515
@pytest.mark.parametrize("path", sorted(glob.glob(str(ROOT / "stateful_tests/upstream/*-sglang-0.5.15.json"))),
                         ids=lambda p: Path(p).stem)
def test_upstream_trace_0515(path):
    from kvcheck.adapters.sglang.conformance import check_trace
    ok, line = check_trace(path, "0.5.15")
    assert ok, line


@need_515
def test_run_trace_entry_point(tmp_path):
    trace = ROOT / "stateful_tests/upstream/two-turns-p1-sglang-0.5.15.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([str(PY515), "-m", "kvcheck.adapters.sglang.run_trace", str(trace)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)
    assert out["version"] == "0.5.15" and out["api"] == "flat"
    assert out["stub_calls"] == []
    assert all("error" not in s for s in out["steps"])
    assert [s["outcome"] for s in out["steps"]][:3] == ["ok", "ok", "ok"]


@need_515
def test_era_mismatch_refused():
    from kvcheck.adapters.sglang.proxy import SglangProxy, SglangUnavailable
    from kvcheck.spec.config import Config
    with pytest.raises(SglangUnavailable, match="era"):
        SglangProxy(Config(era="borrow"), version="0.5.15")


# -- fidelity -----------------------------------------------------------------------

def _releases():
    return [pytest.param(v, marks=pytest.mark.skipif(not (ROOT / f".venv-sglang-{v}/bin/python").exists(),
                                                     reason=f"no .venv-sglang-{v}"))
            for v in ("0.5.15", "0.5.23")]


@pytest.mark.parametrize("version", _releases())
def test_pre_abort_of_a_fresh_turn_is_upstreams_set_finish_with_abort(version):
    from kvcheck.adapters.sglang.proxy import make_backend
    from kvcheck.spec import ops as O
    from kvcheck.spec.config import Config
    cfg = Config(num_pages=32, era="wrapper" if version == "0.5.15" else "borrow")
    b = make_backend(cfg, version)
    for op in (O.OpenSession(1), O.SubmitTurn(1, 1, (11, 12, 13), 2), O.Schedule(1),
               O.Decode(1, 7), O.SubmitTurn(1, 2, (21, 22), 2), O.PreAbort(2)):
        b.apply(op)
    (r,) = [r for r in b.abstract().reqs if r.rid == 2]
    assert r.fill_ids == (0,) and r.to_finish
    b.close()


@pytest.mark.skipif(not PY523.exists(), reason="no .venv-sglang-0.5.23")
def test_u6_is_accepted_once_recorded():
    import dataclasses
    from kvcheck.adapters.sglang.proxy import make_backend
    from kvcheck.checker import run_ops
    from kvcheck.trace import load
    tr = load(ROOT / "stateful_tests/upstream/u6-queued-stub-sglang-0.5.23.json")
    cfg = dataclasses.replace(tr.config, accept=("U1", "U2", "U6"))
    b = make_backend(cfg, "0.5.23")
    assert run_ops(cfg, tr.ops, b, backend_name=b.name).ok


@need_515
def test_conformance_runs_the_release_past_the_first_failure(capsys):
    from kvcheck.adapters.sglang.conformance import main
    assert main(["--version", "0.5.15", "--past-failure",
                 str(ROOT / "stateful_tests/upstream/h3-sglang-0.5.15.json")]) == 0
    out = capsys.readouterr().out
    assert "past the first failure" in out and "step   9" in out and "I26" in out



@pytest.mark.parametrize("version", ["0.5.15", "0.5.23"])
def test_real_swa_allocator_runs_on_the_cpu(version):
    """The release's own SWATokenToKVPoolAllocator over a real one-head SWAKVPool
    needs no CUDA and no stand-in (adapters/sglang/hybrid.py `swa_probe`, run by the
    served release): 3 full pages each mapped to an SWA page; the window's free_swa
    returns one SWA page and no full one; free returns the rest."""
    from kvcheck.adapters.sglang.proxy import swa_probe, venv_python
    from kvcheck.spec.config import Config
    if not venv_python(version).exists():
        pytest.skip(f"no .venv-sglang-{version}")
    r = swa_probe(Config(page_size=2, num_pages=8, swa_window=3, swa_num_pages=4), version)
    assert all(m > 0 for m in r["mapped"]) and len({m // 2 for m in r["mapped"]}) == 3
    assert r["after_window"] == [16 - 6, 8 - 4] and r["after_free"] == [16, 8]
    assert r["stub_calls"] == []


@need_515
def test_o2_runs_in_lockstep_through_the_stale_fill_to_the_double_insert(capsys):
    """O2: the adapter's shadow KV of an extend is `req.get_fill_ids()` (what
    prepare_for_extend feeds the forward) and the spec models the fill array
    (`kvcheck.spec.token_arrays.refresh_fill`, `_carry_fill`), so turn 14's stale full_untruncated_fill_ids
    shows on its row on both sides (I26 on req 14 at step 25, accepted under U1/U2) and
    the run agrees to there; at finish(14) (cache_finished_req keys by origin + output)
    the spec itself puts the same page under a second node, I2 as on the release, and
    stops comparing (beyond the accepted findings' model)."""
    from kvcheck.adapters.sglang.conformance import main
    from kvcheck.adapters.sglang.proxy import make_backend
    from kvcheck.checker import run_ops
    from kvcheck.trace import load
    path = ROOT / "stateful_tests/upstream/o2-stale-fill-ids-sglang-0.5.15.json"
    tr = load(path)
    b = make_backend(tr.config, "0.5.15")
    r = run_ops(tr.config, tr.ops, b, backend_name=b.name)
    assert r.failure is None and (r.beyond.reason, r.beyond.step) == ("I2", 26)
    assert r.beyond.op.name == "finish"
    assert main(["--version", "0.5.15", "--past-failure", "--verbose", str(path)]) == 0
    out = capsys.readouterr().out
    assert "step  25 schedule(rid=14, admit=True) -> ok: I26: I26 KV content matches the " \
           "tokens it stands for [req 14;" in out
    assert "step  26 finish(rid=14) -> ok: I1, I2, I26" in out and "page owned 2 times" in out


_ADMISSION = """
import json, sys
from kvcheck.spec.config import Config
from kvcheck.spec.ops import op_from_json
from kvcheck.adapters.sglang.probes import admission_probe
t = json.load(open(sys.argv[1]))
print(json.dumps(admission_probe(Config.from_json(t["config"]),
                                 [op_from_json(o) for o in t["ops"]])))
"""


@pytest.mark.skipif(not PY523.exists(), reason="no .venv-sglang-0.5.23")
def test_upstream_admission_refuses_a_turn_whose_decode_headroom_does_not_fit():
    """The spec's admission and the release's own PrefillAdder part where upstream
    reserves max_new_tokens and a page (README.md, "What the spec decides otherwise"):
    a 2-token turn with max_new_tokens=2 on a 4-token pool."""
    trace = ROOT / "stateful_tests/upstream/u4-shared-origin-sglang-0.5.23.json"
    p = subprocess.run([str(PY523), "-c", _ADMISSION, str(trace)], capture_output=True,
                       text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    diffs = json.loads(p.stdout.strip().splitlines()[-1])
    assert [(d[0], d[2], d[3]) for d in diffs][:1] == [(2, [3], [])]


@pytest.mark.parametrize("version", _releases())
def test_u10_the_release_admits_past_its_memory_and_raises_where_the_spec_stops(version):
    """U10 on the release (docs/upstream-findings.md): upstream's own PrefillAdder, built
    over a running batch that still holds a request a speculative step took past its
    max_new_tokens, admits a prefill the free KV cannot hold, and its own allocation
    raises; 0.5.23 filters the finished request out before the round and refuses it."""
    from kvcheck.adapters.sglang.proxy import make_backend
    from kvcheck.trace import load
    tr = load(ROOT / f"stateful_tests/upstream/u10-overshoot-reserve-prefill-oom-sglang-{version}.json")
    b = make_backend(tr.config, version)
    try:
        for op in tr.ops[:-1]:
            b.apply(op)
        if version == "0.5.15":
            with pytest.raises(RuntimeError, match="Out of memory"):
                b.apply(tr.ops[-1])
        else:
            assert b.apply(tr.ops[-1]) == "rejected"
    finally:
        b.close()
