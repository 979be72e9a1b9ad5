"""Random conformance walks against a real sglang release.

    .venv/bin/python -m kvcheck.adapters.sglang.explore --version 0.5.15 --walks 50 --length 40 \
        [--seed 1] [--page-size 4] [--avoid-hazards] [--save-dir failures/sglang]

Each walk draws ops the spec enables (kvcheck.spec.model.enabled) and runs them through
kvcheck.checker.run_ops against the release; the first failure of a walk is printed and,
with --save-dir, saved as a trace (its "expect" names the failure). --avoid-hazards
leaves out the ops that reach the known upstream hazards H3/H4/H5 (a submit_turn while
the session has a turn in flight, a retract of a streaming turn, a queued abort of a
streaming turn), so that other divergences surface.
"""
from __future__ import annotations

import argparse
import random
import sys
import time

from kvcheck.checker import run_ops
from kvcheck.trace import Expect, Trace
from kvcheck.spec import ops as O
from kvcheck.spec.config import Config
from kvcheck.spec.model import enabled, initial_state, step
from kvcheck.adapters.sglang.proxy import make_backend


def _candidates(s, rnd: random.Random, cfg: Config, next_rid: int, avoid: bool):
    c = []
    for sid in (1, 2):
        c.append(O.OpenSession(sid))
        c.append(O.CloseSession(sid))
        sess = s.sessions.get(sid)
        if not (avoid and sess is not None and (sess.inflight_rid is not None or sess.close_pending)):
            n = rnd.randint(1, 6)
            c.append(O.SubmitTurn(sid, next_rid, tuple(rnd.randint(20, 40) for _ in range(n)),
                                  rnd.randint(1, 4)))
    base = (1, 2, 3, 4, 5, 6, 7, 8)
    c.append(O.SubmitRequest(next_rid, base[: rnd.randint(2, 8)] + tuple(
        rnd.randint(50, 60) for _ in range(rnd.randint(0, 3))), rnd.randint(1, 4)))
    for rid, r in s.reqs.items():
        streaming = r.session is not None
        c += [O.Schedule(rid, rnd.random() < 0.9), O.PrefillChunk(rid), O.Finish(rid),
              O.AbortRunning(rid), O.PreAbort(rid),
              O.Decode(rid, rnd.randint(1, 9))]
        if cfg.spec_enabled:
            d = rnd.randint(1, cfg.max_drafts)
            c.append(O.SpecDecode(rid, d, rnd.randint(0, d), rnd.randint(1, 9)))
        if not (avoid and streaming):
            c += [O.Retract(rid), O.AbortQueued(rid)]
    c.append(O.Evict(rnd.choice((1, cfg.page_size, 4 * cfg.page_size))))
    return [op for op in c if enabled(s, op)]


def walk(cfg: Config, rnd: random.Random, length: int, avoid: bool) -> list:
    s = initial_state(cfg)
    ops, next_rid = [], 1
    for _ in range(length):
        cands = _candidates(s, rnd, cfg, next_rid, avoid)
        if not cands:
            break
        # weight progress ops so that turns finish
        op = rnd.choice(cands)
        s, _ = step(s, op)
        ops.append(op)
        if isinstance(op, (O.SubmitTurn, O.SubmitRequest)):
            next_rid += 1
    return ops


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvcheck.adapters.sglang.explore")
    ap.add_argument("--version")
    ap.add_argument("--walks", type=int, default=20)
    ap.add_argument("--length", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--page-size", type=int, default=1)
    ap.add_argument("--num-pages", type=int, default=24)
    ap.add_argument("--chunk-size", type=int)
    ap.add_argument("--overlap", action="store_true")
    ap.add_argument("--spec", action="store_true")
    ap.add_argument("--era", default="wrapper")
    ap.add_argument("--avoid-hazards", action="store_true")
    ap.add_argument("--save-dir")
    args = ap.parse_args(argv)
    cfg = Config(page_size=args.page_size, num_pages=args.num_pages, num_rows=4,
                 max_context_len=64, chunk_size=args.chunk_size, spec_enabled=args.spec,
                 overlap=args.overlap, era=args.era)
    rnd = random.Random(args.seed)
    fails = {}
    t0 = time.monotonic()
    for w in range(args.walks):
        ops = walk(cfg, rnd, args.length, args.avoid_hazards)
        backend = make_backend(cfg, args.version)
        res = run_ops(cfg, ops, backend, backend_name=backend.name)
        f = res.failure
        if f is None:
            continue
        key = (f.id, f.side, f.op.name)
        fails.setdefault(key, 0)
        fails[key] += 1
        if fails[key] == 1:
            print(f"walk {w}: {f.render()}\n")
            if args.save_dir:
                tr = Trace(cfg, ops[: f.step + 1],
                           Expect("violation", f.id, f.step, f.side),
                           {"source": f"kvcheck.adapters.sglang.explore seed={args.seed} walk={w}"})
                tr.save(f"{args.save_dir}/walk-{args.seed}-{w}.json")
    dt = time.monotonic() - t0
    print(f"{args.walks} walks in {dt:.1f}s; distinct failures: "
          + (", ".join(f"{k[0]} on {k[1]} at {k[2]} x{n}" for k, n in fails.items()) or "none"))
    return 0 if not fails else 1


if __name__ == "__main__":
    sys.exit(main())
