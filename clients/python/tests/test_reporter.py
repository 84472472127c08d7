"""A backend's reporter against a real server: its reports reach the controller with the
backend's health and busiest groups, the soft limits come back (pulled and pushed), bad
arguments name their field, and the asyncio form does the same."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Dict, List

import pytest

import tollgate
from conftest import Server
from tollgate.reporter import fold_window


class Clock:
    """Time that moves only when told: the reports' windows are exact."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def backend(server: Server, name: str) -> tollgate.BackendStatus:
    with tollgate.Admin(server.url) as admin:
        found = [b for b in admin.status().backend_detail if b.name == name]
    assert len(found) == 1, found
    return found[0]


def test_a_steady_load_settles_on_its_rate_and_a_stopped_one_is_forgotten() -> None:
    for window, folding in [(1.0, 1.0), (0.25, 1.0), (2.0, 0.5)]:
        rates: Dict[str, float] = {}
        for _ in range(int(200 / window)):
            fold_window(rates, {"g": 500.0 * window}, window, folding)
        assert math.isclose(rates["g"], 500.0, rel_tol=1e-6), (window, folding, rates)
    for _ in range(60):
        fold_window(rates, {}, 1.0, 1.0)
    assert rates == {}


def test_a_report_reaches_the_controller_with_the_load_and_the_utilisation(server: Server) -> None:
    clock = Clock()
    with tollgate.Reporter(server.url, "kv-1", "zone-a", capacity=1000.0, interval=None, clock=clock) as reporter:
        reporter.record("acme", 600)
        reporter.record("globex", 100)
        reporter.record("globex", 50)
        clock.now += 1.0
        assert reporter.report_now() == []
    seen = backend(server, "kv-1")
    share = 1.0 - math.exp(-1.0)  # one window as long as the folding time
    assert seen.zone == "zone-a"
    assert math.isclose(seen.utilisation, 750 * share / 1000.0, rel_tol=1e-9), seen
    assert [g for g, _ in seen.top_groups] == ["acme", "globex"]
    assert math.isclose(seen.top_groups[0][1], 600 * share, rel_tol=1e-9), seen


def test_each_report_is_answered_with_what_the_other_backends_serve(server: Server) -> None:
    clock = Clock()
    share = 1.0 - math.exp(-1.0)
    with tollgate.Reporter(server.url, "fan-1", capacity=1000.0, interval=None, clock=clock) as one, tollgate.Reporter(
        server.url, "fan-2", capacity=1000.0, interval=None, clock=clock
    ) as two:
        one.record("fan-spread", 600)
        one.record("fan-own", 100)
        two.record("fan-spread", 300)
        clock.now += 1.0
        one.report_now()
        assert one.elsewhere() == {}, "no other backend serves them yet"
        two.report_now()
        elsewhere = two.elsewhere()
        assert list(elsewhere) == ["fan-spread"], elsewhere
        assert math.isclose(elsewhere["fan-spread"], 600 * share, rel_tol=1e-9), elsewhere
        # A group with a limit gets its share of it where its load lands (150 × 30 ÷ 90), and
        # may be lent up to its limit less what the other backend serves of it.
        with tollgate.Admin(server.url) as admin:
            admin.create_group("fan-limited", limit=150)
        one.record("fan-limited", 60)
        two.record("fan-limited", 30)
        clock.now += 1.0
        one.report_now()
        two.report_now()
        held = two.shares()["fan-limited"]
        assert math.isclose(held.units_per_s, 50.0, rel_tol=1e-6), held
        assert math.isclose(held.ceiling, 150 - 60 * share, rel_tol=1e-6), held
        assert math.isclose(held.part, 50 / 1000.0, rel_tol=1e-9), "its capacity of 1,000 said"


def test_a_health_function_reports_queue_bytes_and_top_k_keeps_the_busiest(server: Server) -> None:
    clock = Clock()
    health = lambda: tollgate.QueueBytes(2e8)  # noqa: E731
    with tollgate.Reporter(server.url, "kv-2", health=health, top_k=2, threshold=5.0, interval=None, clock=clock) as reporter:
        for group, units in [("a", 30), ("b", 20), ("c", 10), ("quiet", 1)]:
            reporter.record(group, units)
        clock.now += 1.0
        reporter.report_now()
    seen = backend(server, "kv-2")
    assert [g for g, _ in seen.top_groups] == ["a", "b"], seen
    # A queue at a quarter of the controller's 800e6 target.
    assert math.isclose(seen.utilisation, 0.25, rel_tol=1e-6), seen


def test_loads_the_controller_refuses_come_back_by_index(server: Server) -> None:
    clock = Clock()
    with tollgate.Reporter(server.url, "kv-3", capacity=100.0, interval=None, clock=clock) as reporter:
        reporter.record("fine", 10)
        reporter.record("bad\nname", 5)  # a control character: not a name
        clock.now += 1.0
        rejected = reporter.report_now()
    assert len(rejected) == 1 and rejected[0].startswith("loads[1].group"), rejected
    assert [g for g, _ in backend(server, "kv-3").top_groups] == ["fine"]


def test_the_soft_limits_come_back_pulled_and_then_pushed(server: Server) -> None:
    with tollgate.Admin(server.url) as admin:
        admin.create_group("acme", limit=1000, backend_limit=250)
        admin.create_group("globex", limit=1000)
        with tollgate.Reporter(server.url, "kv-4", capacity=100.0, interval=None) as pulled:
            assert pulled.settings_version == 0 and pulled.soft_limits() == {}
            pulled.refresh_settings()
            assert pulled.soft_limits() == {"acme": 250.0}
            version = pulled.settings_version
            assert version != 0
            pulled.refresh_settings()  # unchanged: what is held stays
            assert (pulled.soft_limits(), pulled.settings_version) == ({"acme": 250.0}, version)
        # In the background: the first set pulled at start, a change pushed within moments
        # (a pull only every minute here).
        with tollgate.Reporter(server.url, "kv-5", capacity=100.0, interval=0.05, check_interval=60.0) as watching:
            until(lambda: watching.soft_limits() == {"acme": 250.0})
            admin.alter_group("globex", backend_limit=40)
            until(lambda: watching.soft_limits() == {"acme": 250.0, "globex": 40.0})
            # Its own reports go on meanwhile.
            watching.record("acme", 5)
            until(lambda: any(b.name == "kv-5" for b in admin.status().backend_detail))


def until(condition: "object") -> None:
    """Waits for a condition the server's pushes make true, failing after 30 s."""
    deadline = time.monotonic() + 30
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "never came true"
        time.sleep(0.02)


def test_bad_arguments_name_their_field(server: Server) -> None:
    bad: List[Dict[str, object]] = [
        {"backend_id": ""},
        {"backend_id": "x" * 256},
        {"top_k": 0},
        {"top_k": 10_001},
        {"threshold": -1.0},
        {"smoothing": 0.0},
        {"capacity": -5.0},
        {"capacity": None},  # and no health function
        {"interval": math.nan},
    ]
    for args in bad:
        kwargs: Dict[str, object] = {"backend_id": "kv", "capacity": 10.0, "interval": None, **args}
        field = next(iter(args)) if args != {"capacity": None} else "health"
        with pytest.raises(tollgate.InvalidArgument) as e:
            tollgate.Reporter(server.url, **kwargs)  # type: ignore[arg-type]
        assert e.value.field == field, (args, e.value)
    with tollgate.Reporter(server.url, "kv", capacity=10.0, interval=None) as reporter:
        for group, units, field in [("", 1.0, "group"), ("g", math.nan, "units"), ("g", -1.0, "units")]:
            with pytest.raises(tollgate.InvalidArgument) as e:
                reporter.record(group, units)
            assert e.value.field == field


def test_the_asyncio_reporter_reports_and_hears_the_soft_limits(server: Server) -> None:
    with tollgate.Admin(server.url) as admin:
        admin.create_group("initech", limit=1000, backend_limit=75)

    async def main() -> None:
        clock = Clock()
        async with tollgate.AsyncReporter(server.url, "kv-aio", "zone-b", capacity=200.0, interval=None, clock=clock) as r:
            r.record("initech", 100)
            clock.now += 1.0
            assert await r.report_now() == []
            await r.refresh_settings()
            assert r.soft_limits() == {"initech": 75.0}
        # In the background, as a service runs it.
        async with tollgate.AsyncReporter(server.url, "kv-aio-2", capacity=200.0, interval=0.05) as r:
            r.record("initech", 10)
            for _ in range(1500):
                if r.soft_limits() and backend_seen("kv-aio-2"):
                    break
                await asyncio.sleep(0.02)
            assert r.soft_limits() == {"initech": 75.0}

    def backend_seen(name: str) -> bool:
        with tollgate.Admin(server.url) as admin:
            return any(b.name == name for b in admin.status().backend_detail)

    asyncio.run(main())
    seen = backend(server, "kv-aio")
    assert seen.zone == "zone-b"
    assert math.isclose(seen.utilisation, 100 * (1 - math.exp(-1.0)) / 200.0, rel_tol=1e-9), seen
