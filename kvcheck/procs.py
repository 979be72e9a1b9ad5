"""Local worker processes shared by the commands that fan work out (`kvcheck fuzz
--workers N`, `kvcheck check --jobs N`), and the start of Ray for `--ray`.

Workers are spawned (never forked: the driver may hold torch's threads) and ignore SIGINT:
on Ctrl-C the driver, which gets it too, stops them all (`shutdown` terminates a running
task instead of waiting for it) and reports what had finished."""
from __future__ import annotations

import os
import signal
from typing import Callable, Optional


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:                      # not Linux
        return max(1, os.cpu_count() or 1)


def _init(setup: Optional[Callable]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if setup is not None:
        setup()


class WorkerPool:
    """N spawned worker processes; `setup` runs once in each after SIGINT is ignored."""

    def __init__(self, workers: int, setup: Optional[Callable] = None) -> None:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor
        self.workers = workers
        self.pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"),
                                        initializer=_init, initargs=(setup,))

    def submit(self, fn, *args):
        return self.pool.submit(fn, *args)

    def wait(self, pending, timeout: float = 0.5):
        """(futures done, futures still pending) after at most `timeout` seconds."""
        from concurrent.futures import FIRST_COMPLETED, wait
        done, rest = wait(pending, timeout=timeout, return_when=FIRST_COMPLETED)
        return list(done), list(rest)

    def shutdown(self) -> None:
        """Stop every worker now, and the executor's manager thread with them. That thread
        closes its wake-up pipe once it sees the workers gone; left running, it races the
        interpreter's exit hook (`concurrent.futures.process._python_exit`), which writes
        to that pipe unlocked: `OSError: [Errno 9] Bad file descriptor` after the command's
        last line."""
        procs = list((getattr(self.pool, "_processes", None) or {}).values())
        manager = getattr(self.pool, "_executor_manager_thread", None)
        self.pool.shutdown(wait=False, cancel_futures=True)
        for p in procs:             # a running task is not waited for
            p.terminate()
        for p in procs:
            p.join(5)
        if manager is not None:
            manager.join(5)


def check_worker(compiled: bool = False) -> None:
    """A `kvcheck check` worker: one thread for torch (imported later, by the parts that
    need it), so that N workers use N cores; `compiled`: the Cython build of the
    explorer's modules (kvcheck/compiled.py, the same sources, found fresh by the driver)
    in front of the sources. It lives here, in a module that imports nothing of the spec,
    so that nothing of the spec is imported before the build is put in front; if something
    was, the worker says so and runs interpreted."""
    import sys
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if compiled:
        from kvcheck.compiled import activate
        try:
            activate()
        except RuntimeError as e:
            print(f"kvcheck check: worker {os.getpid()} runs interpreted: {e}",
                  file=sys.stderr, flush=True)


def start_ray(address, cpus: int):
    """(the ray module, whether this call started it): Ray imported (the optional extra:
    a usage error without it) and initialised, on the cluster at `address` or, without one,
    a local Ray of `cpus` CPUs; a Ray already initialised is used as it is."""
    try:
        import ray
    except ImportError:
        from kvcheck.errors import UsageError
        raise UsageError("--ray needs the ray extra: pip install 'kvcheck[ray]'") from None
    started = not ray.is_initialized()
    if started:
        kw = {"address": address} if address else {"num_cpus": max(cpus, 1)}
        ray.init(include_dashboard=False, log_to_driver=False, **kw)
    return ray, started
