"""A fuzz campaign in chunks: `run_chunk(campaign, start, count)` runs sequences
start, start+1, ... of the campaign's seed stream until `count` are done or one fails.

A chunk is a pure function of its arguments (everything it needs is named in the
picklable `Campaign`; the backend factory is resolved where the chunk runs), so the
same chunk runs inline, in a local worker process or as a Ray task, and sequence i is
the same sequence whichever worker runs it: workers draw disjoint seed streams by
taking disjoint index ranges.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from kvcheck.engines.stats import Stats
from kvcheck.spec.config import Config

HYPOTHESIS_ROUND = 20
"""Sequences per Hypothesis round (one `run_state_machine_as_test` call, one seed)."""


@dataclass(frozen=True)
class Campaign:
    engine: str
    seed: int
    backend: str
    spec_enabled: Optional[bool] = None
    accept: tuple = ()
    """Recorded upstream findings whose behaviour the spec takes (`--accept`)."""

    @property
    def chunk_unit(self) -> int:
        """The smallest chunk the engine runs (Hypothesis seeds a whole round at once)."""
        return HYPOTHESIS_ROUND if self.engine == "hypothesis" else 1


@dataclass
class RawFailure:
    """A failing sequence as generated (before shrinking)."""
    index: int
    cfg: Config
    ops: list
    failure: object             # kvcheck.checker.Failure


@dataclass
class RawStop:
    """A sequence that stopped past the accepted findings' model where the system under
    test, run alone on that step, did not show what the spec stopped at
    (`checker.Beyond.release_differs`): where to look next. `ops` end with the stop's."""
    index: int
    cfg: Config
    ops: list
    beyond: object              # kvcheck.checker.Beyond


@dataclass
class ChunkResult:
    start: int
    end: int                    # the first index not run
    limit: int = 0              # the index the chunk was asked to run up to
    stats: Stats = field(default_factory=Stats)
    failure: Optional[RawFailure] = None
    stops: list = field(default_factory=list)
    """RawStop: the first of each reason in this chunk."""


def _setup(c: Campaign):
    from kvcheck.backends import config_kw, known_findings, resolve
    factory, bname = resolve(c.backend)
    kw = config_kw(c.backend, c.accept, c.spec_enabled)
    return factory, bname, kw, known_findings(c.backend, c.accept)


def run_chunk(c: Campaign, start: int, count: int, planted: tuple = ()) -> ChunkResult:
    """Run up to `count` sequences from index `start`; stop at the first failure.
    `planted`: impl/ faults to switch on in this process (a worker inherits none)."""
    from kvcheck.impl import faults
    with faults.planted(*planted):
        if c.engine == "hypothesis":
            return _hypothesis_chunk(c, start, count)
        return _walk_chunk(c, start, count)


def _walk_chunk(c: Campaign, start: int, count: int) -> ChunkResult:
    from kvcheck.engines.walk import walk
    factory, bname, kw, skip = _setup(c)
    res = ChunkResult(start, start, start + count)
    guided = None
    if c.engine == "guided":
        from kvcheck.engines.guided import guided_for
        guided = guided_for(c, c.seed, c.backend, start)
    for i in range(start, start + count):
        if guided is not None:
            seq = guided.run(i, factory, bname, res.stats, config_kw=kw, skip=skip)
        else:
            seq = walk(c.seed, i, factory, bname, res.stats, config_kw=kw, skip=skip)
        res.end = i + 1
        b = seq.beyond
        if b is not None and b.release_differs and all(x.beyond.kind != b.kind
                                                       for x in res.stops):
            res.stops.append(RawStop(i, seq.cfg, list(seq.ops), b))
        if seq.failure is not None:
            res.failure = RawFailure(i, seq.cfg, seq.ops, seq.failure)
            break
    if guided is not None:
        guided.pause()
    return res


def _hypothesis_chunk(c: Campaign, start: int, count: int) -> ChunkResult:
    """One Hypothesis round per HYPOTHESIS_ROUND indices, seeded by (seed, round);
    generation only: kvcheck shrinks, Hypothesis's shrink phase never runs."""
    from hypothesis import Phase, Verbosity, seed as hseed, settings
    from hypothesis.stateful import run_state_machine_as_test

    from kvcheck.engines import hypothesis_machine as M
    factory, bname, kw, skip = _setup(c)
    machine = M.make_machine(factory, bname, M.configs(**kw) if kw else None, skip=skip)
    base = settings(settings.get_profile("kvcheck-fuzz"), phases=[Phase.generate],
                    verbosity=Verbosity.quiet, print_blob=False)
    res = ChunkResult(start, start, start + count)
    end = start + count
    while res.end < end:
        n = min(HYPOTHESIS_ROUND, end - res.end)
        M.STATS.clear(), M.LAST_FAILURE.clear()
        hseed(c.seed * 1_000_003 + res.end // HYPOTHESIS_ROUND)(machine)
        try:
            run_state_machine_as_test(machine, settings=settings(base, max_examples=n))
        except Exception:
            if not M.LAST_FAILURE:
                raise
            res.failure = RawFailure(res.end, M.LAST_FAILURE["config"],
                                     M.LAST_FAILURE["ops"], M.LAST_FAILURE["failure"])
        finally:
            res.stats.merge(M.STATS)
        res.end += n
        if res.failure is not None:
            break
    return res


# -- executors: where chunks run ----------------------------------------------------------

def _worker_init() -> None:
    """A worker process: one torch thread each, so N workers use N cores (impl/'s
    tensors are tiny: extra threads only contend)."""
    import torch
    torch.set_num_threads(1)


class InlineExecutor:
    """Chunks run in this process, one at a time (a single worker)."""
    workers = 1

    def submit(self, c, start, count, planted):
        return run_chunk(c, start, count, planted)

    def wait(self, pending):
        return pending, []

    def shutdown(self):
        pass


class ProcessExecutor:
    """N local worker processes (`--workers N`)."""

    def __init__(self, workers: int) -> None:
        from kvcheck.procs import WorkerPool
        self.workers = workers
        self.pool = WorkerPool(workers, setup=_worker_init)

    def submit(self, c, start, count, planted):
        return self.pool.submit(run_chunk, c, start, count, planted)

    def wait(self, pending, timeout: float = 0.5):
        done, rest = self.pool.wait(pending, timeout)
        return [f.result() for f in done], rest

    def shutdown(self):
        self.pool.shutdown()


class RayExecutor:
    """The same chunks as Ray tasks (`--ray [ADDRESS]`; local Ray without an address)."""

    def __init__(self, address: Optional[str], workers: int) -> None:
        from kvcheck.procs import start_ray
        ray, self.started = start_ray(address, workers)
        self.ray = ray
        self.workers = max(1, int(ray.cluster_resources().get("CPU", workers)))
        self.remote = ray.remote(num_cpus=1)(run_chunk)
        self.pending: list = []

    def submit(self, c, start, count, planted):
        return self.remote.remote(c, start, count, planted)

    def wait(self, pending, timeout: float = 0.5):
        done, rest = self.ray.wait(list(pending), num_returns=1, timeout=timeout)
        self.pending = list(rest)
        return self.ray.get(done), list(rest)

    def shutdown(self):
        for ref in self.pending:
            self.ray.cancel(ref, force=True)
        if self.started:
            self.ray.shutdown()


def make_executor(workers: int = 1, ray_address: Optional[str] = None, use_ray: bool = False):
    if use_ray:
        return RayExecutor(ray_address, workers)
    return InlineExecutor() if workers <= 1 else ProcessExecutor(workers)
