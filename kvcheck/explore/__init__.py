"""Exhaustive bounded exploration of the spec (`kvcheck explore`; its command line is
kvcheck/explore_cmd.py, its report kvcheck/explore_report.py): an explicit-state model
checker in the style of TLC / Stateright that runs on the Python spec itself.

    kvcheck explore [--preset NAME] [--page-size P --pages N --rows R --sessions S ...]

- Breadth-first from `kvcheck.spec.model.initial_state`, so the first counterexample found is a
  shortest one. It is written as a trace file (kvcheck/trace.py format, expect = the
  violation id and step, backend "spec") that `kvcheck replay` runs on the spec and impl.
- The operations tried in a state are drawn from bounded argument domains (the scope:
  which sids and rids, prompt shapes, tokens, evict sizes) and filtered by the spec's own
  guard `kvcheck.spec.model.enabled`; their effect is `kvcheck.spec.model.step`. Nothing here re-states
  the model.
- Every state passes `check_state` (evaluated once per equivalence class: the invariants
  do not depend on ids) and every transition `check_step`, exactly as `run_ops` does, so
  a counterexample replays to the same invariant at the same step.
- Symmetry reduction: page ids, row ids, session ids and request ids are interchangeable;
  `state_key` renames them canonically before hashing. The key is complete for the
  spec's future (see `state_key` for what it omits and why that is dead data).
- Reachability ("sometimes") goals: every operation and outcome, and the situations in
  `SITUATIONS`, detected from (before, op, outcome, after) states; the report says at
  which depth each was first reached, or that the scope missed it.
"""
from __future__ import annotations

from kvcheck.explore.candidates import candidate_ops
from kvcheck.explore.goals import HYBRID_SITUATIONS, SITUATIONS, Situation
from kvcheck.explore.presets import (HYBRID_BORROW_SCOPE, HYBRID_SCOPE, MAMBA_TREE_SCOPE, P1_SCOPE,
                                     PRESETS, SCOPES, TWO_SESSIONS_SCOPE, preset_scope)
from kvcheck.explore.scope import Scope, words
from kvcheck.explore.expand import (PREFILTERED_STEP_INVARIANTS, SPEC_ASSERTION, SPEC_EXCEPTION,
                                    step_check_needed)
from kvcheck.explore.frontier import FRONTIER_STATES
from kvcheck.explore.result import Found, Result, missed, to_trace
from kvcheck.explore.search import explore, reachable_states
from kvcheck.explore.symmetry import req_sig, state_key

__all__ = ["FRONTIER_STATES", "Found", "HYBRID_BORROW_SCOPE",
           "HYBRID_SCOPE", "HYBRID_SITUATIONS", "MAMBA_TREE_SCOPE", "P1_SCOPE",
           "PREFILTERED_STEP_INVARIANTS", "PRESETS", "Result", "SCOPES", "SITUATIONS", "SPEC_ASSERTION",
           "SPEC_EXCEPTION", "Scope", "Situation", "TWO_SESSIONS_SCOPE", "candidate_ops",
           "explore", "missed", "preset_scope", "reachable_states", "req_sig", "state_key",
           "step_check_needed", "to_trace", "words"]
