"""The remote limiter against a real server: grants, refusals, waiting, settling, safe mode."""

from __future__ import annotations

import time
from typing import Callable

import pytest

import tollgate
from conftest import Server, start


def eventually(what: str, done: Callable[[], bool], within: float = 30.0) -> None:
    """Polls ``done`` (a bound for a stuck test, not a timing assertion)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if done():
            return
        time.sleep(0.02)
    raise AssertionError(f"never happened: {what}")


def first_grant(limiter: tollgate.Limiter, group: str) -> None:
    def granted() -> bool:
        try:
            limiter.try_acquire(group, 0).settle(0)
            return True
        except tollgate.Throttled:
            return False

    eventually(f"the first grant for {group}", granted)


def test_a_group_is_held_to_its_grant_and_refusals_say_when_to_retry(server: Server) -> None:
    with tollgate.Admin(server.url) as admin:
        # One unit per 100 s after a burst of 10: what is admitted does not depend on speed.
        admin.create_group("slow", limit=0.01, burst=10)
    with tollgate.Limiter(server.url, client_id="py-1") as limiter:
        first_grant(limiter, "slow")
        admitted = 0
        refusal = None
        for _ in range(15):
            try:
                limiter.try_acquire("slow")
                admitted += 1
            except tollgate.Throttled as t:
                refusal = t
        assert admitted == 10
        assert refusal is not None and refusal.group == "slow" and refusal.retry_after > 1
        # Settling with less gives the difference back; a dropped permit gives all of it.
        with pytest.raises(tollgate.Throttled):
            limiter.try_acquire("slow", 2)
        stats = limiter.stats("slow")
        assert stats is not None and stats.admitted_units == 10.0 and stats.throttled >= 5
        assert limiter.status().connected


def test_a_group_in_shadow_mode_is_never_refused_and_counts_what_it_would_refuse(server: Server) -> None:
    with tollgate.Admin(server.url) as admin:
        admin.create_group("dark", limit=0.01, burst=10, shadow=True)
    with tollgate.Limiter(server.url, client_id="py-shadow") as limiter:
        first_grant(limiter, "dark")
        before = limiter.stats("dark")
        for _ in range(15):
            limiter.try_acquire("dark")
        stats = limiter.stats("dark")
        assert before is not None and stats is not None
        # The bucket held 10: the other 5 would have been refused, and are admitted all the same.
        moved = (stats.admitted - before.admitted, stats.throttled - before.throttled, stats.would_refuse)
        assert moved == (15, 0, 5), stats
        with tollgate.Admin(server.url) as admin:

            def counted() -> bool:
                dark = [g for g in admin.status().groups if g.name == "dark"]
                return bool(dark) and dark[0].would_refuse_total == 5

            eventually("the server counts them", counted)


def test_request_classes_shed_sheddable_work_first_and_keep_a_reserve_for_critical_work(server: Server) -> None:
    with tollgate.Admin(server.url) as admin:
        # A burst of 10 and almost no refill; a fifth of it kept for critical work.
        admin.create_group("tiered", limit=0.01, burst=10, critical_reserve=0.2)
    with tollgate.Limiter(server.url, client_id="py-classes") as limiter:
        first_grant(limiter, "tiered")

        def taken(request_class: str) -> int:
            n = 0
            for _ in range(20):
                try:
                    limiter.try_acquire("tiered", request_class=request_class)
                    n += 1
                except tollgate.Throttled:
                    pass
            return n

        # Sheddable work leaves 6 of the 10 (0.2 + 0.8 / 2), normal work 2, critical none.
        assert [taken("sheddable"), taken("normal"), taken("critical")] == [4, 4, 2]
        with pytest.raises(tollgate.InvalidArgument, match="request_class"):
            limiter.try_acquire("tiered", request_class="urgent")


def test_two_limiters_share_an_in_flight_quota_and_permits_give_their_slots_back(server: Server) -> None:
    with tollgate.Admin(server.url) as admin:
        admin.create_group("slots", max_in_flight=10)
        assert admin.get_group("slots").max_in_flight == 10
        admin.create_group("slots/eu", parent="slots")
        assert admin.get_group("slots/eu").parent == "slots"
        with pytest.raises(tollgate.InvalidArgument, match="parent"):
            admin.alter_group("slots", parent="slots/eu")
        admin.drop_group("slots/eu")
        with pytest.raises(tollgate.InvalidArgument, match="max_in_flight"):
            admin.alter_group("slots", max_in_flight=0)
    with tollgate.Limiter(server.url, client_id="py-slots-a") as a, tollgate.Limiter(
        server.url, client_id="py-slots-b"
    ) as b:
        held: dict = {"a": [], "b": []}

        def fill() -> bool:
            # Each client's oldest request finishes, and it asks for more than the quota.
            for name, limiter in (("a", a), ("b", b)):
                if held[name]:
                    held[name].pop(0).settle(1)
                for _ in range(12):
                    try:
                        held[name].append(limiter.try_acquire("slots"))
                    except tollgate.Throttled:
                        break
            total = len(held["a"]) + len(held["b"])
            assert total <= 10, held
            return len(held["a"]) >= 4 and len(held["b"]) >= 4

        eventually("the two clients share the ten slots", fill)
        stats = a.stats("slots")
        assert stats is not None and stats.in_flight == len(held["a"]) and stats.in_flight_share is not None
        # A slot comes back however a permit ends: settled, dropped, a with block, collected.
        held["a"].pop().dropped()
        with held["a"].pop():
            pass
        held["a"].pop()
        assert a.stats("slots").in_flight == len(held["a"])  # type: ignore[union-attr]


def test_a_quota_is_a_count_two_limiters_asking_flat_out_admit_exactly_it(server: Server) -> None:
    with tollgate.Admin(server.url) as admin:
        admin.create_group("counted", budget=300)
        admin.create_group("windows", quotas={"90s": 40, "60s-from-first": 30})
        assert admin.get_group("windows").quotas == {"90s": 40.0, "60s-from-first": 30.0}
        with pytest.raises(tollgate.InvalidArgument, match="quotas.fortnight"):
            admin.alter_group("windows", quotas={"fortnight": 5})
    with tollgate.Limiter(server.url, client_id="py-count-a") as a, tollgate.Limiter(
        server.url, client_id="py-count-b"
    ) as b:
        admitted = {"a": 0, "b": 0}

        def ask() -> bool:
            for name, limiter in (("a", a), ("b", b)):
                for _ in range(20):
                    try:
                        limiter.try_acquire("counted")
                        admitted[name] += 1
                    except tollgate.Throttled:
                        break
            assert admitted["a"] + admitted["b"] <= 300, admitted
            return admitted["a"] + admitted["b"] == 300

        eventually("the budget's 300, spent by the two", ask)
        # Spent: not one more, whoever asks.
        for limiter in (a, b):
            with pytest.raises(tollgate.Throttled):
                limiter.try_acquire("counted")
        assert admitted["a"] > 0 and admitted["b"] > 0, admitted


def test_settle_acquire_context_manager_and_decorator(server: Server) -> None:
    with tollgate.Admin(server.url) as admin:
        admin.create_group("api", limit=0.01, burst=5)
    with tollgate.Limiter(server.url, max_wait=0.2) as limiter:
        first_grant(limiter, "api")
        with limiter.acquire("api", 4) as permit:
            permit.settle(1)  # the request turned out cheaper: 3 units go back
        permit = limiter.try_acquire("api", 3)
        permit.dropped()  # never done: all 3 go back
        calls = []

        @limiter.limit("api", cost=2)
        def handle(x: int) -> int:
            calls.append(x)
            return x * 2

        assert handle(1) == 2 and handle(2) == 4
        with pytest.raises(tollgate.Throttled):
            handle(3)  # 4 of 5 units used; waiting 0.2 s cannot bring 2 more at 0.01/s
        assert calls == [1, 2]
        with pytest.raises(ValueError, match="cost"):
            limiter.try_acquire("api", -1)
        with pytest.raises(ValueError, match="group"):
            limiter.try_acquire("", 1)


def test_two_limiters_share_one_group(server: Server) -> None:
    with tollgate.Admin(server.url) as admin:
        admin.create_group("shared", limit=1000)
    with tollgate.Limiter(server.url, client_id="a") as a, tollgate.Limiter(server.url, client_id="b") as b:
        for limiter in (a, b):
            first_grant(limiter, "shared")

        def split() -> bool:
            for limiter in (a, b):
                try:
                    limiter.try_acquire("shared", 0)
                except tollgate.Throttled:
                    pass
            sa, sb = a.stats("shared"), b.stats("shared")
            return sa is not None and sb is not None and sa.rate + sb.rate <= 1000.0 + 1e-6 and sa.rate < 1000.0

        eventually("the two clients share the limit", split)


@pytest.mark.parametrize("policy", ["decay", "fail_open", "fail_closed"])
def test_safe_mode_after_the_lease(tmp_path, policy: str) -> None:  # type: ignore[no-untyped-def]
    server = start(tmp_path / "data", "--tick-ms", "100", "--lease-ms", "500")
    try:
        with tollgate.Admin(server.url) as admin:
            admin.create_group("g", limit=100000)
        limiter = tollgate.Limiter(server.url, safe_mode=policy)
        first_grant(limiter, "g")
        server.stop()
        eventually("safe mode", lambda: limiter.status().safe_mode)
        assert not limiter.status().connected and limiter.status().last_error
        results = []
        for _ in range(5):
            try:
                limiter.try_acquire("g")
                results.append(True)
            except tollgate.Throttled:
                results.append(False)
        if policy == "fail_closed":
            assert not any(results)
        else:
            assert all(results)
        limiter.close()
    finally:
        server.stop()


@pytest.mark.parametrize("policy", ["decay", "fail_open", "fail_closed"])
def test_safe_mode_from_a_cold_start(policy: str) -> None:
    """No server ever reached: the policy applies from the first failed exchange (fail_open
    admits new groups too), as the Rust client does."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # Nothing listens on the port once the socket is closed.
    with tollgate.Limiter(f"http://127.0.0.1:{port}", safe_mode=policy, exchange_timeout=0.5) as limiter:
        eventually("safe mode", lambda: limiter.status().safe_mode)
        assert not limiter.status().connected and limiter.status().last_error
        results = []
        for i in range(5):
            try:
                limiter.try_acquire(f"new-{i}")
                results.append(True)
            except tollgate.Throttled:
                results.append(False)
        assert all(results) if policy == "fail_open" else not any(results), results


def test_a_new_group_is_admitted_at_once_under_a_capacity(server: Server) -> None:
    """A tick has shared the whole capacity out to a steady group: new groups are still
    admitted by their first grant, with a wait far shorter than the server's tick (1 s)."""
    with tollgate.Admin(server.url) as admin:
        admin.set_capacity(1000)
        with tollgate.Limiter(server.url, client_id="py-steady", max_wait=0.6) as limiter:
            first_grant(limiter, "steady")

            def ticked() -> bool:
                steady = admin.status().group("steady")
                return steady is not None and steady.target is not None

            eventually("a tick gives the steady group the capacity", ticked)
            for i in range(20):
                limiter.acquire(f"new-{i}").settle(1)


def test_bad_options_are_named() -> None:
    with pytest.raises(ValueError, match="safe_mode"):
        tollgate.Limiter("http://127.0.0.1:1", safe_mode="panic")
    with pytest.raises(ValueError, match="token"):
        tollgate.Limiter("http://127.0.0.1:1", token="has space")
    with pytest.raises(ValueError, match="https"):
        tollgate.Limiter("http://127.0.0.1:1", ca_file="ca.pem")


def test_a_client_past_one_exchanges_bound_reports_its_groups_in_pages(server: Server) -> None:
    """2,500 groups: more than one exchange carries (the server refuses past 1,000). The
    limiter reports them over a round of pages, so each is granted and it never goes into
    safe mode."""
    with tollgate.Limiter(server.url, client_id="py-many", max_wait=5.0) as limiter:
        names = [f"many-{i}" for i in range(2500)]
        for name in names:
            try:
                limiter.try_acquire(name, 1).settle(1)
            except tollgate.Throttled:
                pass

        def all_granted() -> bool:
            return all((s := limiter.stats(n)) is not None and s.available > 0 for n in names)

        eventually("every group granted", all_granted)
        status = limiter.status()
        assert status.connected and not status.safe_mode, status


def test_unthrottled_work_usage_pricing_and_dropped_work(server: Server) -> None:
    with tollgate.Admin(server.url) as admin:
        admin.create_group("sys", limit=0.01, burst=2)
        admin.create_group("kept", limit=0.01, burst=10, dropped="count")
        model = tollgate.CostModel.ru()
        with tollgate.Limiter(server.url, client_id="py-parity", cost_model=model) as limiter:
            first_grant(limiter, "sys")
            first_grant(limiter, "kept")
            # The unthrottled handle is admitted past the bucket (the server allows it: no
            # --auth), and charged to the group all the same.
            system = limiter.unthrottled()
            assert system.is_unthrottled and not limiter.is_unthrottled
            assert limiter.status().unthrottled_allowed
            for _ in range(5):
                system.try_acquire("sys", 1)
            with pytest.raises(tollgate.Throttled):
                limiter.try_acquire("sys", 1)
            stats = limiter.stats("sys")
            assert stats is not None and stats.unthrottled_units == 5 and stats.available < 0

            # Usage priced by the model: a read is admitted at what a read of nothing costs,
            # then settled with what it did; the detail reaches the server.
            permit = limiter.try_acquire_usage("kept", tollgate.Usage.read())
            assert permit.cost == pytest.approx(0.475)
            permit.settle_usage(tollgate.Usage.read(65_536, cpu_ms=6))
            stats = limiter.stats("kept")
            assert stats is not None and stats.consumed_units == pytest.approx(3.475)

            def detail_reported() -> bool:
                kept = admin.status().group("kept")
                return kept is not None and kept.detail is not None and kept.detail["read_rpcs"] == 1

            eventually("the detail reaches the server", detail_reported)
            kept = admin.status().group("kept")
            assert kept is not None and kept.detail is not None and kept.detail["rru"] == pytest.approx(3.475)

            # Dropped work: counted, and kept as consumed by the group's setting.
            limiter.try_acquire("kept", 2).dropped()
            stats = limiter.stats("kept")
            assert stats is not None and (stats.dropped, stats.dropped_units) == (1, 2.0)
            assert stats.consumed_units == pytest.approx(5.475)
            with pytest.raises(RuntimeError, match="settled already"):
                permit.settle(1)


def test_a_waiting_request_is_asked_once(server: Server) -> None:
    """Demand counts each request once however long it waits: ten refused tries inside one
    acquire are one refusal, not ten."""
    with tollgate.Admin(server.url) as admin:
        admin.create_group("once", limit=0.01, burst=1)
    with tollgate.Limiter(server.url, max_wait=0.3) as limiter:
        first_grant(limiter, "once")
        limiter.try_acquire("once", 1)
        g = limiter._core.groups["once"]
        before = g.counts.copy()
        with pytest.raises(tollgate.Throttled):
            limiter.acquire("once", 1)
        assert g.counts.throttled - before.throttled == 1
        assert g.counts.asked - before.asked == 1.0 and g.waiting == 0
