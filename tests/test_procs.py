"""kvcheck/procs.py: the worker pool that `check --jobs` and `fuzz --workers` share."""
import threading
import time

from kvcheck.procs import WorkerPool


def test_shutdown_leaves_no_worker_and_no_thread_of_the_pool_running():
    """Shutdown with tasks still running (Ctrl-C) stops the workers and the executor's
    manager thread. A manager thread still running when the interpreter exits races
    concurrent.futures' exit hook over its wake-up pipe (`OSError: [Errno 9] Bad file
    descriptor` printed after `kvcheck check: interrupted`, seen once in CI)."""
    pool = WorkerPool(2)
    futures = [pool.submit(time.sleep, 60) for _ in range(3)]
    time.sleep(1.0)                             # both workers inside a task
    procs = list(pool.pool._processes.values())
    manager = pool.pool._executor_manager_thread
    assert manager is not None and manager.is_alive()
    began = time.monotonic()
    pool.shutdown()
    assert time.monotonic() - began < 10        # running tasks are not waited for
    assert [p for p in procs if p.is_alive()] == []
    assert not manager.is_alive()
    assert manager not in threading.enumerate()
    assert all(f.done() for f in futures)
