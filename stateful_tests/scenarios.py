"""DOMAIN.md's worked examples as operation sequences.

`kvcheck check` replays each on the spec and on the system under test; the tests in
tests/test_spec_scenarios.py walk them on the spec and assert DOMAIN.md's exact numbers.
"""
from __future__ import annotations

from dataclasses import dataclass

from kvcheck.spec import ops as O
from kvcheck.spec.config import Config


@dataclass(frozen=True)
class Scenario:
    name: str
    doc: str
    config: Config
    ops: tuple


def _prompt(n: int, base: int = 10) -> tuple:
    return tuple(base + i for i in range(n))


WORKED_EXAMPLE = Scenario(
    "worked_example_5_4",
    "DOMAIN.md 5.4: P=4, turn 1 prompt 10 + 5 outputs (overlap: committed 15), turn 2 +3 "
    "tokens, spec overshoot to allocated 24 trimmed at target 20, close.",
    Config(page_size=4, num_pages=12, num_rows=2, max_context_len=64, spec_enabled=True,
           overlap=True, max_drafts=3),
    (O.OpenSession(1),
     O.SubmitTurn(1, 1, _prompt(10), 5),
     O.Schedule(1),                               # committed 10, protected 8, output 1
     O.SpecDecode(1, drafts=1, accepted=1),       # allocated 14, committed 12, output 3
     O.SpecDecode(1, drafts=1, accepted=1),       # output 5 = max: finishes in this step;
                                                  # lookahead 15; slot {15, 15, protected 8}
     O.SubmitTurn(1, 2, (7, 7, 7), 2),            # input 18, prefix min(15, 17) = 15
     O.Schedule(2),                               # committed = allocated = 18
     O.SpecDecode(2, drafts=2, accepted=2),       # allocated 24, committed 21, output 4 > 2:
                                                  # finishes; target 20 frees page F (20..23)
     O.CloseSession(1)),                          # dec node8, free row[8:20] = C, D, E
)

TRIM_OVERSHOOT = Scenario(
    "trim_overshoot_2_8",
    "DOMAIN.md 2.8 (test_trim_overshoot_postcondition): P=1, origin 26, finished_len 12, "
    "committed 40, allocated 44, output 14: frees 38..43, everything becomes 38.",
    Config(page_size=1, num_pages=60, num_rows=2, max_context_len=64, spec_enabled=True,
           overlap=True, max_drafts=3),
    (O.OpenSession(1),
     O.SubmitTurn(1, 1, _prompt(26), 12),
     O.Schedule(1),                               # committed 26, output 1
     O.SpecDecode(1, 3, 3),                       # allocated 34, committed 30, output 5
     O.SpecDecode(1, 3, 3),                       # allocated 38, committed 34, output 9
     O.SpecDecode(1, 1, 1),                       # committed 36, output 11
     O.SpecDecode(1, 3, 2)),                      # allocated 44, committed 39, output 14 > 12:
                                                  # finishes; lookahead 40; target 38
)

FIRST_MID_ABORT = Scenario(
    "first_mid_abort_2_10",
    "DOMAIN.md 2.10 (test_first_mid_abort_nukes_ephemeral_slot): P=1, the first turn "
    "aborted mid-prefill with allocated 20, protected 0: frees exactly 0..19, the row "
    "returns, no slot is left.",
    Config(page_size=1, num_pages=40, num_rows=2, max_context_len=64, chunk_size=20),
    (O.OpenSession(1),
     O.SubmitTurn(1, 1, _prompt(30), 4),
     O.Schedule(1),                               # chunk [0, 20): allocated 20
     O.AbortRunning(1)),
)

NTH_MID_ABORT = Scenario(
    "nth_mid_abort_2_10",
    "DOMAIN.md 2.10 (test_nth_mid_abort_nukes_session_slot): the request borrowed the "
    "slot and allocated past its snapshot; one release frees [protected, max(slot, req)).",
    Config(page_size=1, num_pages=60, num_rows=2, max_context_len=64, spec_enabled=True,
           overlap=False, max_drafts=3),
    (O.OpenSession(1),
     O.SubmitTurn(1, 1, _prompt(8), 3),
     O.Schedule(1),                               # protected 8 (P=1: the prompt is cached)
     O.SpecDecode(1, 1, 1),                       # output 3 = max: finishes
     O.SubmitTurn(1, 2, (7, 7), 8),
     O.Schedule(2),
     O.SpecDecode(2, 3, 1),                       # allocated > committed
     O.AbortRunning(2)),
)

PRE_ABORT = Scenario(
    "pre_abort_detach_2_9",
    "DOMAIN.md 2.9 (test_preabort_detaches_session_and_preserves_slot): a pre-aborted "
    "turn is detached, takes a fresh row, and leaves the slot untouched.",
    Config(page_size=4, num_pages=16, num_rows=3, max_context_len=64),
    (O.OpenSession(1),
     O.SubmitTurn(1, 1, _prompt(9), 3),
     O.Schedule(1),
     O.Decode(1, 3),
     O.Finish(1),
     O.SubmitTurn(1, 2, (7, 7, 7), 3),
     O.PreAbort(2),
     O.Schedule(2)),                              # detach, radix match, stub finishes aborted
)

RETRACT_OVERLAP = Scenario(
    "retract_retry_overlap_2_11",
    "DOMAIN.md 2.11: retract under overlap parks committed == seqlen in the slot; the "
    "retry matches min(committed, seqlen - 1) and _free_tail frees the page that starts "
    "at seqlen - 1 (a page boundary when (seqlen - 1) % P == 0).",
    Config(page_size=4, num_pages=16, num_rows=2, max_context_len=64, overlap=True),
    (O.OpenSession(1),
     O.SubmitTurn(1, 1, _prompt(9), 8),
     O.Schedule(1),                               # committed 9, output 1 (seqlen 10)
     O.Decode(1, 3), O.Decode(1, 3), O.Decode(1, 3),   # seqlen 13, committed 12
     O.Retract(1),                                # lookahead: committed 13 = seqlen
     O.Schedule(1)),                              # prefix 12: frees row-page 3 (pos 12)
)

CLOSE_DEFERRED = Scenario(
    "close_deferred_2_12",
    "DOMAIN.md 2.12: close while turn 2 runs is deferred; the session is released when the "
    "turn finishes; the first-turn prompt stays in the tree, unlocked.",
    Config(page_size=2, num_pages=16, num_rows=2, max_context_len=64),
    (O.OpenSession(1),
     O.SubmitTurn(1, 1, _prompt(7), 2),
     O.Schedule(1),
     O.Decode(1, 3),                              # output 2 = max: finishes
     O.SubmitTurn(1, 2, (7, 7), 2),
     O.Schedule(2),
     O.CloseSession(1),                           # deferred
     O.Decode(2, 3)),                             # finishes; close carried out
)

SHARED_PREFIX = Scenario(
    "shared_prefix_split_under_lock",
    "Two sessions and a plain request share a prompt prefix: radix matches, a node split "
    "under a lock (the new parent copies lock_ref), eviction of unlocked leaves only.",
    Config(page_size=2, num_pages=14, num_rows=3, max_context_len=64),
    (O.OpenSession(1), O.OpenSession(2),
     O.SubmitTurn(1, 1, (1, 2, 3, 4, 5, 6, 7, 8, 9), 2),
     O.Schedule(1),                               # caches [1..8] locked by req 1
     O.SubmitTurn(2, 2, (1, 2, 3, 4, 9, 9, 9), 2),
     O.Schedule(2),                               # matches [1..4]: splits the locked node
     O.Finish(1), O.Finish(2),
     O.SubmitRequest(3, (1, 2, 5, 5, 5), 2),
     O.Schedule(3), O.Finish(3),
     O.Evict(16),                                 # only unlocked leaves go
     O.CloseSession(1), O.CloseSession(2), O.Evict(64)),
)

FINISH_AT_PREFILL = Scenario(
    "first_turn_finishes_at_prefill_4_3",
    "DOMAIN.md 4.3: a first turn whose first token reaches max_new_tokens finishes in the "
    "prefill result, before cache_unfinished_req: the slot keeps the admission lock on the "
    "matched node and cache_protected_len is the match length; the rest of the prompt is "
    "slot-owned. A second session's first turn matches the root (protected 0).",
    Config(page_size=2, num_pages=16, num_rows=3, max_context_len=64),
    (O.SubmitRequest(1, (1, 2, 3, 4, 5, 6, 7), 2),
     O.Schedule(1), O.Finish(1),                 # caches [1..6]
     O.OpenSession(1),
     O.SubmitTurn(1, 2, (1, 2, 3, 4, 9, 9, 9), 1),
     O.Schedule(2),                               # matches [1..4] (split), finishes at once
     O.OpenSession(2),
     O.SubmitTurn(2, 3, (8, 8, 8), 1),
     O.Schedule(3),                               # root match: protected 0
     O.SubmitTurn(1, 4, (5, 5), 2),
     O.Schedule(4), O.Finish(4),
     O.CloseSession(1), O.CloseSession(2)),
)

SCENARIOS = (WORKED_EXAMPLE, TRIM_OVERSHOOT, FIRST_MID_ABORT, NTH_MID_ABORT, PRE_ABORT,
             RETRACT_OVERLAP, CLOSE_DEFERRED, SHARED_PREFIX, FINISH_AT_PREFILL)
