"""kvcheck/compiled.py: the Cython build of the explorer's modules (from the same .py
sources) explores exactly the states the interpreted modules explore; a stale build is
refused. The comparison runs when `make cython` has built the current sources."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from kvcheck import compiled

ROOT = compiled.ROOT

STATE_SET = """
import gc, hashlib, json, sys
from dataclasses import replace
if sys.argv[1] == "compiled":
    from kvcheck.compiled import activate
    activate()
from kvcheck import explore as E
from kvcheck.compiled import is_compiled
from kvcheck.explore import symmetry
symmetry.SIGNATURE_ORDER = repr
gc.collect()
gc.disable()
r = E.explore(E.PRESETS["tiny"][0], fingerprints=False)
keys = sorted(repr(k) for k in r.visited[0])
r0 = E.explore(E.PRESETS["tiny"][0], fingerprints=False, frontier_states=0)    # levels rebuilt
rebuilt = sorted(repr(k) for k in r0.visited[0]) == keys and list(r0.visited[1]) == list(r.visited[1])
for name in ("hybrid", "mamba-tree"):       # the hybrid part of the key too
    for sc in E.PRESETS[name]:
        for s in E.reachable_states(replace(sc, max_depth=3)):
            E.state_key(s), E.state_key(s, False)
print(json.dumps({"compiled": is_compiled(E.search), "states": r.states, "transitions": r.transitions,
                  "keys": hashlib.sha256("\\n".join(keys).encode()).hexdigest(), "n": len(keys),
                  "rebuilt_same": rebuilt, "cycles": gc.collect()}))
"""


def _state_set(mode: str) -> dict:
    """The explored state set of the tiny preset, keys ordered the same in every process."""
    p = subprocess.run([sys.executable, "-c", STATE_SET, mode], cwd=ROOT, capture_output=True,
                       text=True, timeout=600, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_compiled_and_interpreted_explore_identical_state_sets():
    try:
        compiled.check_build()
    except compiled.NotBuilt as e:
        pytest.skip(str(e))
    c, i = _state_set("compiled"), _state_set("interpreted")
    assert c.pop("compiled") is True and i.pop("compiled") is False
    # no reference cycle left behind (the collector is paused during a search: a cycle
    # per state key held every key's snapshots, 36 KB per state on the nightly preset)
    assert (c.pop("cycles"), i.pop("cycles")) == (0, 0)
    assert c == i and c["n"] == c["states"] and c["rebuilt_same"]


def test_a_stale_build_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(compiled, "MANIFEST", tmp_path / "manifest.json")
    hashes = compiled.source_hashes()
    hashes["kvcheck/spec/model.py"] = hashlib.sha256(b"an older model").hexdigest()
    (tmp_path / "manifest.json").write_text(json.dumps(hashes))
    with pytest.raises(compiled.NotBuilt, match="stale.*kvcheck/spec/model.py"):
        compiled.check_build()
    monkeypatch.setattr(compiled, "MANIFEST", tmp_path / "absent.json")
    with pytest.raises(compiled.NotBuilt, match="no compiled build"):
        compiled.check_build()
