"""The Python client measured against a running server (``tollgate server``):

- ``python bench.py decisions [URL]``: the cost of one ``try_acquire`` on a granted group, in
  the synchronous and the asyncio limiter, as the median of five one-second runs; beside it,
  when PyPI's ``limits`` is installed, the same for its in-memory fixed and moving windows
  (a local limiter, the usual choice in Python);
- ``python bench.py accuracy [URL] [--processes 20] [--seconds 30] [--limit 2000]``: that many
  processes, each its own limiter, ask for as much of one group as they can for that long; the
  units admitted in all against what the limit allows (the limit × the time, plus one burst).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import time
from typing import Callable, List

import tollgate


def rate(call: Callable[[], object]) -> List[float]:
    """Calls per second of ``call``, five one-second runs."""
    runs = []
    for _ in range(5):
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < 1.0:
            for _ in range(1000):
                call()
            n += 1000
        runs.append(n / (time.perf_counter() - start))
    return runs


def report(name: str, runs: List[float]) -> None:
    median = statistics.median(runs)
    print(f"{name}: {1e9 / median:,.0f} ns a call (median {median:,.0f} decisions/s of {[round(r) for r in runs]})")


def granted(limiter: tollgate.Limiter, group: str) -> None:
    while True:
        try:
            limiter.try_acquire(group, 0)
            return
        except tollgate.Throttled:
            time.sleep(0.01)


def decisions(url: str) -> None:
    with tollgate.Admin(url) as admin:
        admin.put_group("py-bench", limit="unlimited")
        admin.put_group("py-bench-limited", limit=1e9)
        admin.put_group("py-bench-aio", limit=1e9)
    with tollgate.Limiter(url) as limiter:
        granted(limiter, "py-bench")
        granted(limiter, "py-bench-limited")
        report("sync try_acquire, unlimited group", rate(lambda: limiter.try_acquire("py-bench", 1)))
        report("sync try_acquire, limited group", rate(lambda: limiter.try_acquire("py-bench-limited", 1)))

    async def aio() -> None:
        async with tollgate.AsyncLimiter(url) as limiter:
            while True:
                try:
                    limiter.try_acquire("py-bench-aio", 0)
                    break
                except tollgate.Throttled:
                    await asyncio.sleep(0.01)
            report("asyncio try_acquire, limited group", rate(lambda: limiter.try_acquire("py-bench-aio", 1)))
            # An acquire that finds tokens at once: the awaitable's own cost.
            loop_runs = []
            for _ in range(5):
                n, start = 0, time.perf_counter()
                while time.perf_counter() - start < 1.0:
                    for _ in range(1000):
                        await limiter.acquire("py-bench-aio", 1)
                    n += 1000
                loop_runs.append(n / (time.perf_counter() - start))
            report("asyncio await acquire (tokens at hand)", loop_runs)

    asyncio.run(aio())
    try:
        import limits
        import limits.storage
        import limits.strategies
    except ImportError:
        return
    item = limits.parse("1000000000/second")
    storage = limits.storage.MemoryStorage()
    fixed = limits.strategies.FixedWindowRateLimiter(storage)
    moving = limits.strategies.MovingWindowRateLimiter(storage)
    report(f"peer: limits {limits.__version__} fixed window hit", rate(lambda: fixed.hit(item, "bench")))
    report(f"peer: limits {limits.__version__} moving window hit", rate(lambda: moving.hit(item, "bench-moving")))


def worker(url: str, group: str, seconds: float, start_at: float, out: "multiprocessing.Queue[float]") -> None:
    with tollgate.Limiter(url) as limiter:
        granted(limiter, group)
        while time.time() < start_at:
            time.sleep(0.001)
        admitted, end = 0.0, start_at + seconds
        while time.time() < end:
            try:
                limiter.try_acquire(group, 1)
                admitted += 1
            except tollgate.Throttled as t:
                time.sleep(min(t.retry_after, 0.005))
        out.put(admitted)


def accuracy(url: str, processes: int, seconds: float, limit: float) -> None:
    burst = limit  # the server's default burst: one second of the rate
    with tollgate.Admin(url) as admin:
        admin.put_group("py-accuracy", limit=limit)
    out: "multiprocessing.Queue[float]" = multiprocessing.Queue()
    start_at = time.time() + 5.0
    workers = [
        multiprocessing.Process(target=worker, args=(url, "py-accuracy", seconds, start_at, out)) for _ in range(processes)
    ]
    for w in workers:
        w.start()
    admitted = [out.get() for _ in workers]
    for w in workers:
        w.join()
    allowed = limit * seconds + burst
    total = sum(admitted)
    print(
        f"{processes} processes, {seconds:.0f} s at {limit:,.0f} units/s: admitted {total:,.0f} of {allowed:,.0f} allowed "
        f"({total / allowed:.3f}); per process min {min(admitted):,.0f}, max {max(admitted):,.0f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["decisions", "accuracy"])
    parser.add_argument("url", nargs="?", default="http://127.0.0.1:7460")
    parser.add_argument("--processes", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--limit", type=float, default=2000.0)
    args = parser.parse_args()
    if args.what == "decisions":
        decisions(args.url)
    else:
        accuracy(args.url, args.processes, args.seconds, args.limit)


if __name__ == "__main__":
    main()
