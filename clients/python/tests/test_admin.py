"""The admin calls against a real server."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

import tollgate
from conftest import Server, start


def test_groups_round_trip_and_errors_name_the_field(server: Server) -> None:
    with tollgate.Admin(server.url) as admin:
        made = admin.create_group("checkout", limit=500, priority="high", reserved=100)
        assert (made.limit, made.priority, made.reserved) == (500.0, "high", 100.0)
        with pytest.raises(tollgate.AlreadyExists):
            admin.create_group("checkout")
        changed = admin.alter_group("checkout", burst=50, dropped="count")
        assert (changed.burst, changed.dropped, changed.limit) == (50.0, "count", 500.0)
        admin.put_group("batch", limit="unlimited", weight=2)
        assert [g.name for g in admin.list_groups()] == ["batch", "checkout"]
        assert admin.get_group("batch").limit is None
        with pytest.raises(tollgate.InvalidArgument) as bad:
            admin.alter_group("checkout", reserved=900)
        assert "reserved: must not exceed limit" in bad.value.message
        assert bad.value.field == "reserved" and bad.value.rule is not None and bad.value.rule.startswith("must not exceed")
        with pytest.raises(tollgate.InvalidArgument, match="colour: unknown setting") as unknown:
            admin.alter_group("checkout", colour="red")
        assert unknown.value.field == "colour"
        with pytest.raises(tollgate.InvalidArgument) as wrong_type:
            admin.alter_group("checkout", limit="lots")
        assert wrong_type.value.field == "limit" and "number" in (wrong_type.value.rule or "")
        assert admin.get_group("checkout").limit == 500.0
        with pytest.raises(tollgate.NotFound):
            admin.get_group("ghost")
        assert admin.put_group("billed", budget=1000, budget_period="month").budget_period == "month"
        g = admin.put_group("billed", quotas={"minute": 10, "day": 500})
        assert g.quotas == {"minute": 10.0, "day": 500.0, "month": 1000.0}
        assert admin.put_group("billed", quotas={"minute": None}).quotas == {"day": 500.0, "month": 1000.0}
        with pytest.raises(ValueError, match="quotas.fortnight"):
            admin.put_group("billed", quotas={"fortnight": 1})
        with pytest.raises(ValueError, match="budget_period"):
            admin.put_group("billed", budget_period="year")
        assert admin.drop_group("billed") is True
        assert admin.drop_group("batch") is True
        assert admin.drop_group("batch", if_exists=True) is False
        admin.set_capacity(1000)
        status = admin.status()
        assert status.capacity == 1000.0 and status.role == "standalone"
        assert [g.name for g in status.groups] == ["checkout"]
        checkout = status.group("checkout")
        assert checkout is not None and checkout.settings is not None and checkout.settings.limit == 500.0


def test_ramps_node_settings_and_tokens(server: Server) -> None:
    with tollgate.Admin(server.url) as admin:
        ramp = tollgate.Ramp(min=10, max=100, duration_s=60, mode="scheduled", cool_down_s=2)
        made = admin.create_group("rising", limit=100, ramp=ramp)
        assert made.ramp == ramp
        assert admin.alter_group("rising", ramp=None).ramp is None
        with pytest.raises(tollgate.InvalidArgument) as bad:
            admin.alter_group("rising", ramp=tollgate.Ramp(min=10, max=100, duration_s=60, mode="sideways"))
        assert bad.value.field == "ramp.mode"
        with pytest.raises(tollgate.InvalidArgument) as server_side:
            admin.alter_group("rising", ramp=tollgate.Ramp(min=100, max=10, duration_s=60))
        assert server_side.value.field is not None and server_side.value.field.startswith("ramp")
        assert admin.get_group("rising").ramp is None  # nothing changed

        assert admin.get_node() == tollgate.Node(capacity=None, mode="share", slow_start=False)
        assert admin.set_capacity(5000).capacity == 5000.0
        assert admin.set_mode("fcfs").mode == "fcfs"
        assert admin.set_slow_start(True).slow_start is True
        assert admin.get_node() == tollgate.Node(capacity=5000.0, mode="fcfs", slow_start=True)
        assert admin.set_capacity(None).capacity is None
        with pytest.raises(tollgate.InvalidArgument, match="mode"):
            admin.set_mode("lottery")
        # Shadow mode and the one switch, node-wide and per group.
        assert admin.set_shadow(True).shadow is True
        off = admin.set_throttling(False)
        assert (off.shadow, off.throttling) == (True, False)
        assert admin.set_throttling(True).throttling is True
        assert admin.set_shadow(False).shadow is False
        assert admin.create_group("dark", limit=10, shadow=True).shadow is True
        assert admin.alter_group("dark", shadow=False).shadow is False
        with pytest.raises(tollgate.InvalidArgument, match="shadow"):
            admin.alter_group("dark", shadow="yes")


def test_tokens_under_auth(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from conftest import start

    server = start(tmp_path / "data", "--auth")
    try:
        admin_token = (tmp_path / "data" / "admin.token").read_text().strip()
        with tollgate.Admin(server.url, token=admin_token) as admin:
            made = admin.create_token("client", groups="acme-*", unthrottled=True, name="acme", default_group="acme-web")
            assert made.token and made.info.role == "client" and made.info.unthrottled
            assert made.info.default_group == "acme-web"
            assert admin.set_token_group(made.info.id, "acme-api").default_group == "acme-api"
            with pytest.raises(tollgate.InvalidArgument, match="default_group"):
                admin.set_token_group(made.info.id, "other")
            assert made.info.id in [t.id for t in admin.list_tokens()]
            with tollgate.Admin(server.url, token=made.token) as client:
                with pytest.raises(tollgate.PermissionDenied):
                    client.create_group("x")
            assert admin.revoke_token(made.info.id).id == made.info.id
            with pytest.raises(tollgate.InvalidArgument) as bad:
                admin.create_token("superuser")
            assert bad.value.field == "role"
            # A token handed out beforehand (TiDB's IDENTIFIED BY), and one that is no token.
            given = "tg_" + "00112233aabbccdd" + "_" + "ab" * 32
            handed = admin.create_token("reader", name="dash", token=given)
            assert handed.token == given and handed.info.id == "00112233aabbccdd", handed
            with tollgate.Admin(server.url, token=given) as reader:
                assert reader.list_groups() == []
            with pytest.raises(tollgate.InvalidArgument) as bad:
                admin.create_token("reader", token="hunter2")
            assert bad.value.field == "token"
        with tollgate.Admin(server.url) as anonymous:
            with pytest.raises(tollgate.Unauthenticated):
                anonymous.list_groups()
    finally:
        server.stop()


def test_a_stopped_server_is_unavailable(server: Server) -> None:
    server.stop()
    with tollgate.Admin(server.url, timeout=2) as admin:
        with pytest.raises(tollgate.TollgateError):
            admin.list_groups()


def test_usage_is_read_by_the_minute(tmp_path: Path) -> None:
    # Metering flushed every 100 ms, so the records are there within moments.
    s = start(tmp_path / "data", "--tick-ms", "100", "--flush-ms", "100")
    try:
        with tollgate.Admin(s.url) as admin, tollgate.Limiter(s.url, max_wait=30.0) as limiter:
            admin.create_group("metered", limit=1000)
            for _ in range(5):
                with limiter.acquire("metered", cost=2):
                    pass
            deadline = time.monotonic() + 30
            while True:
                records = admin.usage("metered")
                if records and records[-1].admitted_total >= 5:
                    break
                assert time.monotonic() < deadline, records
                time.sleep(0.05)
            last = records[-1]
            assert (last.group, last.consumed_total) == ("metered", 10.0), last
            assert last.minute_unix_ms % 60_000 == 0
            assert admin.usage("other-group") == []
            for bad in [{"limit": 100_001}, {"limit": -1}, {"since_unix_ms": -5}, {"limit": True}]:
                with pytest.raises(tollgate.InvalidArgument) as e:
                    admin.usage("metered", **bad)  # type: ignore[arg-type]
                assert e.value.field == next(iter(bad))
    finally:
        s.stop()


def test_the_audit_log_names_each_change(server: Server) -> None:
    with tollgate.Admin(server.url) as admin:
        admin.create_group("audited", limit=10)
        admin.alter_group("audited", limit=20)
        admin.drop_group("audited")
        records = admin.audit()
        whats = [r.what for r in records]
        assert whats[-3:] == ["group.put audited", "group.put audited", "group.drop audited"], whats
        made, changed, dropped = records[-3:]
        assert made.before is None and made.after is not None and '"limit":10' in made.after.replace(" ", "")
        assert changed.before is not None and dropped.after is None
        assert all(r.who.startswith("grpc ") for r in records[-3:])
        assert admin.audit(since_unix_ms=dropped.at_unix_ms + 1) == []
        assert len(admin.audit(limit=1)) == 1
        with pytest.raises(tollgate.InvalidArgument) as e:
            admin.audit(limit=10_001)
        assert e.value.field == "limit"


def test_rls_rules_are_set_checked_and_read_back(server: Server) -> None:
    with tollgate.Admin(server.url) as admin:
        assert admin.get_rls_rules() == []
        rules = [{"domain": "edge", "key": "tenant", "value": "", "group": "t-{value}"}]
        kept = admin.set_rls_rules(rules)
        assert admin.get_rls_rules() == kept and kept[0]["group"] == "t-{value}", kept
        with pytest.raises(tollgate.InvalidArgument) as e:
            admin.set_rls_rules([{"domain": "edge", "key": "", "group": "x"}])
        assert e.value.field and "key" in e.value.field, e.value
        assert admin.get_rls_rules() == kept, "a refused set changes nothing"
        with pytest.raises(tollgate.InvalidArgument) as e:
            admin.set_rls_rules({"key": "tenant"})  # type: ignore[arg-type]
        assert e.value.field == "rules"


def test_the_trace_follows_the_rate_computations(server: Server) -> None:
    with tollgate.Admin(server.url) as admin, tollgate.Limiter(server.url, max_wait=30.0) as limiter:
        admin.create_group("traced", limit=100)
        events = admin.trace("traced", timeout=30)
        with limiter.acquire("traced", cost=1):
            pass
        # The server's tick (100 ms here) traces the group while its client asks for it.
        first = next(events, None)
        events.close()
        assert first is not None and first["group"] == "traced", first
        with pytest.raises(tollgate.InvalidArgument) as e:
            next(admin.trace(timeout=0))
        assert e.value.field == "timeout"


def test_the_asyncio_admin_makes_every_call_as_the_blocking_one_does(server: Server) -> None:
    async def main() -> None:
        async with tollgate.AsyncAdmin(server.url) as admin:
            made = await admin.create_group("async-made", limit=50, reserved=5)
            assert (made.limit, made.reserved) == (50.0, 5.0)
            with pytest.raises(tollgate.AlreadyExists):
                await admin.create_group("async-made")
            with pytest.raises(tollgate.InvalidArgument) as bad:
                await admin.alter_group("async-made", reserved=900)
            assert bad.value.field == "reserved"
            assert (await admin.put_group("async-made", burst=10)).burst == 10.0
            assert [g.name for g in await admin.list_groups()] == ["async-made"]
            assert (await admin.set_capacity(5000)).capacity == 5000.0
            assert (await admin.get_node()).capacity == 5000.0
            status = await admin.status()
            assert status.group("async-made") is not None
            assert [r.what for r in await admin.audit()][-2:] == ["group.put async-made", "node.set"]
            assert await admin.usage("async-made") == []
            kept = await admin.set_rls_rules([{"key": "tenant", "group": "t-{value}"}])
            assert await admin.get_rls_rules() == kept
            assert await admin.drop_group("async-made") is True
            assert await admin.drop_group("async-made", if_exists=True) is False
            with pytest.raises(tollgate.NotFound):
                await admin.get_group("async-made")
            with pytest.raises(tollgate.InvalidArgument) as e:
                await admin.set_mode("fastest")
            assert e.value.field == "mode"
            # A trace of a group nobody asks for: no event, and its deadline ends it cleanly.
            assert [event async for event in admin.trace("nobody", timeout=0.2)] == []
            with pytest.raises(tollgate.InvalidArgument) as e:
                [event async for event in admin.trace(timeout=-1)]
            assert e.value.field == "timeout"

    asyncio.run(main())


def test_a_limits_file_is_imported_as_the_command_imports_it(server: Server) -> None:
    text = (Path(__file__).resolve().parents[3] / "examples" / "import" / "ratelimit.yaml").read_text()
    with tollgate.Admin(server.url) as admin:
        dry = admin.import_limits("envoy-ratelimit", text, dry_run=True)
        assert not dry.applied and dry.summary == "", dry
        assert "create group shop/report=export: unlimited, quota 50/day" in dry.changes, dry
        with pytest.raises(tollgate.NotFound):
            admin.get_group("shop/report=export")
        done = admin.import_limits("envoy-ratelimit", text)
        assert done.applied and done.summary.startswith("imported: 7 groups and patterns written"), done
        assert admin.get_group("shop/report=export").quotas == {"day": 50.0}
        assert admin.get_rls_rules() == [], "the file's descriptor tree is no mapping rule"
        # Again: every group kept.
        again = admin.import_limits("envoy-ratelimit", text, dry_run=True)
        assert sum(line.startswith("keep ") for line in again.changes) == 7, again
        # What cannot be expressed is refused line by line.
        refused = (Path(__file__).resolve().parents[3] / "examples" / "import" / "refused.yaml").read_text()
        with pytest.raises(tollgate.InvalidArgument) as e:
            admin.import_limits("envoy-ratelimit", refused)
        assert "line 17: rate_limit.burst: unknown key" in str(e.value), e.value
        with pytest.raises(tollgate.InvalidArgument) as e:
            admin.import_limits("yaml", text)
        assert e.value.field == "format"

    async def main() -> None:
        smaller = "domain: shop\ndescriptors:\n  - key: api_key\n    rate_limit:\n      unit: second\n      requests_per_unit: 20\n"
        async with tollgate.AsyncAdmin(server.url) as admin:
            # It would drop the domain's tree: only with replace.
            with pytest.raises(tollgate.TollgateError) as e:
                await admin.import_limits("envoy-ratelimit", smaller)
            assert e.value.code == "FAILED_PRECONDITION" and "give replace" in str(e.value), e.value
            assert (await admin.import_limits("envoy-ratelimit", smaller, replace=True)).applied

    asyncio.run(main())


def test_the_largest_request_and_the_tokens_marks_come_back_in_the_status(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from conftest import start
    from test_limiter import eventually

    server = start(tmp_path / "data", "--auth")
    try:
        admin_token = (tmp_path / "data" / "admin.token").read_text().strip()
        with tollgate.Admin(server.url, token=admin_token) as admin:
            admin.create_group("reports", limit=1000)
            client = admin.create_token("client", name="billing-py")
            with tollgate.Limiter(server.url, token=client.token) as limiter:

                def seen() -> bool:
                    for cost in (1, 40, 3):
                        limiter.acquire("reports", cost)
                    status = admin.status()
                    group = status.group("reports")
                    return (
                        group is not None
                        and group.largest_last_minute == 40
                        and bool(status.tokens)
                        and status.tokens[0].largest_last_minute == 40
                    )

                eventually("the largest request of 40 in the group's and the token's marks", seen)
            token = admin.status().tokens[0]
            assert token.id == client.info.id and "billing-py" in token.label, token
            assert token.consumed_total >= 44 and token.admitted_total >= 3, token
    finally:
        server.stop()
