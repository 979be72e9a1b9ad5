"""What `kvcheck.cli.main` checks after parsing and before any work: the environment
variables kvcheck reads, the folders a command will write, worker counts, flags that
contradict each other and a Ray cluster's address. Each problem is a UsageError: one
line, exit 2, before anything runs."""
from __future__ import annotations

import os
import re
from pathlib import Path

from kvcheck.errors import UsageError

ENV_VARS = {
    "KVCHECK_DEVICE": "where impl/'s tensors live: cpu, cuda or cuda:N (unset: cuda when "
                      "torch sees a GPU, else cpu)",
    "KVCHECK_SGLANG_PYTHON": "the Python of an environment with sglang installed, for "
                             "--backend sglang[:VERSION] when no .venv-sglang-VERSION is built",
    "KVCHECK_SGLANG_PLANT": "planted upstream faults (adapters/sglang/faults.py, comma-"
                            "separated) switched on in a release's process",
    "GITHUB_ACTIONS": "true: `check` also prints each failure as an ::error annotation",
    "HYPOTHESIS_STORAGE_DIRECTORY": "Hypothesis's example database (unset: .hypothesis/ "
                                    "under the project)",
}
"""Every environment variable kvcheck reads (`kvcheck --help` lists them)."""

DEVICE_RE = re.compile(r"^(cpu|cuda(:[0-9]+)?)$")
RAY_ADDRESS_RE = re.compile(r"^(?:ray://)?(?P<host>[A-Za-z0-9_.\-]+|\[[0-9A-Fa-f:]+\]):(?P<port>[0-9]{1,5})$")
RAY_CLUSTER_FILE = Path("/tmp/ray/ray_current_cluster")
"""Where a running local Ray cluster writes its address (what `--ray auto` connects to)."""
RAY_CONNECT_S = 3.0
"""How long `--ray ADDRESS` waits for the cluster's port to answer before it is an error."""


def environment_help(width: int = 90) -> str:
    import textwrap
    return "environment variables:\n" + "\n".join(
        textwrap.fill(text, width, initial_indent=f"  {name:<30s}", subsequent_indent=" " * 32)
        for name, text in ENV_VARS.items())


def check_device(value: str | None) -> None:
    if not value:
        return
    if not DEVICE_RE.match(value):
        raise UsageError(f"KVCHECK_DEVICE={value!r}: must be cpu, cuda or cuda:N")
    if value.startswith("cuda"):
        import torch
        if not torch.cuda.is_available():
            raise UsageError(f"KVCHECK_DEVICE={value}: torch sees no CUDA device here "
                             f"(torch {torch.__version__}); unset it or use cpu")
        index = int(value.split(":")[1]) if ":" in value else 0
        if index >= torch.cuda.device_count():
            raise UsageError(f"KVCHECK_DEVICE={value}: torch sees {torch.cuda.device_count()} "
                             f"CUDA device(s) (0 to {torch.cuda.device_count() - 1})")


def check_sglang_env(env=os.environ) -> None:
    py = env.get("KVCHECK_SGLANG_PYTHON")
    if py and not (Path(py).is_file() and os.access(py, os.X_OK)):
        raise UsageError(f"KVCHECK_SGLANG_PYTHON={py!r}: not an executable file")
    plant = env.get("KVCHECK_SGLANG_PLANT")
    if plant:
        from kvcheck.adapters.sglang.faults import FAULTS, requested
        unknown = [n for n in requested(env) if n not in FAULTS]
        if unknown:
            raise UsageError(f"KVCHECK_SGLANG_PLANT: unknown upstream fault(s) {unknown}; "
                             f"known: {', '.join(sorted(FAULTS))}")


def check_environment(env=os.environ) -> None:
    check_device(env.get("KVCHECK_DEVICE"))
    check_sglang_env(env)


def check_out(args) -> None:
    """`--out` when left at its default (argparse checks only a value typed on the command
    line): a folder kvcheck cannot write is an error now, not a failed part later."""
    import argparse

    from kvcheck.argtypes import writable_dir
    out = getattr(args, "out", None)
    if out is None:
        return
    try:
        writable_dir(str(out))
    except argparse.ArgumentTypeError as e:
        raise UsageError(f"--out {out}: {e} (name a writable folder with --out)") from None


def check_counts(args) -> None:
    from kvcheck.procs import usable_cores
    cores = usable_cores()
    workers = getattr(args, "workers", None)
    if workers and workers > cores and getattr(args, "ray", None) is None:
        raise UsageError(f"--workers {workers}: this machine has {cores} usable core(s); use "
                         f"at most {cores} (or --ray ADDRESS for a cluster)")
    jobs = getattr(args, "jobs", None)
    if jobs and jobs > cores:
        raise UsageError(f"--jobs {jobs}: this machine has {cores} usable core(s); use at "
                         f"most {cores}")


def check_conflicts(args) -> None:
    if getattr(args, "compare", False) and getattr(args, "no_symmetry", False):
        raise UsageError("--compare runs with and without symmetry reduction; --no-symmetry "
                         "contradicts it (use one of them)")
    if args.cmd == "check":
        from kvcheck.check import min_examples
        least = min_examples(args.engine)
        if args.examples < least:
            raise UsageError(f"--examples {args.examples}: the differential part needs at "
                             f"least {least} sequences of the {args.engine} engine to reach "
                             f"every operation (its seed is fixed); use --examples {least} "
                             "or more")


def check_ray(address: str | None) -> None:
    """`--ray [ADDRESS]`: Ray installed; an ADDRESS (host:port, ray://host:port, auto)
    answering within RAY_CONNECT_S seconds."""
    if address is None:
        return
    import importlib.util
    if importlib.util.find_spec("ray") is None:
        raise UsageError("--ray needs the ray extra: pip install 'kvcheck[ray]'")
    if address in ("", "local"):
        return
    if address == "auto":
        if not (os.environ.get("RAY_ADDRESS") or RAY_CLUSTER_FILE.exists()):
            raise UsageError("--ray auto: no running Ray cluster found on this machine "
                             "(start one with `ray start --head`, or name its ADDRESS)")
        return
    m = RAY_ADDRESS_RE.match(address)
    if not m or not 0 < int(m.group("port")) < 65536:
        raise UsageError(f"--ray {address!r}: ADDRESS must be HOST:PORT, ray://HOST:PORT or auto")
    import socket
    host, port = m.group("host").strip("[]"), int(m.group("port"))
    try:
        socket.create_connection((host, port), timeout=RAY_CONNECT_S).close()
    except OSError as e:
        raise UsageError(f"--ray {address}: no Ray cluster answers at {host}:{port} "
                         f"({e.strerror or e or 'timed out'}, waited {RAY_CONNECT_S:g} s)") from None


def preflight(args) -> None:
    """Every check above that applies to the parsed command line `args`."""
    check_environment()
    check_out(args)
    check_counts(args)
    check_conflicts(args)
    check_ray(getattr(args, "ray", None))
