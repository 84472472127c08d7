"""The asyncio limiter against a real server: the same semantics as the synchronous one, an
acquire that never blocks the loop, and cancellation that leaves nothing behind."""

from __future__ import annotations

import asyncio
import time

import pytest

import tollgate
from conftest import Server


async def first_grant(limiter: tollgate.AsyncLimiter, group: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            limiter.try_acquire(group, 0).settle(0)
            return
        except tollgate.Throttled:
            await asyncio.sleep(0.02)
    raise AssertionError(f"never granted: {group}")


def test_async_acquire_waits_without_blocking_the_loop(server: Server) -> None:
    with tollgate.Admin(server.url) as admin:
        admin.create_group("aio", limit=10, burst=2)

    async def main() -> None:
        async with tollgate.AsyncLimiter(server.url, client_id="py-aio", max_wait=5) as limiter:
            # A new group: acquire goes on as soon as the first grant comes.
            permit = await limiter.acquire("aio", 2)
            async with permit:
                permit.settle(1)  # one unit back
            limiter.try_acquire("aio", 1)
            ticks = 0

            async def ticker() -> None:
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.005)
                    ticks += 1

            beat = asyncio.get_running_loop().create_task(ticker())
            await asyncio.sleep(0)
            # The bucket is empty: this waits about 0.2 s for two units at 10/s, and the loop
            # runs the ticker meanwhile (a blocking wait would leave it at 0).
            await limiter.acquire("aio", 2)
            assert ticks > 0
            beat.cancel()
            stats = limiter.stats("aio")
            assert stats is not None and stats.admitted == 3 and stats.waited >= 1 and stats.throttled == 0
            # Past max_wait (a cost above the burst can never fit): refused, counted once.
            with pytest.raises(tollgate.Throttled) as refused:
                await limiter.acquire("aio", 10, timeout=0.2)
            assert refused.value.group == "aio"
            stats = limiter.stats("aio")
            assert stats is not None and stats.throttled == 1
            assert limiter.status().connected

            @limiter.limit("aio", cost=1)
            async def handle(x: int) -> int:
                return x + 1

            assert await handle(1) == 2
            with pytest.raises(tollgate.InvalidArgument) as bad:
                await limiter.acquire("aio", float("nan"))
            assert bad.value.field == "cost"

    asyncio.run(main())


def test_a_cancelled_acquire_takes_nothing(server: Server) -> None:
    with tollgate.Admin(server.url) as admin:
        admin.create_group("cancel", limit=1, burst=1)

    async def main() -> None:
        async with tollgate.AsyncLimiter(server.url, max_wait=30) as limiter:
            await first_grant(limiter, "cancel")
            limiter.try_acquire("cancel", 1)
            waiter = asyncio.get_running_loop().create_task(limiter.acquire("cancel", 1))
            while True:
                stats = limiter.stats("cancel")
                g = limiter._core.groups["cancel"]
                if g.waiting > 0:
                    break
                await asyncio.sleep(0.001)
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            assert g.waiting == 0
            stats = limiter.stats("cancel")
            assert stats is not None and stats.admitted == 2  # the first grant's probe and one

    asyncio.run(main())


def test_async_and_sync_share_one_group(server: Server) -> None:
    with tollgate.Admin(server.url) as admin:
        admin.create_group("mixed", limit=1000)

    async def main() -> None:
        with tollgate.Limiter(server.url, client_id="sync") as sync:
            async with tollgate.AsyncLimiter(server.url, client_id="async") as limiter:
                await first_grant(limiter, "mixed")
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    for handle in (sync, limiter):
                        try:
                            handle.try_acquire("mixed", 0)
                        except tollgate.Throttled:
                            pass
                    a, s = limiter.stats("mixed"), sync.stats("mixed")
                    if a is not None and s is not None and 0 < a.rate < 1000 and a.rate + s.rate <= 1000 + 1e-6:
                        return
                    await asyncio.sleep(0.02)
                raise AssertionError("the two clients never shared the limit")

    asyncio.run(main())


def test_async_safe_mode_from_a_cold_start() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def main() -> None:
        async with tollgate.AsyncLimiter(f"http://127.0.0.1:{port}", safe_mode="fail_open", exchange_timeout=0.5) as limiter:
            deadline = time.monotonic() + 30
            while not limiter.status().safe_mode:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
            limiter.try_acquire("anything", 5)

    asyncio.run(main())
