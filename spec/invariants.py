"""Named invariants, evaluated on an AbstractState (from the spec or from any system).

Ids follow DOMAIN.md section 3 where it has one (I1..I25); I26+ are kvcheck's own.
Each check returns Violations that name the owner, the page and the numbers; none
raises. State invariants take (state, cfg); step invariants take
(before, op, outcome, after) and cover what one state cannot show.
The checks live in spec/invariants_*.py by what they are about; the tables below say
which run, in what order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from kvcheck.spec import (invariants_holders, invariants_hybrid, invariants_pages,
                          invariants_sessions, invariants_step, invariants_tree)
from kvcheck.spec.abstract import AbstractState
from kvcheck.spec.config import Config
from kvcheck.spec.violations import Violation


@dataclass(frozen=True)
class Invariant:
    id: str
    name: str
    check: Callable


def _table(*checks) -> list[Invariant]:
    return [Invariant(fn.inv_id, fn.inv_name, fn) for fn in checks]


STATE_INVARIANTS: list[Invariant] = _table(
    invariants_pages.no_double_free,
    invariants_pages.live_page_not_free,
    invariants_pages.page_exclusivity,
    invariants_pages.accounting_identity,
    invariants_pages.row_exclusivity,
    invariants_sessions.queued_row,
    invariants_holders.committed_le_allocated,
    invariants_holders.committed_eq_allocated,
    invariants_holders.protected_aligned,
    invariants_holders.protected_le_committed,
    invariants_holders.freed_flags,
    invariants_tree.lock_ref_holders,
    invariants_tree.lock_ref_monotone,
    invariants_tree.tree_sizes,
    invariants_sessions.single_inflight,
    invariants_sessions.borrowed_slot_alive,
    invariants_sessions.slot_holds_kv,
    invariants_holders.running_holds_row,
    invariants_tree.kv_content,
    invariants_tree.protected_prefix_is_path,
    invariants_hybrid.swa_pages_conserved,
    invariants_hybrid.swa_mapping_live,
    invariants_hybrid.swa_window_cursor,
    invariants_hybrid.swa_accounting,
    invariants_hybrid.mamba_slots_conserved,
    invariants_hybrid.mamba_accounting,
    invariants_hybrid.mamba_tree_locks,
)
"""Every state invariant, in the order check_state reports them."""
STEP_INVARIANTS: list[Invariant] = _table(
    invariants_step.slot_fixed,
    invariants_step.locked_not_evicted,
    invariants_step.idempotent_restore,
    invariants_step.checkpoint_advance,
)
"""Every step invariant, in the order check_step reports them."""

INVARIANT_IDS = {i.id: i.name for i in STATE_INVARIANTS + STEP_INVARIANTS}


def check_state(s: AbstractState, cfg: Config) -> list[Violation]:
    out: list[Violation] = []
    for inv in STATE_INVARIANTS:
        out.extend(inv.check(s, cfg))
    return out


def check_step(a: AbstractState, op, outcome: str, b: AbstractState, cfg: Config = None) -> list[Violation]:
    """Step invariants; `cfg` lets an era-specific allowance apply (None: the strict
    wrapper-era reading)."""
    out: list[Violation] = []
    for inv in STEP_INVARIANTS:
        out.extend(inv.check(a, op, outcome, b, cfg))
    return out
