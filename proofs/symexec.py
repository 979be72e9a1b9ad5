"""Run the real `spec/pages.py` functions on z3 terms.

Every lemma in `proofs/lemmas.py` is stated about the z3 term that *this module* obtains
by executing the Python function itself, not about a hand-written copy of it: a lemma
cannot silently be about a different function.

How: the arguments are `Sym` wrappers around z3 integer terms with Python's integer
semantics (`//` and `%` floor towards minus infinity, exactly as Python does, for any
sign of the divisor). A comparison yields a `SymBool`; when the function branches on
it (`if`, `min`, `max`, `and`), `__bool__` asks the `Explorer`, which enumerates every
branch decision sequence depth-first (like CrossHair does) and records the path
condition of each run. The function's result is then the z3 `If`-chain over the path
conditions. `range(a, b)` inside the function becomes a `SymRange` (the functions are
re-bound to a copy of the module's globals where `range` is shadowed; the real module is
never modified). A `mutate()`d copy of the module replaces one function (a negative
control) and every other function that calls it sees the mutant.
"""
from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any, Callable

import z3

import kvcheck.spec.pages as _pages

from kvcheck.proofs.core import checked

PRUNE_RLIMIT = 5_000_000
"""z3 steps for one path-feasibility query (deterministic, unlike a time limit)."""


# ---------------------------------------------------------------------------
# Python integer semantics on z3 terms
# ---------------------------------------------------------------------------

def py_floordiv(x, p):
    """Python `x // p` (floor) for a nonzero p of either sign. SMT `div` is Euclidean
    (0 <= remainder < |p|); it equals floor division for p > 0, and for p < 0 Python's
    floor(x/p) = floor((-x)/(-p))."""
    x, p = _z(x), _z(p)
    if z3.is_int_value(p):
        v = p.as_long()
        return x / p if v > 0 else (-x) / (-p)
    if POSITIVE_DIVISORS:
        # Under the obligation p > 0 (checked by kvcheck.proofs.core.check for every term
        # recorded here) SMT div is Python's floor division.
        POSITIVE_DIVISORS[-1].append(p)
        return x / p
    return z3.If(p > 0, x / p, (-x) / (-p))


POSITIVE_DIVISORS: list[list] = []
"""While a lemma is built (`kvcheck.proofs.core.obligations()`), symbolic divisors are recorded
here instead of being case-split on their sign."""


def py_mod(x, p):
    """Python `x % p` = x - p * (x // p) (the sign of the divisor)."""
    x, p = _z(x), _z(p)
    return x - p * py_floordiv(x, p)


def _z(v):
    if isinstance(v, Sym):
        return v.t
    if isinstance(v, SymBool):
        return v.t
    if isinstance(v, bool):
        return z3.BoolVal(v)
    if isinstance(v, int):
        return z3.IntVal(v)
    return v


def _wrap(t):
    if z3.is_bool(t):
        return SymBool(t)
    return Sym(t)


class Sym:
    """A z3 integer term that behaves like a Python int (as far as spec/pages.py needs)."""
    __slots__ = ("t",)

    def __init__(self, t):
        self.t = _z(t)

    def __repr__(self):
        return f"Sym({self.t})"

    # arithmetic
    def __add__(self, o): return Sym(self.t + _z(o))
    def __radd__(self, o): return Sym(_z(o) + self.t)
    def __sub__(self, o): return Sym(self.t - _z(o))
    def __rsub__(self, o): return Sym(_z(o) - self.t)
    def __mul__(self, o): return Sym(self.t * _z(o))
    def __rmul__(self, o): return Sym(_z(o) * self.t)
    def __floordiv__(self, o): return Sym(py_floordiv(self.t, o))
    def __rfloordiv__(self, o): return Sym(py_floordiv(o, self.t))
    def __mod__(self, o): return Sym(py_mod(self.t, o))
    def __rmod__(self, o): return Sym(py_mod(o, self.t))
    def __neg__(self): return Sym(-self.t)
    def __pos__(self): return self
    def __abs__(self): return Sym(z3.If(self.t >= 0, self.t, -self.t))

    # comparisons
    def __lt__(self, o): return SymBool(self.t < _z(o))
    def __le__(self, o): return SymBool(self.t <= _z(o))
    def __gt__(self, o): return SymBool(self.t > _z(o))
    def __ge__(self, o): return SymBool(self.t >= _z(o))
    def __eq__(self, o): return SymBool(self.t == _z(o))  # type: ignore[override]
    def __ne__(self, o): return SymBool(self.t != _z(o))  # type: ignore[override]
    __hash__ = None  # type: ignore[assignment]

    def __bool__(self):
        return Explorer.current().decide(self.t != 0)

    def __index__(self):
        raise TypeError("a symbolic integer cannot be used as a concrete index")


class SymBool:
    __slots__ = ("t",)

    def __init__(self, t):
        self.t = t

    def __repr__(self):
        return f"SymBool({self.t})"

    def __bool__(self):
        return Explorer.current().decide(self.t)

    def __eq__(self, o): return SymBool(self.t == _z(o))  # type: ignore[override]
    def __ne__(self, o): return SymBool(self.t != _z(o))  # type: ignore[override]
    def __invert__(self): return SymBool(z3.Not(self.t))
    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True)
class SymRange:
    """`range(start, stop)` (step 1) with z3 bounds, as returned by row_pages."""
    start: Any
    stop: Any

    def __len__(self):  # pragma: no cover - len() needs a concrete int
        raise TypeError("use SymRange.length")

    @property
    def length(self):
        return z3.If(_z(self.stop) > _z(self.start), _z(self.stop) - _z(self.start), 0)

    def contains(self, k):
        return z3.And(_z(self.start) <= _z(k), _z(k) < _z(self.stop))


def _sym_range(*args):
    if len(args) == 1:
        start, stop = 0, args[0]
    elif len(args) == 2:
        start, stop = args
    else:
        raise TypeError("symbolic range supports step 1 only")
    if all(isinstance(a, int) and not isinstance(a, bool) for a in (start, stop)):
        return SymRange(z3.IntVal(start), z3.IntVal(stop))
    return SymRange(_z(start), _z(stop))


# ---------------------------------------------------------------------------
# branch exploration
# ---------------------------------------------------------------------------

class PathExplosion(RuntimeError):
    pass


class Explorer:
    """Depth-first enumeration of the branch decisions of one call."""
    _stack: list["Explorer"] = []
    MAX_PATHS = 256

    def __init__(self, prune: bool = True):
        self.prefix: list[bool] = []
        self.pos = 0
        self.conds: list = []
        self.prune = prune
        self.solver = z3.Solver() if prune else None
        if prune:   # bounded by steps, not time; an unknown keeps the branch (feasible)
            self.solver.set("rlimit", PRUNE_RLIMIT)

    @classmethod
    def current(cls) -> "Explorer":
        if not cls._stack:
            raise TypeError("a symbolic value was used as a bool outside spec evaluation")
        return cls._stack[-1]

    def decide(self, cond) -> bool:
        cond = z3.simplify(cond)
        if z3.is_true(cond):
            return True
        if z3.is_false(cond):
            return False
        if self.pos < len(self.prefix):
            d = self.prefix[self.pos]
        else:
            d = True
            if self.prune:  # take the True side only if it is feasible on this path
                self.solver.push()
                self.solver.add(*self.conds, cond)
                if checked(self.solver) == z3.unsat:
                    d = False
                self.solver.pop()
            self.prefix.append(d)
        self.pos += 1
        self.conds.append(cond if d else z3.Not(cond))
        return d

    def run(self, fn: Callable, args) -> list[tuple[Any, Any]]:
        """All (path condition, result) pairs of fn(*args)."""
        paths = []
        Explorer._stack.append(self)
        try:
            while True:
                self.pos, self.conds = 0, []
                result = fn(*args)
                paths.append((z3.And(*self.conds) if self.conds else z3.BoolVal(True), result))
                if len(paths) > self.MAX_PATHS:
                    raise PathExplosion(f"{fn.__name__}: more than {self.MAX_PATHS} paths")
                # backtrack: drop trailing False decisions, flip the last True
                del self.prefix[self.pos:]
                while self.prefix and self.prefix[-1] is False:
                    self.prefix.pop()
                if not self.prefix:
                    break
                self.prefix[-1] = False
        finally:
            Explorer._stack.pop()
        return paths


def _merge(paths):
    """Fold (cond, value) pairs into one value: ite over the conditions."""
    first = paths[0][1]
    if isinstance(first, tuple):
        return tuple(_merge([(c, v[i]) for c, v in paths]) for i in range(len(first)))
    if isinstance(first, SymRange):
        return SymRange(_merge([(c, v.start) for c, v in paths]),
                        _merge([(c, v.stop) for c, v in paths]))
    out = _z(paths[-1][1])
    for c, v in reversed(paths[:-1]):
        out = z3.If(c, _z(v), out)
    return out


def symbolic(fn: Callable, *args, module: "Module | None" = None):
    """z3 term(s) of `fn(*args)` where fn is a kvcheck.spec.pages function (or its name) and args
    are z3 terms / ints / None. Returns a z3 term, a tuple of them, or a SymRange."""
    mod = module or REAL
    f = mod.fn(fn if isinstance(fn, str) else fn.__name__)
    wrapped = [Sym(a) if isinstance(a, (z3.ArithRef, int)) and not isinstance(a, bool) else a
               for a in args]
    paths = Explorer().run(f, wrapped)
    return _merge(paths)


# ---------------------------------------------------------------------------
# module copies (for symbolic range and for mutants)
# ---------------------------------------------------------------------------

class Module:
    """kvcheck.spec.pages re-bound to its own globals: `range` is symbolic there, and overrides
    (mutants) replace functions by name so that callers see them."""

    def __init__(self, overrides: dict[str, Callable] | None = None, name: str = "kvcheck.spec.pages"):
        self.name = name
        self.overrides = dict(overrides or {})
        g = dict(_pages.__dict__)
        g["range"] = _sym_range
        self.globals = g
        for k, v in list(_pages.__dict__.items()):
            if isinstance(v, types.FunctionType) and v.__module__ == _pages.__name__:
                g[k] = _rebind(v, g)
        for k, v in self.overrides.items():
            g[k] = _rebind(v, g)

    def fn(self, name: str) -> Callable:
        return self.globals[name]

    def concrete(self, name: str) -> Callable:
        """The same function with the builtin range (for concrete cross-checks)."""
        g = dict(self.globals)
        g["range"] = range
        for k, v in list(g.items()):
            if isinstance(v, types.FunctionType) and getattr(v, "__globals__", None) is self.globals:
                g[k] = _rebind(v, g)
        return g[name]


def _rebind(f: types.FunctionType, g: dict) -> types.FunctionType:
    nf = types.FunctionType(f.__code__, g, f.__name__, f.__defaults__, f.__closure__)
    nf.__kwdefaults__ = f.__kwdefaults__
    nf.__doc__ = f.__doc__
    return nf


REAL = Module()


def mutate(name: str, **overrides: Callable) -> Module:
    return Module(overrides, name=name)


class positive_divisors:
    """Context manager: inside it, `x // p` with a symbolic p is encoded as SMT div and
    p is recorded; `.obligation()` is the conjunction `p > 0` over the recorded divisors,
    which the caller must prove from its hypotheses (kvcheck.proofs.core.check does)."""

    def __enter__(self):
        self.divs: list = []
        POSITIVE_DIVISORS.append(self.divs)
        return self

    def __exit__(self, *exc):
        POSITIVE_DIVISORS.pop()
        return False

    def obligation(self):
        uniq = {d.get_id(): d for d in self.divs}
        return z3.And(*[d > 0 for d in uniq.values()]) if uniq else z3.BoolVal(True)


# the vocabulary the lemmas (proofs/lemmas.py, proofs/hybrid_lemmas.py) are written in

def S(M: Module, name: str, *args):
    return symbolic(name, *args, module=M)


def is_mult(x, p):
    return py_mod(x, p) == 0


def zmin(a, b):
    return z3.If(a <= b, a, b)


def zmax(a, b):
    return z3.If(a >= b, a, b)
