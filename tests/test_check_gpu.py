"""`make check-gpu` runs here with KVCHECK_DEVICE=cpu: impl/'s tests, a fuzz run and the
latency benchmark, printed per device."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_check_gpu_runs_on_cpu():
    env = {**os.environ, "KVCHECK_DEVICE": "cpu", "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "benchmarks.check_gpu", "--rounds", "4", "--repeat", "5"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = dict(line.rsplit(None, 1) for line in p.stdout.splitlines()
                if line and line[0] != " " and len(line.split()) > 1 and not line.startswith(("==", "(")))
    assert int(rows["tests passed"]) > 20 and int(rows["fuzz sequences"]) == 4
    assert float(rows["scheduler decode step (median us)"]) > 0
    assert "check-gpu: every part passed" in p.stdout
