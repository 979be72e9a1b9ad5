"""Where a search runs: in this process, on forked workers or on Ray actors
(`explore_on`, what `kvcheck explore --workers N --ray [ADDRESS]` calls)."""
from __future__ import annotations

from typing import Optional

from kvcheck.explore.parallel import ForkPool
from kvcheck.explore.scope import Scope
from kvcheck.explore.search import explore


def explore_on(sc: Scope, workers: int = 1, ray_address: Optional[str] = None, **kw):
    """`explore(sc, **kw)` on `workers` forked processes, or on Ray actors when
    `ray_address` is given ("" for a local Ray); one worker and no Ray: in this process."""
    if ray_address is None and workers <= 1:
        return explore(sc, **kw)
    if ray_address is not None:
        from kvcheck.explore.ray_pool import RayPool      # the optional extra: only here
        pool = RayPool(workers, ray_address)
    else:
        pool = ForkPool(workers)
    try:
        return explore(sc, pool=pool, **kw)
    finally:
        pool.close()

