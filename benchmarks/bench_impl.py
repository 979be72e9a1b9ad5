"""Per-operation latency of impl/ on the current device.

    python -m benchmarks.bench_impl [--device cpu|cuda] [--repeat N]

Prints median and p90 microseconds for: allocator alloc / alloc_extend / alloc_decode /
free, radix match_prefix and insert, and a full streaming turn through the Scheduler
facade (submit, schedule, decodes, finish)."""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from kvcheck.impl.allocator import make_allocator
from kvcheck.impl.device import resolve_device
from kvcheck.impl.memory_pool import ReqToTokenPool
from kvcheck.impl.radix_cache import RadixCache
from kvcheck.impl.scheduler import Scheduler


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def timeit(fn, repeat, dev, setup=None):
    out = []
    for _ in range(repeat):
        arg = setup() if setup else None
        _sync(dev)
        t0 = time.perf_counter()
        fn(arg)
        _sync(dev)
        out.append((time.perf_counter() - t0) * 1e6)
    out.sort()
    return statistics.median(out), out[int(0.9 * (len(out) - 1))]


def measure(dev, R: int) -> list:
    """[(operation, (median us, p90 us))] on device dev, R repeats each."""
    rows = []

    for P in (1, 16):
        num_pages = 65536 // P
        alloc = make_allocator(num_pages, P, dev, need_sort=True)

        def fresh(n):       # P > 1: a row's first extend (the paged allocator has no alloc)
            return alloc.alloc(n) if P == 1 else alloc.alloc_extend(
                torch.zeros(1, dtype=torch.int64, device=dev),
                torch.full((1,), n, dtype=torch.int64, device=dev),
                torch.full((1,), -1, dtype=torch.int64, device=dev), n)

        def do_alloc(_):
            x = fresh(256)
            alloc.free(x)
        rows.append((f"alloc(256)+free  P={P}", timeit(do_alloc, R, dev)))

        def setup_free():
            return fresh(4096)
        rows.append((f"free(4096)        P={P}", timeit(lambda x: alloc.free(x), R, dev, setup_free)))
        if P > 1:
            bs = 8
            pre = torch.full((bs,), 13, dtype=torch.int64, device=dev)
            seq = torch.full((bs,), 13 + 300, dtype=torch.int64, device=dev)
            last = torch.arange(bs, dtype=torch.int64, device=dev) * P * 1000 + 12

            def do_extend(_):
                x = alloc.alloc_extend(pre, seq, last, bs * 300)
                alloc.free(x)
            rows.append((f"alloc_extend bs=8 x300 P={P}", timeit(do_extend, R, dev)))
            seqd = torch.full((64,), 17, dtype=torch.int64, device=dev)
            lastd = torch.arange(64, dtype=torch.int64, device=dev) * P + P - 1

            def do_decode(_):
                x = alloc.alloc_decode(seqd, lastd)
                alloc.free(x)
            rows.append((f"alloc_decode bs=64 P={P}", timeit(do_decode, R, dev)))

    P = 16
    alloc = make_allocator(4096, P, dev)
    rc = RadixCache(ReqToTokenPool(4, 2048, dev), alloc, P, dev)
    g = torch.Generator().manual_seed(0)
    keys = []
    for i in range(64):
        base = torch.randint(1, 50, (512,), generator=g).tolist()
        key = tuple([i % 4] * 256 + base[:256])
        keys.append(key)
        rc.insert(key, alloc.alloc_extend(torch.zeros(1, dtype=torch.int64, device=dev),
                                          torch.full((1,), 512, dtype=torch.int64, device=dev),
                                          torch.full((1,), -1, dtype=torch.int64, device=dev), 512))
    it = iter(range(10 ** 9))
    rows.append(("radix match_prefix 512 tok", timeit(lambda _: rc.match_prefix(keys[next(it) % 64]), R, dev)))

    def do_turns(_):
        s = Scheduler(page_size=16, num_pages=256, num_rows=8, max_context_len=2048, overlap=True, device=dev)
        s.open_session(1)
        for t in range(1, 4):
            s.submit_turn(1, t, tuple(range(1, 129)), 16)
            s.schedule(t)
            for _ in range(14):     # prefill samples 1, 14 decodes: 15 < max_new_tokens 16
                s.decode(t, 5)
            s.finish(t)
        s.close_session(1)
    turn = timeit(do_turns, max(10, R // 10), dev)
    rows.append(("3-turn session (128 prompt + 15 output tokens each), per turn", (turn[0] / 3, turn[1] / 3)))

    s = Scheduler(page_size=16, num_pages=256, num_rows=8, max_context_len=2048, device=dev)
    s.submit_request(1, tuple(range(1, 200)), 10 ** 6)
    s.schedule(1)
    rows.append(("scheduler decode step", timeit(lambda _: s.decode(1, 3), min(R, 1500), dev)))
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None)
    ap.add_argument("--repeat", type=int, default=200)
    args = ap.parse_args(argv)
    dev = resolve_device(args.device)
    R = args.repeat
    rows = measure(dev, R)
    print(f"impl/ latency on {dev} (torch {torch.__version__}), repeat={R}")
    w = max(len(n) for n, _ in rows)
    print(f"{'operation'.ljust(w)}  {'median us':>10}  {'p90 us':>10}")
    for name, (med, p90) in rows:
        print(f"{name.ljust(w)}  {med:10.1f}  {p90:10.1f}")


if __name__ == "__main__":
    main()
