"""`make check-gpu`: impl/ on CUDA beside CPU, in one prepared run
(python -m benchmarks.check_gpu).

For each device (cpu, and cuda when torch sees one; KVCHECK_DEVICE=cpu restricts the
run to cpu, which is how it is tested on a machine without a GPU):
  1. impl/'s own tests (tests/test_impl_*.py) with KVCHECK_DEVICE set to the device;
  2. a count-budgeted differential fuzz run (spec vs impl on the device, walk engine);
  3. the per-operation latency benchmark (benchmarks.bench_impl).
Then one table with the devices side by side. Exit 0 when every part passed on every
device, 1 otherwise.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def devices() -> list:
    import torch
    forced = os.environ.get("KVCHECK_DEVICE")
    if forced:
        return [forced]
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _run(cmd: list, dev: str, timeout: float) -> tuple:
    env = {**os.environ, "KVCHECK_DEVICE": dev, "PYTHONPATH": str(ROOT)}
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr, time.monotonic() - t0


def impl_tests(dev: str) -> dict:
    tests = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_impl_*.py"))
    rc, out, dt = _run([sys.executable, "-m", "pytest", "-o", "addopts=", "-q", "-p", "no:cacheprovider", *tests],
                       dev, 1800)
    m = re.search(r"(\d+) passed", out)
    return {"ok": rc == 0, "tests passed": int(m.group(1)) if m else 0, "tests s": dt}


def fuzz_run(dev: str, rounds: int, seed: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        rc, out, dt = _run([sys.executable, "-m", "kvcheck.cli", "fuzz", "--rounds", str(rounds),
                            "--seed", str(seed), "--out", tmp], dev, 1800)
    m = re.search(r"sequences (\d+), steps (\d+), (\d+) steps/s", out)
    return {"ok": rc == 0, "fuzz sequences": int(m.group(1)) if m else 0,
            "fuzz steps/s": int(m.group(3)) if m else 0, "fuzz s": dt}


def latency(dev: str, repeat: int) -> dict:
    from benchmarks.bench_impl import measure
    from kvcheck.impl.device import resolve_device
    return {f"{name} (median us)": med for name, (med, _) in measure(resolve_device(dev), repeat)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=60, help="fuzz sequences per device (default 60)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=100, help="latency repeats (default 100)")
    args = ap.parse_args(argv)
    devs = devices()
    cols: dict = {}
    ok = True
    for dev in devs:
        print(f"== {dev}: impl/ tests, fuzz ({args.rounds} sequences), per-op latency", flush=True)
        res = {}
        for part in (impl_tests(dev), fuzz_run(dev, args.rounds, args.seed)):
            ok &= part.pop("ok")
            res.update(part)
        res.update(latency(dev, args.repeat))
        cols[dev] = res
    keys = list(next(iter(cols.values())))
    w = max(len(k) for k in keys)
    print(f"\n{'':<{w}}" + "".join(f"{d:>14}" for d in devs))
    for k in keys:
        print(f"{k:<{w}}" + "".join(f"{cols[d][k]:>14.1f}" if isinstance(cols[d][k], float)
                                    else f"{cols[d][k]:>14}" for d in devs))
    if "cuda" not in devs:
        print("(no CUDA device here: cpu only)")
    print("check-gpu: " + ("every part passed" if ok else "a part FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
