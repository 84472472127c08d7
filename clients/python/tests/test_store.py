"""Store mode against a real redis-server (the one on PATH; ./scripts/test.sh installs Debian's):
processes agree on how many share a pool and each takes its floor of it per epoch, the keys
are the Rust client's, settings a controller would carry out are refused by name, and the
safe modes apply when Redis is gone."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, TypeVar

import pytest
import redis

import tollgate
from conftest import redis_server
from tollgate.store import StoreLimiter

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def eventually(what: str, done: Callable[[], bool]) -> None:
    """Waits up to a minute (a bound for a stuck test, not a timing assertion)."""
    for _ in range(1200):
        if done():
            return
        time.sleep(0.05)
    raise AssertionError(f"never happened: {what}")


def in_one_epoch(attempt: Callable[[int], T]) -> T:
    """``attempt(n)``'s result from a run that began and ended in one one-second epoch (a run
    that crossed into the next one is made again, with the next ``n``)."""
    for n in range(20):
        started = int(time.monotonic())
        result = attempt(n)
        if int(time.monotonic()) == started:
            return result
    raise AssertionError("twenty runs each crossed an epoch")


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    with redis_server(tmp_path) as url:
        yield url


def taken(limiter: StoreLimiter, group: str) -> int:
    """Units admitted one at a time until a refusal."""
    n = 0
    while True:
        try:
            limiter.try_acquire(group)
        except tollgate.Throttled:
            return n
        n += 1


def sizes(limiters: List[StoreLimiter], group: str) -> List[int]:
    return [next(g.size for g in limiter.status().groups if g.group == group) for limiter in limiters]


def shares(limiters: List[StoreLimiter], group: str) -> List[float]:
    """Each one's share this epoch (a size agreed takes effect at the next epoch)."""
    return [next(g.share for g in limiter.status().groups if g.group == group) for limiter in limiters]


def test_processes_agree_on_their_number_and_each_takes_its_floor_of_the_pool(redis_url: str) -> None:
    settings = {"ingest": {"limit": 1000}}
    a = StoreLimiter(redis_url, settings, namespace="agree", client_id="py-a")
    b = StoreLimiter(redis_url, settings, namespace="agree", client_id="py-b")
    limiters = [a, b]
    try:
        eventually("two agreed", lambda: sizes(limiters, "ingest") == [2, 2] and shares(limiters, "ingest") == [500, 500])
        # Each takes 500 in an epoch: not one more.
        assert in_one_epoch(lambda _: taken(a, "ingest")) == 500
        # A third joins: 333 each (the remainder is lost).
        c = StoreLimiter(redis_url, settings, namespace="agree", client_id="py-c")
        limiters.append(c)
        eventually("three agreed", lambda: shares(limiters, "ingest") == [333, 333, 333])
        assert sizes(limiters, "ingest") == [3, 3, 3]
        # One leaves: the other two go back to 500 each.
        limiters.pop().close()
        eventually("two again", lambda: sizes(limiters, "ingest") == [2, 2] and shares(limiters, "ingest") == [500, 500])
        # Another namespace is another pool.
        with StoreLimiter(redis_url, settings, namespace="other") as alone:
            assert sizes([alone], "ingest") == [1]
            assert alone.status().groups[0].share == 1000.0
    finally:
        for limiter in limiters:
            limiter.close()


def test_the_keys_are_the_rust_clients(redis_url: str) -> None:
    with StoreLimiter(redis_url, {"ingest": {"limit": 10}}, namespace="prod", client_id="py-keys") as limiter:
        assert limiter.sync_now()
        r = redis.Redis.from_url(redis_url, decode_responses=True)
        assert set(r.hkeys("tollgate:{prod:ingest}:heartbeat")) == {"py-keys"}
        assert r.hgetall("tollgate:{prod:ingest}:sizes") == {"py-keys": "1"}
    # Deregistered on close.
    assert r.hlen("tollgate:{prod:ingest}:heartbeat") == 0


def test_settles_drops_classes_and_groups_outside_the_settings(redis_url: str) -> None:
    settings: Dict[str, Dict[str, Any]] = {
        "api": {"limit": 10},
        "counted": {"limit": 10, "dropped": "count"},
        "tiered": {"limit": 10, "critical_reserve": 0.2},
        "dark": {"limit": 1, "shadow": True},
        "free": {},
        "default": {"limit": 5},
    }

    def run(n: int) -> List[object]:
        with StoreLimiter(redis_url, settings, namespace=f"settle-{n}") as limiter:
            permit = limiter.try_acquire("api", 4)
            permit.settle(1)  # 3 back
            more = limiter.try_acquire("api", 2)
            more.settle(5)  # 3 more taken
            dropped = limiter.try_acquire("api", 2)
            dropped.dropped()  # 2 back
            api = taken(limiter, "api")  # 10 - 1 - 5 = 4
            kept = limiter.try_acquire("counted", 6)
            kept.dropped()  # counted: not given back
            counted = taken(limiter, "counted")
            classes = []
            for cls in ("sheddable", "normal", "critical"):
                n_cls = 0
                for _ in range(20):
                    try:
                        limiter.try_acquire("tiered", request_class=cls)
                        n_cls += 1
                    except tollgate.Throttled:
                        pass
                classes.append(n_cls)
            dark = len([limiter.try_acquire("dark") for _ in range(5)])
            free = len([limiter.try_acquire("free", 1000) for _ in range(100)])
            walk_in = taken(limiter, "walk-in")  # shares default's pool
            return [api, counted, classes, dark, free, walk_in]

    assert in_one_epoch(run) == [4, 4, [4, 4, 2], 5, 100, 5]


def test_a_refusal_says_when_the_next_epoch_starts_and_acquire_waits_for_it(redis_url: str) -> None:
    with StoreLimiter(redis_url, {"api": {"limit": 2}}, namespace="wait", max_wait=0.0) as limiter:
        def spend(_: int) -> float:
            taken(limiter, "api")
            with pytest.raises(tollgate.Throttled) as refused:
                limiter.try_acquire("api")
            return refused.value.retry_after

        assert 0.0 < in_one_epoch(spend) <= 1.0
        with pytest.raises(tollgate.Throttled):
            limiter.acquire("api")  # max_wait 0: no waiting
        # Waiting up to 5 s reaches the next epoch, which has the share again.
        limiter.acquire("api", 2, timeout=5).release()


def test_settings_a_controller_would_carry_out_are_refused_by_name(redis_url: str) -> None:
    for settings, field in (
        ({"api": {"limit": 10, "burst": 5}}, "groups.api.burst"),
        ({"api": {"limit": 10, "priority": "high"}}, "groups.api.priority"),
        ({"api": {"ramp": {"min": 1, "max": 10}}}, "groups.api.ramp.duration_s"),
        ({"api": {"ramp": {"min": 20, "max": 10, "duration_s": 5}}}, "groups.api.ramp.min"),
        ({"api": {"ramp": {"min": 1, "max": 10, "duration_s": 5, "mode": "eager"}}}, "groups.api.ramp.mode"),
        ({"api": {"limit": 10, "quotas": {"fortnight": 5}}}, "groups.api.quotas.fortnight"),
        ({"api": {"limit": 10, "budget": 5}}, "groups.api.budget"),
        ({"api": {"limit": 10, "colour": "red"}}, "groups.api.colour"),
        ({"api": {"limit": -1}}, "groups.api.limit"),
        ({"api": {"limit": 1, "dropped": "lost"}}, "groups.api.dropped"),
        ({"api": {"limit": 1, "critical_reserve": 2}}, "groups.api.critical_reserve"),
    ):
        with pytest.raises(tollgate.InvalidArgument) as refused:
            StoreLimiter(redis_url, settings)
        assert refused.value.field == field, refused.value
    for kwargs, field in (
        ({"namespace": "a{b}"}, "namespace"),
        ({"safe_mode": "sometimes"}, "safe_mode"),
        ({"sync_interval": 0}, "sync_interval"),
    ):
        with pytest.raises(tollgate.InvalidArgument) as refused:
            StoreLimiter(redis_url, {}, **kwargs)
        assert refused.value.field == field, refused.value
    with pytest.raises(tollgate.InvalidArgument, match="url"):
        StoreLimiter("http://127.0.0.1:6379", {})
    with StoreLimiter(redis_url, {"api": {"limit": 10}}) as limiter:
        with pytest.raises(tollgate.InvalidArgument, match="cost"):
            limiter.try_acquire("api", -1)
        with pytest.raises(tollgate.InvalidArgument, match="group"):
            limiter.try_acquire("", 1)
        with pytest.raises(tollgate.InvalidArgument, match="request_class"):
            limiter.try_acquire("api", 1, request_class="urgent")


def test_the_safe_modes_apply_when_redis_cannot_be_reached() -> None:
    gone = f"redis://127.0.0.1:{free_port()}"
    settings = {"api": {"limit": 3}}
    quick = {"connect_timeout": 0.5, "stale_limit": 0.5}
    with StoreLimiter(gone, settings, **quick) as decay:  # type: ignore[arg-type]
        status = decay.status()
        assert status.safe_mode and not status.connected, status
        # The last agreed size (none: alone), so the whole pool.
        assert in_one_epoch(lambda _: taken(decay, "api")) == 3
    with StoreLimiter(gone, settings, safe_mode="fail_open", **quick) as open_:  # type: ignore[arg-type]
        assert all(open_.try_acquire("api") for _ in range(100))
    with StoreLimiter(gone, settings, safe_mode="fail_closed", **quick) as closed:  # type: ignore[arg-type]
        with pytest.raises(tollgate.Throttled):
            closed.try_acquire("api")


def test_safe_mode_starts_when_redis_goes_and_ends_when_it_is_back(tmp_path: Path) -> None:
    binary = shutil.which("redis-server")
    assert binary
    port = free_port()
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp_path)]
    url = f"redis://127.0.0.1:{port}"
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        eventually("redis answers", lambda: _pings(url))
        with StoreLimiter(url, {"api": {"limit": 10}}, safe_mode="fail_closed", stale_limit=0.3) as limiter:
            eventually("a sync", lambda: limiter.status().syncs > 0)
            process.kill()
            process.wait()
            eventually("safe mode", lambda: limiter.status().safe_mode)
            with pytest.raises(tollgate.Throttled):
                limiter.try_acquire("api")
            process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            eventually("safe mode over", lambda: not limiter.status().safe_mode)
            assert limiter.status().connected
            eventually("admitted again", lambda: _admits(limiter, "api"))
    finally:
        process.kill()
        process.wait()


def _pings(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url).ping())
    except redis.RedisError:
        return False


def _admits(limiter: StoreLimiter, group: str) -> bool:
    try:
        limiter.try_acquire(group)
        return True
    except tollgate.Throttled:
        return False


def test_a_quota_is_a_count_two_processes_asking_flat_out_admit_exactly_it(redis_url: str) -> None:
    settings = {"counted": {"limit": 100_000, "quotas": {"total": 300, "day": 1000}}}
    a = StoreLimiter(redis_url, settings, namespace="quota", client_id="py-qa")
    b = StoreLimiter(redis_url, settings, namespace="quota", client_id="py-qb")
    admitted = {"a": 0, "b": 0}
    try:

        def ask() -> bool:
            for name, limiter in (("a", a), ("b", b)):
                for _ in range(50):
                    try:
                        limiter.try_acquire("counted")
                        admitted[name] += 1
                    except tollgate.Throttled:
                        break
            assert admitted["a"] + admitted["b"] <= 300, admitted
            return admitted["a"] + admitted["b"] == 300

        eventually("the quota's 300, spent by the two", ask)
        # Spent: not one more, whoever asks; the refusal says to look again much later.
        for limiter in (a, b):
            with pytest.raises(tollgate.Throttled) as refused:
                limiter.acquire("counted", timeout=0.5)
            assert refused.value.retry_after > 60, refused.value
        assert admitted["a"] > 0 and admitted["b"] > 0, admitted
        # The counters are the Rust client's, by the same names.
        r = redis.Redis.from_url(redis_url, decode_responses=True)
        assert float(r.get("tollgate:{quota:counted}:q:total") or 0) == 300
        day = [k for k in r.keys("tollgate:{quota:counted}:q:day:*")]
        assert len(day) == 1 and float(r.get(day[0]) or 0) == 300, day
    finally:
        a.close()
        b.close()


def test_a_window_from_the_first_request_counts_from_it(redis_url: str) -> None:
    with StoreLimiter(redis_url, {"burst": {"quotas": {"3600s-from-first": 5}}}, namespace="first") as limiter:
        for _ in range(5):
            limiter.acquire("burst", timeout=30).release()
        with pytest.raises(tollgate.Throttled) as refused:
            limiter.acquire("burst", timeout=0.2)
        assert 3000 < refused.value.retry_after <= 3601, refused.value  # its end named to the second
        r = redis.Redis.from_url(redis_url)
        assert 0 < r.pttl("tollgate:{first:burst}:q:3600s-from-first") <= 3_600_000


def test_a_ramp_grows_the_pool_each_epoch_and_resumes_after_a_restart(redis_url: str) -> None:
    # Scheduled: 99 more units every epoch, from 10 to 1000.
    ramp = {"min": 10, "max": 1000, "duration_s": 10, "mode": "scheduled", "resume_ttl_s": 60}
    settings = {"ingest": {"ramp": ramp}}
    with StoreLimiter(redis_url, settings, namespace="ramp", client_id="py-ramp") as limiter:
        first = limiter.status().groups[0].pool
        assert first == 10, limiter.status()
        eventually("the pool grows", lambda: limiter.status().groups[0].pool > 10)
        grown = limiter.status().groups[0].pool
        assert (grown - 10) % 99 == 0, grown
        limiter.try_acquire("ingest")
    # Closed within the ramp's TTL: the next start resumes where it was, not at min.
    kept = float(redis.Redis.from_url(redis_url).get("tollgate:{ramp:ingest}:resume") or 0)
    assert kept >= grown, (kept, grown)
    with StoreLimiter(redis_url, settings, namespace="ramp", client_id="py-ramp-again") as again:
        assert again.status().groups[0].pool >= grown, again.status()
