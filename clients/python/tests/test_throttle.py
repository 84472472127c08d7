"""Client-side adaptive throttling, on a clock the test moves."""

from __future__ import annotations

import pytest

import tollgate


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
    [({"k": 0.5}, "k"), ({"k": float("nan")}, "k"), ({"window": 0.1}, "window"), ({"window": 1e9}, "window")],
)
def test_options_out_of_range_are_named(kwargs: dict, field: str) -> None:
    with pytest.raises(tollgate.InvalidArgument) as e:
        tollgate.ClientThrottle(**kwargs)
    assert field in str(e.value)
