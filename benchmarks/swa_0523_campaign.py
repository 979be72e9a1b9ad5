"""Lockstep campaign of the spec against 0.5.23's FULL + SWA `UnifiedRadixCache`
(adapters/sglang/swa_unified.py), with the adapter's refusals lifted for the run (the
prefill-aware one is all that is left): random walks on drawn borrow-era SWA configurations
(`draw_hybrid`'s "swa" kind by default; `--kind swa-no-prefill-aware` is what `check` /
`fuzz --backend sglang:0.5.23` draw, `--kind swa-full-pool` keeps the SWA pool as large as
the full one), each to its first divergence, tallied by the failing operation and
invariant, so each kind of divergence can be examined against the upstream code
(docs/semantics.md, "The 0.5.23 SWA tree against the spec").

    .venv/bin/python -m benchmarks.swa_0523_campaign --walks 40 --seed 1 [--length 40]
        [--accept U1,U2,U6] [--kind swa]

Keyed by the first failing operation and invariant, ", prefill-aware" where the drawn
configuration has `prefill_aware_swa` (0.5.23 pairs it only with an all-SWA model, i.e.
`PureSWARadixCache`, not this tree: docs/semantics.md) and ", smaller SWA pool" where its
SWA pool is smaller than the full one.
"""
from __future__ import annotations

import argparse
import collections
import time


def _kind(f) -> str:
    """What a state divergence's first difference is about (the rules of
    docs/semantics.md's list)."""
    if f.id != "D1" or not f.details:
        return ""
    first = f.details[0]
    for word, kind in (("swa_evicted_seqlen", "cursor"), ("swa_uuid_for_lock", "lock boundary"),
                       ("node", "tree shape"), ("swa_", "SWA pool")):
        if word in first:
            return f" [{kind}]"
    return f" [{first[:30]}]"


def main(argv=None) -> int:
    from kvcheck.adapters.sglang.findings import known_trigger
    from kvcheck.adapters.sglang.proxy import SglangProxy
    from kvcheck.engines.stats import Stats
    from kvcheck.engines.walk import walk
    ap = argparse.ArgumentParser()
    ap.add_argument("--walks", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--length", type=int, default=40)
    ap.add_argument("--accept", default="")
    ap.add_argument("--kind", default="swa", help="the drawn hybrid kind: swa (any SWA pool, "
                    "prefill-aware or not) or swa-full-pool (what 0.5.23 runs draw)")
    args = ap.parse_args(argv)
    accept = tuple(x for x in args.accept.split(",") if x)
    kw = dict(era="borrow", hybrid=True, hybrid_kinds=(args.kind,), tree_off=False)
    if accept:
        kw["accept"] = accept
    skip = known_trigger("0.5.23", accept)
    tally, examples, stats, t0 = collections.Counter(), {}, Stats(), time.time()
    for i in range(args.walks):
        seq = walk(args.seed, i, lambda cfg: SglangProxy(cfg, "0.5.23", refuse=False),
                   "sglang-0.5.23", stats, config_kw=kw, skip=skip, length=args.length)
        f = seq.failure
        key = ("pass" if f is None else f"{f.op.name} {f.id}{_kind(f)} ({f.side})") + \
            (", prefill-aware" if seq.cfg.prefill_aware_swa else "") + \
            (", smaller SWA pool" if seq.cfg.swa_num_pages not in (None, seq.cfg.num_pages) else "")
        tally[key] += 1
        if f is not None and key not in examples:
            examples[key] = (i, seq.cfg, seq.ops, f.render().splitlines()[:14])
    print(f"{args.walks} walks of up to {args.length} steps, seed {args.seed}, "
          f"{time.time() - t0:.0f} s")
    for key, n in tally.most_common():
        print(f"{n:4d}  {key}")
    for key, (i, cfg, ops, lines) in examples.items():
        print(f"\n== {key}: walk {i}, {cfg}")
        print("   ops:", "; ".join(repr(o) for o in ops[-6:]))
        for ln in lines:
            print("  ", ln)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
