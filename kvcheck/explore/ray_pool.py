"""The parallel search's workers as Ray actors (`kvcheck explore --ray [ADDRESS]`): one
`LevelWorker` per actor, on a local Ray started for the search (no ADDRESS) or on a
running cluster. Ray is an optional extra, imported only here.

Ray's workers are not forks of the coordinator, so the fingerprints are computed the
same way in every process (`stable_fingerprint`, with the symmetry reduction's
signatures ordered by repr): the Result is a single process's, state for state, as far as
the representative a state key picks does not depend on that order (the tests check it
on their scopes)."""
from __future__ import annotations

from typing import Optional

from kvcheck.explore.parallel import LevelWorker, ParallelLevels, stable_fingerprint
from kvcheck.procs import start_ray


class RayPool:
    """N Ray actors for one search; a local Ray of N CPUs unless `address` names a
    cluster (then N defaults to its CPUs)."""
    fingerprint = staticmethod(stable_fingerprint)

    def __init__(self, workers: int, address: Optional[str]) -> None:
        ray, self.started = start_ray(address, workers)
        self.ray = ray
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.workers = workers if workers >= 1 else max(1, cpus)
        self.actors: list = []
        self.pending: dict = {}

    def levels(self, sc, symmetric, check, all_violations, fingerprints, frontier_states):
        actor = self.ray.remote(num_cpus=1)(LevelWorker)
        self.actors = [actor.remote(sc, symmetric, check, all_violations, fingerprints,
                                    frontier_states, True) for _ in range(self.workers)]
        return ParallelLevels(self, sc, fingerprints)

    def call(self, w: int, method: str, *args) -> None:
        self.pending[getattr(self.actors[w], method).remote(*args)] = w

    def tell(self, w: int, method: str, *args) -> None:
        getattr(self.actors[w], method).remote(*args)   # runs after the actor's earlier calls

    def results(self, timeout: float) -> dict:
        if not self.pending:
            return {}
        ready, _ = self.ray.wait(list(self.pending), num_returns=1, timeout=timeout)
        return {self.pending.pop(ref): self.ray.get(ref) for ref in ready}

    def close(self) -> None:
        for a in self.actors:
            self.ray.kill(a)
        self.actors, self.pending = [], {}
        if self.started:
            self.ray.shutdown()
