"""The reference model's state: ownership, not tensors.

Pages and rows are plain integers. A row is the list of page ids of its row-pages
(position i lies in row-page i // P); a tree node holds its key segment and the pages of
that segment; requests, slots and sessions carry SGLang's field names. `content` records
which token's KV a page position holds, so that a token/KV mismatch is visible.

`State.clone()` is the only copy the model makes: `kvcheck.spec.model.step` clones, then
mutates the clone, so a step is a pure function of (state, op).

Copy on write: the entity maps (`nodes`, `reqs`, `slots`, `sessions`, `rows`) are
`CowMap`s. `clone()` shares their entities with the source; an entity is copied the
first time the clone hands it out (`m[k]`, `m.get(k)`, `m.values()`, `m.items()`,
`m.pop(k)`), so a step copies only what it touches, and the model's code reads and
mutates entities exactly as it would plain dicts. The contract that makes the sharing
safe: a state is never mutated after it has been cloned (the model mutates only the
clone `step` made). Readers that never mutate (the views, the explorer's state key)
read without copying through `dict.get(m, k)` / `dict.values(m)`; tests/test_explore.py
checks on every state of a preset that no step changes its argument.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from kvcheck.spec.config import Config

ROOT = 0
_ABSENT = object()


class CowMap(dict):
    """A dict of mutable entities shared copy-on-write with the map it was forked from:
    `_own` holds the keys whose entity this map has copied (or was given) and may
    mutate; any other entity is shared and is copied by `_copy` when first handed out.
    Iterating over keys, `in` and `len` copy nothing. The Cython build (`make cython`)
    makes it an extension type through spec/state.pxd (C-level `m[k]`).

    `_memo`: a reader's cache of something computed from the whole map (the explorer's
    key fragment of the tree). A fork inherits it, since the two maps are equal until
    one hands out an entity; handing one out (for mutation), storing or deleting drops it.
    So it is valid as long as entities are mutated only through the map's accessors
    after the memo was taken, which the clone contract gives."""

    __slots__ = ("_own", "_copy", "_memo")     # no instance __dict__: a fork is half as dear

    def __init__(self, items=(), copy=None):
        dict.__init__(self, items)
        self._own = set(dict.keys(self))
        self._copy = copy
        self._memo = None

    def fork(self) -> "CowMap":
        """A map sharing every entity with this one; the new map owns none of them."""
        m = CowMap.__new__(CowMap)
        dict.update(m, self)
        m._own = set()
        m._copy = self._copy
        m._memo = self._memo
        return m

    def _take(self, k, v):
        self._memo = None
        if k in self._own:
            return v
        v = self._copy(v)
        dict.__setitem__(self, k, v)
        self._own.add(k)
        return v

    def __getitem__(self, k):
        return self._take(k, dict.__getitem__(self, k))

    def get(self, k, default=None):
        v = dict.get(self, k, _ABSENT)
        return default if v is _ABSENT else self._take(k, v)

    def __setitem__(self, k, v):
        self._memo = None
        dict.__setitem__(self, k, v)
        self._own.add(k)

    def __delitem__(self, k):
        self._memo = None
        dict.__delitem__(self, k)
        self._own.discard(k)

    def pop(self, k, default=_ABSENT):
        if k not in self:
            if default is _ABSENT:
                raise KeyError(k)
            return default
        v = self[k]
        self._memo = None
        dict.__delitem__(self, k)
        self._own.discard(k)
        return v

    def _take_all(self):
        self._memo = None
        if len(self._own) != len(self):
            for k, v in list(dict.items(self)):
                self._take(k, v)

    def values(self):
        self._take_all()
        return dict.values(self)

    def items(self):
        self._take_all()
        return dict.items(self)

    def copy(self):
        raise TypeError("CowMap.copy: use fork() (sharing) or State.clone()")

    def __reduce__(self):
        return (_cowmap, (dict(dict.items(self)), self._copy))


def _cowmap(items, copy):
    m = CowMap((), copy)
    for k, v in items.items():
        m[k] = copy(v)
    return m


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
    path: tuple = ()            # the full key from the root: fixed for the node's life (a
                                # split gives the new upper half its own; the lower keeps it)
    # 0.5.23's MAMBA tree component (config.mamba_tree; spec/mamba_tree.py)
    mamba_value: Optional[int] = None   # component_data[MAMBA].value: one Mamba slot, or
                                        # None (a Mamba tombstone: KV kept, ends no match)
    mamba_lock_ref: int = 0     # component_data[MAMBA].lock_ref: the node's own state only
    mamba_tick: int = 0         # position in the Mamba LRU list (larger: more recent)
    swa_tick: int = 0           # 0.5.23's SWA component LRU position (larger: more recent;
                                # equal: the deeper node is the more recent)

    def copy(self) -> "Node":
        n = object.__new__(Node)
        d = n.__dict__
        d.update(self.__dict__)
        d["children"] = dict(self.children)
        return n


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
    fill: tuple = ()                        # full_untruncated_fill_ids (() : the fresh,
                                            # empty array; refresh_fill_ids builds it)
    fill_of: Optional[int] = None           # id of that array (None: private, unshared);
                                            # a turn create_req carried it onto shares it
    req_nodes: bool = False                 # finish_req made it its session's req_nodes'
                                            # request (rids are reused: the rid alone
                                            # does not say it is that request)
    logprob_start: int = -1                 # logprob_start_len as the scheduler resolved it
                                            # (-1: no cap on the prefix match)
    # hybrid models (spec/swa_pool.py, spec/mamba_pool.py; zero/None when
    # config.swa_window / mamba_slots are 0)
    swa_evicted_seqlen: int = 0             # [protected, here) has had its SWA KV freed
    swa_evict_floor: int = 0                # [0, here) never window-evicted (prefill_aware_swa)
    swa_uuid_for_lock: Optional[tuple] = None   # the SWA lock boundary taken with last_node
    swa_branching_seqlen: Optional[int] = None  # borrow era: the match's full hit past its SWA boundary
    decode_batch_idx: int = 0               # decode batches run (SWA eviction from the 2nd)
    mamba_pool_idx: Optional[int] = None    # Mamba state slot (HybridReqToTokenPool)
    mamba_ping_pong_track_buffer: Optional[tuple] = None    # track slots; -1 = lazy, none yet
    # priority scheduling (config.enable_priority_scheduling; 0 without it)
    priority: int = 0                       # req.priority
    entered: int = 0                        # wait_queue_entry_time, as a rank among live
                                            # requests (1: the earliest to enter the queue)

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
    swa_uuid_for_lock: Optional[tuple] = None   # hybrid (spec/swa_tree.py)
    swa_evicted_seqlen: int = 0
    swa_evict_floor: int = 0
    mamba_pool_idx: Optional[int] = None
    mamba_ping_pong_track_buffer: Optional[tuple] = None

    def copy(self) -> "Slot":
        t = object.__new__(Slot)           # every field is immutable: a shallow copy
        t.__dict__.update(self.__dict__)
        return t


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
    last_fill: Optional[int] = None     # its full_untruncated_fill_ids (carry_fill's array)
    fill: tuple = ()                    # that array's tokens now
    committed_fill_len: int = 0         # len of it at that request's finish_req

    def copy(self) -> "Session":
        x = object.__new__(Session)        # every field is immutable: a shallow copy
        x.__dict__.update(self.__dict__)
        return x


@dataclass
class State:
    cfg: Config
    free_pages: list            # sorted multiset of free page ids (a double free shows twice)
    free_rows: list             # free_slots, in order
    rows: CowMap                  # row -> list of page ids per row-page (None = never written)
    content: dict               # page -> tuple of P token ids (None = unwritten)
    nodes: CowMap                 # node id -> Node; ROOT always present
    next_node_id: int
    evictable_size: int
    protected_size: int
    reqs: CowMap                  # rid -> Req (live: queued, prefilling, decoding)
    slots: CowMap                 # sid -> Slot
    sessions: CowMap              # sid -> Session (open ones)
    tick: int = 0
    # hybrid models: the SWA pool, full page -> SWA page (spec/swa_pool.py), the Mamba pool
    # (spec/mamba_pool.py)
    swa_free_pages: list = field(default_factory=list)
    full_to_swa_index_mapping: dict = field(default_factory=dict)
    mamba_free_slots: list = field(default_factory=list)
    forward_iter: int = 0
    mamba_clock: int = 0        # the Mamba LRU's clock (spec/mamba_tree.py)
    unfiltered: tuple = ()      # priority scheduling: the running batch's finished requests
                                # (their remaining max_new_tokens, sorted), until
                                # update_running_batch filters them

    def clone(self) -> "State":
        """A copy that shares every entity copy-on-write (see `CowMap`); from here on
        this state must not be mutated. Field for field, without re-running __init__
        (the step's one fixed cost: every successor is a clone)."""
        c = object.__new__(State)
        d = c.__dict__
        d.update(self.__dict__)
        d["free_pages"] = list(self.free_pages)
        d["free_rows"] = list(self.free_rows)
        d["rows"] = self.rows.fork()
        d["content"] = dict(self.content)
        d["nodes"] = self.nodes.fork()
        d["reqs"] = self.reqs.fork()
        d["slots"] = self.slots.fork()
        d["sessions"] = self.sessions.fork()
        d["swa_free_pages"] = list(self.swa_free_pages)
        d["full_to_swa_index_mapping"] = dict(self.full_to_swa_index_mapping)
        d["mamba_free_slots"] = list(self.mamba_free_slots)
        return c


def initial_state(cfg: Config) -> State:
    """An empty server: every page and row free, a tree holding only the root."""
    P = cfg.page_size
    return State(
        cfg=cfg,
        free_pages=list(range(1, cfg.num_pages + 1)),
        free_rows=list(range(cfg.num_rows)),
        rows=CowMap(((r, [None] * (cfg.max_context_len // P)) for r in range(cfg.num_rows)),
                    list),
        content={},
        nodes=CowMap({ROOT: Node(ROOT, (), (), None, {}, 1, 0)}, Node.copy),
        next_node_id=1,
        evictable_size=0,
        protected_size=0,
        reqs=CowMap((), Req.copy),
        slots=CowMap((), Slot.copy),
        sessions=CowMap((), Session.copy),
        swa_free_pages=list(range(1, cfg.swa_pages + 1)) if cfg.swa_window else [],
        mamba_free_slots=list(range(1, cfg.mamba_slots + 1)),
    )
