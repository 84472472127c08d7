"""The embedded limiter, with no server: a group is served at its first call, settings that need
a controller's engine are refused by name, and quotas per window are counts across windows
(the windows' bounds as the Rust model computes them; the allotments on a clock given here).
The behaviour table (test_behaviour_cases.py) runs against it too."""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Tuple

import pytest

import tollgate
from tollgate._local import Window
from tollgate.embedded import EmbeddedLimiter, _Quotas
from tollgate.v1 import tollgate_pb2 as pb

MONDAY = 1_795_395_723_456  # 2026-11-23T01:02:03.456Z, a Monday


def test_the_windows_start_and_end_where_the_rust_model_says() -> None:
    assert Window("q", "minute").end(MONDAY) == 1_795_395_780_000
    assert Window("q", "day").start(MONDAY) == 1_795_392_000_000
    assert Window("q", "week").start(MONDAY) == 1_795_392_000_000
    assert Window("q", "week").end(MONDAY) == 1_795_996_800_000
    assert Window("q", "month").start(MONDAY) == 1_793_491_200_000
    assert Window("q", "month").end(MONDAY) == 1_796_083_200_000
    assert Window("q", "total").end(MONDAY) is None and Window("q", "total").start(MONDAY) == 0
    assert Window("q", "90s").start(MONDAY) == MONDAY // 90_000 * 90_000
    # December's end is the next year's January.
    assert Window("q", "month").end(1_796_083_200_000) == 1_798_761_600_000


def test_a_quota_counts_across_windows_and_its_allotments_never_pass_it() -> None:
    minute, hour = Window("q", "minute"), Window("q", "hour")
    quotas = _Quotas([(minute, 10.0), (hour, 15.0)])
    t0 = Window("q", "hour").start(MONDAY) + 5_000  # early in an hour and its first minute
    first = quotas.allot(None, 5.0, t0)
    assert (first.add, first.left, first.ends_in_ms) == (10.0, 0.0, 55_000)
    # All 10 used: the minute's quota is spent until the minute ends.
    spent = quotas.allot(pb.QuotaHeld(window=first.window, given=10, used=10), 5.0, t0 + 1_000)
    assert (spent.add, spent.left, spent.reset_in_ms) == (0.0, 0.0, 54_000)
    # The next minute: its own 10, but the hour has only 5 left.
    t1 = t0 + 60_000
    fresh = quotas.allot(pb.QuotaHeld(window=first.window, given=10, used=10), 5.0, t1)
    assert fresh.window == minute.start(t1) and (fresh.add, fresh.left) == (5.0, 0.0)
    # An allotment held beyond what is used is given back by the report, and allotted again.
    back = quotas.allot(pb.QuotaHeld(window=fresh.window, given=2, used=1), 0.1, t1 + 1_000)
    assert (back.add, back.left) == (0.0, 3.0)


def test_a_group_is_served_at_its_first_call_and_names_outside_the_settings_take_default() -> None:
    with EmbeddedLimiter({"api": {"limit": 0.01, "burst": 3}, "default": {"limit": 0.01, "burst": 2}}) as limiter:
        assert [limiter.try_acquire("api").cost for _ in range(3)] == [1.0, 1.0, 1.0]
        with pytest.raises(tollgate.Throttled) as refused:
            limiter.try_acquire("api")
        assert refused.value.retry_after > 10  # a unit per 100 s
        for name in ("walk-in", "another"):
            limiter.try_acquire(name, 2)
            with pytest.raises(tollgate.Throttled):
                limiter.try_acquire(name)
        stats = limiter.stats("api")
        assert stats is not None and stats.admitted == 3 and stats.throttled == 1, stats
    with EmbeddedLimiter({}) as free:
        assert len([free.try_acquire("anyone", 1e9) for _ in range(100)]) == 100


def test_threads_admit_exactly_the_burst() -> None:
    with EmbeddedLimiter({"api": {"limit": 0.001, "burst": 500}}) as limiter:
        admitted: List[int] = []

        def ask() -> None:
            n = 0
            for _ in range(400):
                try:
                    limiter.try_acquire("api")
                    n += 1
                except tollgate.Throttled:
                    pass
            admitted.append(n)

        threads = [threading.Thread(target=ask) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sum(admitted) == 500, admitted


def test_settings_that_need_the_engine_are_refused_by_name() -> None:
    cases: List[Tuple[Dict[str, Any], str]] = [
        ({"reserved": 5}, "groups.g.reserved"),
        ({"priority": "high"}, "groups.g.priority"),
        ({"parent": "p"}, "groups.g.parent"),
        ({"ramp": {"min": 1, "max": 2}}, "groups.g.ramp"),
        ({"budget": 5}, "groups.g.budget"),
        ({"colour": "red"}, "groups.g.colour"),
        ({"limit": -1}, "groups.g.limit"),
        ({"burst": "lots"}, "groups.g.burst"),
        ({"max_in_flight": 0}, "groups.g.max_in_flight"),
        ({"quotas": {"fortnight": 5}}, "groups.g.quotas.fortnight"),
        ({"quotas": {"60s-from-first": 5}}, "groups.g.quotas.60s-from-first"),
        ({"quotas": {"day": -5}}, "groups.g.quotas.day"),
    ]
    for settings, field in cases:
        with pytest.raises(tollgate.InvalidArgument) as refused:
            EmbeddedLimiter({"g": settings})
        assert refused.value.field == field, (settings, refused.value)
    with pytest.raises(tollgate.InvalidArgument, match="group"):
        EmbeddedLimiter({"": {"limit": 1}})
    with EmbeddedLimiter({"g": {"limit": 1}}) as limiter:
        with pytest.raises(tollgate.InvalidArgument, match="cost"):
            limiter.try_acquire("g", -1)
