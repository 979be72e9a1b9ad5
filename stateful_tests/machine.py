"""Hypothesis state machines: every operation of spec/ops is a rule.

One machine class, built by `make_machine(backend_factory)`: with no backend it checks
the spec alone (all invariants after every step); with a backend it is the
differential machine (abstract states equal after every step, spec invariants on
both sides, concrete invariants on the backend). A failure raises an AssertionError
whose text is the checker's report; the operations of the failing run are kept in
`LAST_FAILURE` so a driver can write the shrunk trace.

Arguments come from the machine's live bundles: the open sessions and the requests
in each scheduler phase, read off the spec state, so a rule only draws objects it can
act on. Lengths are biased towards page boundaries (k*P - 1, k*P, k*P + 1), and
prompts are built from a few shared prefixes so radix matches, splits and shared
locks happen.
"""
from __future__ import annotations

from collections import Counter

from hypothesis import event, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvcheck.checker import Failure, Lockstep
from spec import ops as O
from spec.config import Config
from spec.model import enabled, step  # noqa: F401  (step: used by benchmarks.bench_diff)

PREFIXES = ((1, 2, 3, 4, 5, 6, 7, 8), (1, 2, 3, 4, 9, 9, 9, 9), (5, 6, 7, 8, 1, 2, 3, 4))
TOKENS = st.integers(1, 4)

LAST_FAILURE: dict = {}
"""{"config": Config, "ops": [...], "failure": Failure} of the most recent failing run."""

COVERAGE: Counter = Counter()
"""op name -> applied count (enabled and run), across all runs of the process."""
OUTCOMES: Counter = Counter()
STEPS = Counter()


@st.composite
def configs(draw, page_sizes=(1, 2, 4), spec_enabled=None, era=None, accept=()) -> Config:
    P = draw(st.sampled_from(page_sizes))
    if spec_enabled is None:
        spec_enabled = draw(st.booleans())
    return Config(
        page_size=P,
        num_pages=draw(st.integers(4, 40 // P + 4)),
        num_rows=draw(st.integers(2, 4)),
        max_context_len=64,
        chunk_size=draw(st.sampled_from([None, None, P, 2 * P, 3 * P])),
        spec_enabled=spec_enabled,
        max_drafts=3,
        overlap=draw(st.booleans()),
        era=era or draw(st.sampled_from(["wrapper", "wrapper", "wrapper", "borrow"])),
        accept=tuple(accept),
    )


def lengths(P: int, lo: int, hi: int):
    """Lengths in [lo, hi], biased to both sides of page boundaries."""
    near = sorted({x for k in range(1, hi // P + 2) for x in (k * P - 1, k * P, k * P + 1) if lo <= x <= hi})
    return st.one_of(st.sampled_from(near), st.integers(lo, hi)) if near else st.integers(lo, hi)


@st.composite
def prompts(draw, P: int, lo: int = 1, hi: int = 14) -> tuple:
    n = draw(lengths(P, lo, hi))
    base = draw(st.sampled_from(PREFIXES + ((),)))
    cut = draw(st.integers(0, min(n, len(base))))
    rest = draw(st.lists(TOKENS, min_size=n - cut, max_size=n - cut))
    return tuple(base[:cut]) + tuple(rest)


class KVMachine(RuleBasedStateMachine):
    backend_factory = None      # set by make_machine
    backend_name = "impl"
    config_strategy = configs()

    def __init__(self):
        super().__init__()
        self.cfg = None
        self.lock = None
        self.ops: list = []
        self.next_id = 1

    @property
    def s(self):
        """The spec state (None before set-up): the live bundles are read off it."""
        return None if self.lock is None else self.lock.state

    @property
    def backend(self):
        return None if self.lock is None else self.lock.backend

    # -- set-up -------------------------------------------------------------
    @initialize(data=st.data())
    def setup(self, data):
        cfg = data.draw(type(self).config_strategy, label="config")
        self.cfg = cfg
        STEPS["sequences"] += 1
        factory = type(self).backend_factory
        self.lock = Lockstep(cfg, factory(cfg) if factory is not None else None,
                             self.backend_name)
        event(f"P={cfg.page_size} spec={cfg.spec_enabled} overlap={cfg.overlap} era={cfg.era}")

    def teardown(self):
        if self.backend is not None and hasattr(self.backend, "close"):
            self.backend.close()

    # -- the one place an op is applied -----------------------------------
    skip = None                 # (state, op) -> reason to leave op out (a recorded finding)

    def apply(self, op):
        if not enabled(self.s, op):
            event("skipped: not enabled")
            return
        if self.skip is not None:
            reason = type(self).skip(self.s, op)
            if reason:
                event(f"skipped: recorded finding {reason}")
                return
        self.ops.append(op)
        rec, fail = self.lock.apply(op)
        if fail is not None:
            self._fail(fail)
        out = rec.outcome
        COVERAGE[op.name] += 1
        OUTCOMES[f"{op.name}:{out}"] += 1
        STEPS["steps"] += 1
        event(f"op {op.name} -> {out}")

    def _fail(self, failure: Failure):
        LAST_FAILURE.clear()
        LAST_FAILURE.update(config=self.cfg, ops=list(self.ops), failure=failure)
        raise AssertionError(failure.render())

    # -- live bundles ---------------------------------------------------------
    def _reqs(self, *phases):
        return sorted(r.rid for r in self.s.reqs.values() if r.phase in phases)

    def _fresh(self) -> int:
        self.next_id += 1
        return self.next_id

    def has(self, *phases) -> bool:
        return self.s is not None and any(r.phase in phases for r in self.s.reqs.values())

    @staticmethod
    def rare(data, one_in: int = 3) -> bool:
        """Hypothesis cannot weight rules; the ops that end or reset things (close,
        aborts, opening, plain requests, eviction) go ahead one time in three, so that
        sequences get deep enough for multi-turn sessions, retracts and spec steps."""
        return data.draw(st.integers(0, one_in - 1), label="go") == 0

    def pick(self, data, *phases) -> int:
        return data.draw(st.sampled_from(self._reqs(*phases)), label="rid")

    # -- rules: one per operation -------------------------------------------
    @precondition(lambda self: self.s is not None and len(self.s.sessions) < 2)
    @rule()
    def open_first_session(self):
        if not self.s.sessions:
            self.apply(O.OpenSession(self._fresh()))

    @precondition(lambda self: self.s is not None and len(self.s.sessions) < 2)
    @rule(data=st.data())
    def open_session(self, data):
        if not self.rare(data, 6):
            return
        self.apply(O.OpenSession(self._fresh()))

    @precondition(lambda self: self.s is not None and self.s.sessions and len(self.s.reqs) < 6)
    @rule(data=st.data())
    def submit_turn(self, data):
        idle = sorted(x for x, v in self.s.sessions.items() if v.inflight_rid is None)
        # mostly a session that can take a turn; sometimes one in flight (a create_req rejection)
        if not idle and not self.rare(data, 4):
            return
        pool = idle if idle and data.draw(st.integers(0, 3), label="idle") else sorted(self.s.sessions)
        sid = data.draw(st.sampled_from(pool), label="sid")
        P = self.cfg.page_size
        new = data.draw(prompts(P, 1, 10), label="new_tokens")
        self.apply(O.SubmitTurn(sid, self._fresh(), new, data.draw(lengths(P, 1, 10), label="max_new_tokens")))

    @precondition(lambda self: self.s is not None and len(self.s.reqs) < 6)
    @rule(data=st.data())
    def submit_request(self, data):
        if not self.rare(data, 5):
            return
        P = self.cfg.page_size
        self.apply(O.SubmitRequest(self._fresh(), data.draw(prompts(P, 1, 16), label="tokens"),
                                   data.draw(lengths(P, 1, 10), label="max_new_tokens")))

    @precondition(lambda self: self.has("queued"))
    @rule(data=st.data(), admit=st.sampled_from([True, True, True, False]))
    def schedule(self, data, admit):
        self.apply(O.Schedule(self.pick(data, "queued"), admit))

    @precondition(lambda self: self.has("prefill"))
    @rule(data=st.data())
    def prefill_chunk(self, data):
        self.apply(O.PrefillChunk(self.pick(data, "prefill")))

    @precondition(lambda self: self.has("decode") and not self.cfg.spec_enabled)
    @rule(data=st.data(), token=TOKENS)
    def decode(self, data, token):
        self.apply(O.Decode(self.pick(data, "decode"), token))

    @precondition(lambda self: self.has("decode") and self.cfg.spec_enabled)
    @rule(data=st.data(), drafts=st.integers(1, 3), token=TOKENS)
    def spec_decode(self, data, drafts, token):
        accepted = data.draw(st.integers(0, drafts), label="accepted")
        self.apply(O.SpecDecode(self.pick(data, "decode"), drafts, accepted, token))

    @precondition(lambda self: self.has("decode"))
    @rule(data=st.data())
    def finish(self, data):
        self.apply(O.Finish(self.pick(data, "decode")))

    @precondition(lambda self: self.has("queued"))
    @rule(data=st.data())
    def abort_queued(self, data):
        if not self.rare(data, 5):
            return
        # a client abort (abort_request) or a refusal at the queue door (queue_reject)
        drop = data.draw(st.sampled_from([O.AbortQueued, O.QueueReject]), label="drop")
        self.apply(drop(self.pick(data, "queued")))

    @precondition(lambda self: self.has("queued"))
    @rule(data=st.data())
    def pre_abort(self, data):
        if not self.rare(data, 5):
            return
        self.apply(O.PreAbort(self.pick(data, "queued")))

    @precondition(lambda self: self.has("prefill", "decode"))
    @rule(data=st.data())
    def abort_running(self, data):
        if not self.rare(data):
            return
        self.apply(O.AbortRunning(self.pick(data, "prefill", "decode")))

    @precondition(lambda self: self.has("decode"))
    @rule(data=st.data())
    def retract(self, data):
        self.apply(O.Retract(self.pick(data, "decode")))

    @precondition(lambda self: self.s is not None and self.s.sessions)
    @rule(data=st.data())
    def close_session(self, data):
        if not self.rare(data, 6):
            return
        self.apply(O.CloseSession(data.draw(st.sampled_from(sorted(self.s.sessions)), label="sid")))

    @precondition(lambda self: self.s is not None and self.s.evictable_size > 0)
    @rule(data=st.data())
    def evict(self, data):
        if not self.rare(data):
            return
        self.apply(O.Evict(data.draw(lengths(self.cfg.page_size, 1, 16), label="num_tokens")))

    @invariant()
    def spec_state_checked(self):
        # evaluated in apply() after every step on both sides; this hook only guards
        # against a run that never set up.
        assert self.s is None or self.cfg is not None


def make_machine(backend_factory=None, name: str = "impl", config_strategy=None, skip=None):
    attrs = {"backend_factory": staticmethod(backend_factory) if backend_factory else None,
             "backend_name": name, "skip": staticmethod(skip) if skip else None}
    cls = type(f"KVMachine_{name if backend_factory else 'spec'}", (KVMachine,), attrs)
    if config_strategy is not None:
        cls.config_strategy = config_strategy
    return cls
