"""The reference model's state: ownership, not tensors.

Pages and rows are plain integers. A row is the list of page ids of its row-pages
(position i lies in row-page i // P); a tree node holds its key segment and the pages of
that segment; requests, slots and sessions carry SGLang's field names. `content` records
which token's KV a page position holds, so that a token/KV mismatch is visible.

`State.clone()` is the only copy the model makes: `spec.model.step` clones, then
mutates the clone, so a step is a pure function of (state, op).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from spec.config import Config

ROOT = 0

# Internal lock anchors (req.last_node / slot.last_node):
#   None               no last_node
#   ("node", node_id)  a radix node; node_id == ROOT is the root (lock calls do nothing)
#   ("virtual", sid)   the session slot's _VirtualNode (lock calls are no-ops)


@dataclass
class Node:
    id: int
    key: tuple                  # this node's own key segment (token ids), page-aligned length
    pages: tuple                # len(key) // P page ids
    parent: Optional[int]
    children: dict = field(default_factory=dict)   # first page of the child's key -> child id
    lock_ref: int = 0
    tick: int = 0               # last access (deterministic LRU clock)

    def copy(self) -> "Node":
        return Node(self.id, self.key, self.pages, self.parent, dict(self.children),
                    self.lock_ref, self.tick)


@dataclass
class Req:
    rid: int
    session: Optional[int]      # req.session (attached streaming session id) or None
    streaming: bool
    rejected: bool              # create_req rejection stub
    origin: tuple               # origin_input_ids
    output: list                # output_ids
    max_new_tokens: int
    phase: str = "queued"       # queued | prefill | decode
    row: Optional[int] = None   # req_pool_idx
    committed: int = 0          # kv_committed_len
    allocated: int = 0          # kv_allocated_len
    protected: int = 0          # cache_protected_len
    last_node: Optional[tuple] = None
    locked: bool = False        # holds the persistent lock taken at admission
    prefix_len: int = 0         # len(prefix_indices) at the last match
    prefix_pages: tuple = ()    # prefix_indices of a radix match, as pages
    extend_end: int = 0         # extend_range.end of the last chunk
    to_finish: bool = False     # FINISH_ABORT pending (pre-abort)
    finished_reason: Optional[str] = None   # None | "length" | "abort"
    finished_len: Optional[int] = None
    committed_freed: bool = False           # kv_committed_freed
    overallocated_freed: bool = False       # kv_overallocated_freed
    is_retracted: bool = False
    array_of: Optional[int] = None          # id of the token array origin is (the rid that
                                            # created it); None: a private array
    logprob_start: int = -1                 # logprob_start_len as the scheduler resolved it
                                            # (-1: no cap on the prefix match)
    # hybrid models (spec/hybrid.py; zero/None when config.swa_window / mamba_slots are 0)
    swa_evicted_seqlen: int = 0             # [protected, here) has had its SWA KV freed
    swa_uuid_for_lock: Optional[tuple] = None   # the SWA lock boundary taken with last_node
    decode_batch_idx: int = 0               # decode batches run (SWA eviction from the 2nd)
    mamba_pool_idx: Optional[int] = None    # Mamba state slot (HybridReqToTokenPool)
    mamba_ping_pong_track_buffer: Optional[tuple] = None    # track slots; -1 = lazy, none yet

    @property
    def fill_ids(self) -> tuple:
        return self.origin + tuple(self.output)

    @property
    def seqlen(self) -> int:
        return len(self.origin) + len(self.output)

    def copy(self) -> "Req":
        r = object.__new__(Req)             # no __init__ to re-run: a field-for-field copy
        r.__dict__.update(self.__dict__)
        r.output = list(self.output)
        return r


@dataclass
class Slot:
    """SessionSlot (V1 fields)."""
    row: Optional[int] = None   # req_pool_idx
    committed: int = 0
    allocated: int = 0
    protected: int = 0          # first turn's cache_protected_len
    last_node: Optional[tuple] = None   # first turn's radix node
    publishes: bool = False     # borrow era: publishes_prompt (taken, no turn handed back yet)
    swa_uuid_for_lock: Optional[tuple] = None   # hybrid (spec/hybrid.py)
    swa_evicted_seqlen: int = 0
    mamba_pool_idx: Optional[int] = None
    mamba_ping_pong_track_buffer: Optional[tuple] = None

    def copy(self) -> "Slot":
        return Slot(self.row, self.committed, self.allocated, self.protected, self.last_node,
                    self.publishes, self.swa_uuid_for_lock, self.swa_evicted_seqlen,
                    self.mamba_pool_idx, self.mamba_ping_pong_track_buffer)


@dataclass
class Session:
    sid: int
    inflight_rid: Optional[int] = None  # _inflight, with the identity of the turn (fixed H3)
    checkpoint: tuple = ()              # req_nodes' request: origin + output[:finished_len]
    close_pending: bool = False         # close_on_finish
    last_rid: Optional[int] = None      # req_nodes' request (live only after an accepted U2)
    committed_origin: tuple = ()        # its origin_input_ids[:committed_origin_len]
    last_unfinished: bool = False       # that request has not finished (accepted U2)
    last_array: Optional[int] = None    # its token array: the next turn extends it in place

    def copy(self) -> "Session":
        return Session(self.sid, self.inflight_rid, self.checkpoint, self.close_pending,
                       self.last_rid, self.committed_origin, self.last_unfinished,
                       self.last_array)


@dataclass
class State:
    cfg: Config
    free_pages: list            # sorted multiset of free page ids (a double free shows twice)
    free_rows: list             # free_slots, in order
    rows: dict                  # row -> list of page ids per row-page (None = never written)
    content: dict               # page -> tuple of P token ids (None = unwritten)
    nodes: dict                 # node id -> Node; ROOT always present
    next_node_id: int
    evictable_size: int
    protected_size: int
    reqs: dict                  # rid -> Req (live: queued, prefilling, decoding)
    slots: dict                 # sid -> Slot
    sessions: dict              # sid -> Session (open ones)
    tick: int = 0
    # hybrid models (spec/hybrid.py): the SWA pool, full page -> SWA page, the Mamba pool
    swa_free_pages: list = field(default_factory=list)
    full_to_swa_index_mapping: dict = field(default_factory=dict)
    mamba_free_slots: list = field(default_factory=list)
    forward_iter: int = 0

    def clone(self) -> "State":
        return State(
            cfg=self.cfg,
            free_pages=list(self.free_pages),
            free_rows=list(self.free_rows),
            rows={r: list(v) for r, v in self.rows.items()},
            content=dict(self.content),
            nodes={i: n.copy() for i, n in self.nodes.items()},
            next_node_id=self.next_node_id,
            evictable_size=self.evictable_size,
            protected_size=self.protected_size,
            reqs={i: r.copy() for i, r in self.reqs.items()},
            slots={i: s.copy() for i, s in self.slots.items()},
            sessions={i: s.copy() for i, s in self.sessions.items()},
            tick=self.tick,
            swa_free_pages=list(self.swa_free_pages),
            full_to_swa_index_mapping=dict(self.full_to_swa_index_mapping),
            mamba_free_slots=list(self.mamba_free_slots),
            forward_iter=self.forward_iter,
        )


def initial_state(cfg: Config) -> State:
    """An empty server: every page and row free, a tree holding only the root."""
    P = cfg.page_size
    return State(
        cfg=cfg,
        free_pages=list(range(1, cfg.num_pages + 1)),
        free_rows=list(range(cfg.num_rows)),
        rows={r: [None] * (cfg.max_context_len // P) for r in range(cfg.num_rows)},
        content={},
        nodes={ROOT: Node(ROOT, (), (), None, {}, 1, 0)},
        next_node_id=1,
        evictable_size=0,
        protected_size=0,
        reqs={},
        slots={},
        sessions={},
        swa_free_pages=list(range(1, cfg.swa_pages + 1)) if cfg.swa_window else [],
        mamba_free_slots=list(range(1, cfg.mamba_slots + 1)),
    )
