"""Hypothesis settings profiles (registered on import of the Hypothesis engine).

`CI=true` makes Hypothesis load its derandomised, database-less `ci` profile; the
checks here register their own profiles so a run's budget and seed are explicit:
- `kvcheck-check`: what `make check` / `make test` run: fixed budget, derandomised.
- `kvcheck-fuzz`: not derandomised; the fuzz driver records and prints its seed.
"""
from hypothesis import HealthCheck, Phase, settings

COMMON = dict(deadline=None, suppress_health_check=list(HealthCheck),
              stateful_step_count=100, database=None)

settings.register_profile("kvcheck-check", max_examples=150, derandomize=True, **COMMON)
settings.register_profile("kvcheck-fuzz", max_examples=10**9, derandomize=False, **COMMON)

# The spec-only machine under CrossHair's symbolic backend (hypothesis-crosshair): each
# draw is a symbolic value that CrossHair's SMT solver steers through the spec's
# branches. Slow per example, so a small budget.
settings.register_profile("kvcheck-crosshair", backend="crosshair", max_examples=5,
                          stateful_step_count=10, derandomize=False, deadline=None,
                          suppress_health_check=list(HealthCheck), database=None)
