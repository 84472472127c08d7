"""The behaviour table every Tollgate client replays against the real server
(clients/cases/behaviour.json; the Rust and Go suites replay the same table, so the clients
agree), here with the blocking and the asyncio limiter; and the embedded limiter, which
answers the same table with the same settings and no server."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path
from typing import Any, Awaitable, Callable, Dict, List

import pytest

import tollgate
from conftest import Server
from tollgate.aio import AsyncLimiter
from tollgate.embedded import EmbeddedLimiter

TABLE = json.loads((Path(__file__).resolve().parents[2] / "cases" / "behaviour.json").read_text())
CASES: List[Dict[str, Any]] = TABLE["cases"]


def configure(server: Server, group: str, case: Dict[str, Any]) -> None:
    if "settings" in case:
        body = json.dumps(case["settings"]).encode()
        request = urllib.request.Request(f"http://{server.http}/v1/groups/{group}", data=body, method="PUT")
        with urllib.request.urlopen(request, timeout=30) as r:
            assert r.status in (200, 201), r.read()


TryAcquire = Callable[[str, float, str], tollgate.Permit]
Acquire = Callable[[str, float], Awaitable[tollgate.Permit]]


async def replay(case: Dict[str, Any], group: str, try_acquire: TryAcquire, acquire: Acquire) -> None:
    """Replays one case's steps, each outcome checked against the table's."""
    permits: Dict[int, tollgate.Permit] = {}
    for i, step in enumerate(case["steps"]):
        where = f"{case['name']}, step {i}"
        if "settle" in step:
            permits.pop(step["settle"]).settle(step["actual"])
            continue
        if "drop" in step:
            permits.pop(step["drop"]).dropped()
            continue
        if "release" in step:
            permits.pop(step["release"]).release()
            continue
        target, cls = step.get("group", group), step.get("class", "normal")
        if "repeat" in step:
            admitted = 0
            for _ in range(step["repeat"]):
                try:
                    try_acquire(target, step["try"], cls)
                    admitted += 1
                except tollgate.Throttled:
                    pass
            assert admitted == step["admitted"], f"{where}: {admitted} admitted"
            continue
        try:
            if "acquire" in step:
                permit = await acquire(target, step["acquire"])
            else:
                permit = try_acquire(target, step["try"], cls)
        except tollgate.Throttled:
            assert step["expect"] == "refused", f"{where}: refused"
            continue
        except tollgate.InvalidArgument as e:
            assert step["expect"] == "invalid" and step["field"] in str(e), f"{where}: {e}"
            continue
        assert step["expect"] == "admitted", f"{where}: admitted"
        permits[i] = permit


@pytest.mark.parametrize("index", range(len(CASES)), ids=[c["name"] for c in CASES])
def test_the_blocking_limiter_behaves_as_the_table_says(server: Server, index: int) -> None:
    case, group = CASES[index], f"case-{index}"
    configure(server, group, case)
    with tollgate.Limiter(server.url, client_id=f"py-case-{index}") as limiter:
        limiter.acquire(group, 0, timeout=30).release()

        async def acquire(target: str, cost: float) -> tollgate.Permit:
            return limiter.acquire(target, cost, timeout=30)

        asyncio.run(replay(case, group, lambda t, c, k: limiter.try_acquire(t, c, request_class=k), acquire))


@pytest.mark.parametrize("index", range(len(CASES)), ids=[c["name"] for c in CASES])
def test_the_asyncio_limiter_behaves_as_the_table_says(server: Server, index: int) -> None:
    case, group = CASES[index], f"case-{index}"
    configure(server, group, case)

    async def run() -> None:
        async with AsyncLimiter(server.url, client_id=f"py-aio-case-{index}") as limiter:
            (await limiter.acquire(group, 0, timeout=30)).release()
            await replay(
                case,
                group,
                lambda t, c, k: limiter.try_acquire(t, c, request_class=k),
                lambda t, c: limiter.acquire(t, c, timeout=30),
            )

    asyncio.run(run())


@pytest.mark.parametrize("index", range(len(CASES)), ids=[c["name"] for c in CASES])
def test_the_embedded_limiter_behaves_as_the_table_says(index: int) -> None:
    case, group = CASES[index], f"case-{index}"
    with EmbeddedLimiter({group: case["settings"]} if "settings" in case else {}) as limiter:

        async def acquire(target: str, cost: float) -> tollgate.Permit:
            return limiter.acquire(target, cost, timeout=30)

        asyncio.run(replay(case, group, lambda t, c, k: limiter.try_acquire(t, c, request_class=k), acquire))
