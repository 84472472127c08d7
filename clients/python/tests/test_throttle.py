"""Client-side adaptive throttling, on a clock the test moves."""

from __future__ import annotations

import pytest

import tollgate
from conftest import Server


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_shedding_backend_is_sent_k_times_what_it_takes_then_all_once_it_recovers() -> None:
    clock = Clock()
    throttle = tollgate.ClientThrottle(clock=clock)
    sent = accepted = 0
    # Tried 200 times a second for four minutes; the backend takes 20 a second.
    for i in range(48_000):
        clock.now += 0.005
        if i % 200 == 0:
            sent = accepted = 0
        if throttle.allow():
            sent += 1
            ok = accepted < 20
            accepted += ok
            throttle.record(ok)
    assert accepted == 20
    assert 38 <= sent <= 44, sent
    for _ in range(30_000):
        clock.now += 0.005
        if throttle.allow():
            throttle.record(True)
    assert throttle.reject_probability() == 0.0
    assert throttle.allow()


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"k": 0.5}, "k"),
        ({"k": float("nan")}, "k"),
        ({"window": 0.1}, "window"),
        ({"window": 1e9}, "window"),
        ({"max_reject": 0}, "max_reject"),
        ({"max_reject": 1.5}, "max_reject"),
    ],
)
def test_options_out_of_range_are_named(kwargs: dict, field: str) -> None:
    with pytest.raises(tollgate.InvalidArgument) as e:
        tollgate.ClientThrottle(**kwargs)
    assert field in str(e.value)


def test_the_decorator_throttles_itself_while_the_backend_sheds(server: Server) -> None:
    clock = Clock()
    throttle = tollgate.ClientThrottle(clock=clock)
    with tollgate.Admin(server.url) as admin:
        admin.create_group("shed", limit=1_000_000)
    with tollgate.Limiter(server.url, max_wait=5) as limiter:
        reached = []

        @limiter.limit("shed", throttle=throttle)
        def call(ok: bool) -> None:
            reached.append(ok)
            if not ok:
                raise RuntimeError("overloaded")

        local = 0
        for _ in range(500):
            clock.now += 0.01
            try:
                call(False)
            except tollgate.RefusedLocally:
                local += 1
            except RuntimeError:
                pass
        # Refusing everything, the backend is still sent a fifth: it is how recovery is noticed.
        assert 100 <= len(reached) <= 110 and len(reached) + local == 500, len(reached)
        for _ in range(20_000):
            clock.now += 0.01
            try:
                call(True)
            except tollgate.RefusedLocally:
                pass
        assert throttle.reject_probability() == 0.0
