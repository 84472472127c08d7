"""A warm limiter meeting a new group: its first request is served by the exchange asked for at
once, never held until the server's next tick, in the synchronous and the asyncio limiter,
even when the caller retries at once without pausing."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Iterator

import pytest

import tollgate
from conftest import Server, start


@pytest.fixture
def slow_ticks(tmp_path: Path) -> Iterator[Server]:
    # A tick a minute long: a first request that waited for the next tick would not be
    # admitted within any of the timeouts below.
    s = start(tmp_path / "data", "--tick-ms", "60000", "--lease-ms", "120000")
    yield s
    s.stop()


def test_a_warm_limiters_new_group_is_admitted_without_waiting_for_a_tick(slow_ticks: Server) -> None:
    with tollgate.Admin(slow_ticks.url) as admin:
        admin.create_group("warm", limit=1000)
        for i in range(5):
            admin.create_group(f"new-{i}", limit=1000)
    with tollgate.Limiter(slow_ticks.url, client_id="py-warm", max_wait=10) as limiter:
        limiter.acquire("warm").settle(1)
        # Refused once (the bucket is empty), so the client knows when the next tick is.
        for _ in range(2000):
            try:
                limiter.try_acquire("warm", 1)
            except tollgate.Throttled:
                break
        for i in range(5):
            with limiter.acquire(f"new-{i}", timeout=10):
                pass
            stats = limiter.stats(f"new-{i}")
            assert stats is not None and stats.admitted == 1 and stats.throttled == 0


def test_an_asyncio_retry_loop_with_no_pause_still_lets_the_grant_come(slow_ticks: Server) -> None:
    with tollgate.Admin(slow_ticks.url) as admin:
        admin.create_group("spin", limit=1000)

    async def main() -> None:
        async with tollgate.AsyncLimiter(slow_ticks.url, client_id="py-spin", max_wait=1) as limiter:
            deadline = time.monotonic() + 30
            tries = 0
            while time.monotonic() < deadline:
                tries += 1
                try:
                    # A timeout too short for any wait, retried at once: each refusal still
                    # lets the loop run the exchange.
                    permit = await limiter.acquire("spin", 1, timeout=0.000001)
                except tollgate.Throttled:
                    continue
                permit.settle(1)
                return
            raise AssertionError(f"0 admitted in {tries} tries")

    asyncio.run(main())
