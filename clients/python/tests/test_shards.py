"""Groups sharded over two controllers on a real etcd (the one on PATH; ./scripts/test.sh
installs it): the client, given one controller, sends each group's part straight to its owner
once it holds the shard map, so no part is passed on between the controllers; the unit side
of the routing on its own below."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Iterator, List, Optional

import pytest

import tollgate
from conftest import Server, start
from tollgate import _routes
from tollgate.aio import AsyncLimiter
from tollgate.v1 import tollgate_pb2 as pb

SHARDS = 8


def shard_of(root: str) -> int:
    """A tree's shard as every controller computes it (FNV-1a of its root's name)."""
    h = 0xCBF29CE484222325
    for b in root.encode():
        h = ((h ^ b) * 0x100000001B3) % (1 << 64)
    return h % SHARDS


# One group in every shard, so that each controller owns some of them.
GROUPS = [next(f"tenant-{i}" for i in range(1000) if shard_of(f"tenant-{i}") == s) for s in range(SHARDS)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def eventually(what: str, done: "object") -> None:
    """Waits up to a minute (a bound for a stuck test, not a timing assertion)."""
    for _ in range(600):
        if done():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError(f"never happened: {what}")


def metric(http: str, name: str) -> Optional[float]:
    try:
        with urllib.request.urlopen(f"http://{http}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def forwarded(servers: List[Server]) -> float:
    return sum(metric(s.http, 'tollgate_shard_events_total{what="part_forwarded"}') or 0.0 for s in servers)


def straight_to_owners(servers: List[Server]) -> int:
    """The window (of 2.5 s, more than two exchange periods) in which no part was passed on
    between the controllers; up to a minute."""
    for window in range(1, 25):
        before = forwarded(servers)
        time.sleep(2.5)
        if forwarded(servers) == before:
            return window
    raise AssertionError("the client never sent its parts straight to the owners")


@pytest.fixture
def sharded(tmp_path: Path) -> Iterator[List[Server]]:
    etcd_bin = shutil.which("etcd")
    assert etcd_bin, "etcd is not on PATH: ./scripts/test.sh installs Debian's etcd-server"
    client, peer = free_port(), free_port()
    etcd = subprocess.Popen(
        [
            etcd_bin,
            "--name=py",
            f"--data-dir={tmp_path / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{client}",
            f"--advertise-client-urls=http://127.0.0.1:{client}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=py=http://127.0.0.1:{peer}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    servers: List[Server] = []
    try:
        eventually("etcd answers", lambda: healthy(f"http://127.0.0.1:{client}/health"))
        flags = ["--etcd", f"http://127.0.0.1:{client}", "--shards", str(SHARDS), "--election-lease-s", "1"]
        flags += ["--tick-ms", "100", "--lease-ms", "1000"]
        for i in range(2):
            servers.append(start(tmp_path / f"data-{i}", *flags))
        eventually(
            "every shard owned, each controller some",
            lambda: [metric(s.http, "tollgate_shards_owned") for s in servers].count(None) == 0
            and sum(metric(s.http, "tollgate_shards_owned") or 0 for s in servers) == SHARDS
            and all((metric(s.http, "tollgate_shards_owned") or 0) >= 1 for s in servers),
        )
        with tollgate.Admin(servers[0].url) as admin:
            for g in GROUPS:
                admin.create_group(g, limit=1000)
        yield servers
    finally:
        for s in servers:
            s.stop()
        etcd.kill()
        etcd.wait()


def test_a_client_sends_each_part_to_its_owner(sharded: List[Server]) -> None:
    with tollgate.Limiter(sharded[0].url, client_id="py-routed") as limiter:
        for g in GROUPS:
            limiter.acquire(g, timeout=10).release()
        # The first exchanges went whole to the controller given, which passed parts on.
        assert forwarded(sharded) > 0
        # The client learnt every group's shard, as the controllers compute it.
        assert {g: limiter._routes._shards.get(g) for g in GROUPS} == {g: shard_of(g) for g in GROUPS}
        straight_to_owners(sharded)
        # And every group is still granted by its owner.
        for g in GROUPS:
            limiter.acquire(g, timeout=5).release()
        status = limiter.status()
        assert status.connected and not status.safe_mode, status


def test_an_async_client_sends_each_part_to_its_owner(sharded: List[Server]) -> None:
    async def run() -> None:
        async with AsyncLimiter(sharded[1].url, client_id="py-routed-aio") as limiter:
            for g in GROUPS:
                (await limiter.acquire(g, timeout=10)).release()
            window = await asyncio.get_running_loop().run_in_executor(None, straight_to_owners, sharded)
            assert window >= 1
            for g in GROUPS:
                (await limiter.acquire(g, timeout=5)).release()

    asyncio.run(run())


def test_given_every_controller_a_client_moves_on_when_its_own_is_killed(sharded: List[Server]) -> None:
    both = ",".join(s.url for s in sharded)
    with tollgate.Limiter(both, client_id="py-moves") as limiter:
        for g in GROUPS:
            limiter.acquire(g, timeout=10).release()
        sharded[0].stop()
        # The survivor takes the killed one's shards; the client talks to it from then on, and
        # a group it never asked for before is granted at once.
        for g in GROUPS + ["new-after-the-kill"]:
            limiter.acquire(g, timeout=30).release()
        assert limiter._current == 1
        status = limiter.status()
        assert status.connected and not status.safe_mode, status


def test_given_every_controller_an_async_client_moves_on_when_its_own_is_killed(sharded: List[Server]) -> None:
    async def run() -> None:
        both = ",".join(s.url for s in sharded)
        async with AsyncLimiter(both, client_id="py-moves-aio") as limiter:
            for g in GROUPS:
                (await limiter.acquire(g, timeout=10)).release()
            sharded[0].stop()
            for g in GROUPS + ["new-after-the-kill"]:
                (await limiter.acquire(g, timeout=30)).release()
            assert limiter._current == 1
            assert not limiter.status().safe_mode

    asyncio.run(run())


def test_controller_addresses_are_checked_when_the_limiter_is_made() -> None:
    for bad in ["http://127.0.0.1:1,,http://127.0.0.1:2", ",".join(["http://127.0.0.1:1"] * 17), ""]:
        with pytest.raises(tollgate.InvalidArgument, match="url"):
            tollgate.Limiter(bad)
        with pytest.raises(tollgate.InvalidArgument, match="url"):
            AsyncLimiter(bad)


def test_a_failed_controller_is_followed_by_the_next_at_once_then_the_rounds_back_off() -> None:
    from tollgate._core import BACKOFF_MIN_S, Core

    core = Core(client_id="c", safe_mode="fail_open", max_wait=0, exchange_period=None, cost_model=None)
    core.round_done(10.0, None, "the first is down", untried=True)
    assert (core.due, core.safe_mode, core.last_error) == (10.0, False, "the first is down")
    core.round_done(10.0, None, "every one is down")
    assert (core.due, core.safe_mode) == (10.0 + BACKOFF_MIN_S, True)


def test_routes_follow_the_newest_map_and_each_groups_shard() -> None:
    routes = _routes.Routes()
    request = pb.ExchangeRequest(client_id="c", sequence=3, groups=[pb.GroupUsage(group=g) for g in "abc"])
    routes.prepare(request)
    assert (request.sequence, request.shard_map_epoch) == (6, 0)
    # Nothing known yet: the request goes whole to the controller given.
    assert routes.split(request) is None
    members = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    routes.learn(
        pb.ExchangeResponse(
            grants=[pb.Grant(group="a", shard=0), pb.Grant(group="b", shard=1), pb.Grant(group="c", shard=0)],
            shard_map=pb.ShardMap(epoch=3, shards=2, members=members, owners=[2, 1]),
        )
    )
    parts = routes.split(request)
    assert parts is not None
    assert [(o, [g.group for g in p.groups]) for o, p in parts] == [(members[1], ["a", "c"]), (members[0], ["b"])]
    assert all(p.sequence == 6 and p.client_id == "c" for _, p in parts)
    # An older map changes nothing; a malformed one is ignored; an unowned shard sends it whole.
    routes.learn(pb.ExchangeResponse(shard_map=pb.ShardMap(epoch=2, shards=2, members=members, owners=[0, 0])))
    routes.learn(pb.ExchangeResponse(shard_map=pb.ShardMap(epoch=9, shards=2, members=members, owners=[3, 1])))
    assert routes.epoch == 3
    routes.learn(pb.ExchangeResponse(shard_map=pb.ShardMap(epoch=4, shards=2, members=members, owners=[0, 1])))
    assert routes.split(request) is None
    # An owner that fails: the map is dropped and the next exchanges go whole.
    routes.learn(pb.ExchangeResponse(shard_map=pb.ShardMap(epoch=5, shards=2, members=members, owners=[1, 2])))
    routes.forget_map()
    assert routes.epoch == 0
    routes.learn(pb.ExchangeResponse(shard_map=pb.ShardMap(epoch=5, shards=2, members=members, owners=[1, 2])))
    assert [routes.split(request) for _ in range(_routes.PAUSE_MIN)] == [None] * _routes.PAUSE_MIN
    assert routes.split(request) is not None
    retry = _routes.retry_of(request, [request.groups[1]])
    assert (retry.sequence, retry.shard_map_epoch, [g.group for g in retry.groups]) == (7, 0, ["b"])
