"""The exhaustive differential on a real sglang release (kvcheck/engines/exhaustive.py
over adapters/sglang): a served backend's fork (SglangProxy.fork, run_trace "fork") must
go on exactly as a fresh replay of the same operations does, and leave the backend it was
forked from untouched. Skipped per release when its venv is absent."""
from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RELEASES = [v for v in ("0.5.15", "0.5.23")
            if (ROOT / f".venv-sglang-{v}" / "bin" / "python").exists()]
need_release = pytest.mark.skipif(not RELEASES, reason="no .venv-sglang-* (make sglang-env)")

# corpus traces of each release: page sizes 1, 2 and 4, speculative decoding, chunks, Mamba
TRACES = {
    "0.5.15": ("u4-kv-mismatch", "h4-p4", "mamba-session", "o2-stale-fill-ids",
               "u2-chunked-turn-refills-rewritten-arrays"),
    "0.5.23": ("h3-p4", "o2-stale-fill-chunk-key", "m2-queued-borrowed-abort",
               "u2-detached-turn-moves-checkpoint", "worked_example_5_4"),
}
CASES = [(v, name) for v in RELEASES for name in TRACES[v]]


def _load(version: str, name: str):
    from kvcheck.trace import load
    return load(ROOT / "stateful_tests" / "upstream" / f"{name}-sglang-{version}.json")


def _run(backend, op):
    try:
        out = backend.apply(op)
    except RuntimeError as e:       # upstream raised: compared as the message
        return ("raised", str(e))
    return (out, backend.abstract(), backend.concrete_violations())


@need_release
@pytest.mark.parametrize("version,name", CASES, ids=[f"{v}-{n}" for v, n in CASES])
def test_fork_goes_on_as_a_fresh_replay(version, name):
    from kvcheck.adapters.sglang.proxy import make_backend
    tr = _load(version, name)
    ops = list(tr.ops)
    fresh = make_backend(tr.config, version)
    reference = [_run(fresh, op) for op in ops]
    del fresh
    # one original run, forked before every step: each copy runs the rest of the trace
    # first, then the original takes its next step (so it must be untouched by the copy)
    original = make_backend(tr.config, version)
    for k, op in enumerate(ops):
        if 0 < k < len(ops) - 1:
            copy = original.fork()
            assert copy.abstract() == original.abstract()
            for j in range(k, len(ops)):
                assert _run(copy, ops[j]) == reference[j], f"fork at {k}, step {j}: {ops[j]}"
            del copy
        assert _run(original, op) == reference[k], \
            f"the original after a fork at {k}, step {k}: {op}"


@need_release
def test_forks_gone_are_dropped_by_the_server():
    from kvcheck.adapters.sglang.proxy import make_backend
    version = RELEASES[0]
    tr = _load(version, TRACES[version][0])
    b = make_backend(tr.config, version)
    server = b._server
    forks = [b.fork() for _ in range(3)]
    mine = {b._handle, *(f._handle for f in forks)}
    assert mine <= set(server.call({"cmd": "handles"})["handles"])
    del forks
    gc.collect()
    live = set(server.call({"cmd": "handles"})["handles"])
    assert b._handle in live and not (mine - {b._handle}) & live


def _explore(*args):
    return subprocess.run([sys.executable, "-m", "kvcheck.cli", "explore", "--quiet",
                           "--out", "/tmp/kvcheck-test-sglang-fork", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)


@need_release
@pytest.mark.parametrize("version", RELEASES)
def test_every_transition_agrees_on_the_release(version):
    r = _explore("--preset", f"check-sglang-{version}", "--scope", "sglang-p1",
                 "--max-depth", "5", "--backend", f"sglang:{version}")
    assert r.returncode == 0, r.stdout + r.stderr
    line = next(x for x in r.stdout.splitlines() if "on every transition" in x)
    assert f"spec vs sglang-{version} on every transition" in line and "every step agreed" in line
    n = int(line.split(": ", 1)[1].split(" transitions")[0].replace(",", ""))
    assert n > 100, line


@need_release
def test_a_scope_the_release_refuses_is_a_usage_error():
    version = RELEASES[0]
    other = "0.5.23" if version == "0.5.15" else "0.5.15"
    r = _explore("--preset", f"check-sglang-{other}", "--scope", "sglang-p1", "--max-depth", "2",
                 "--backend", f"sglang:{version}")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "era" in r.stderr and f"sglang:{version} cannot run scope sglang-p1" in r.stderr
