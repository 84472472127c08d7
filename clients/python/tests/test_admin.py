"""The admin calls against a real server."""

from __future__ import annotations

import pytest

import tollgate
from conftest import Server


def test_groups_round_trip_and_errors_name_the_field(server: Server) -> None:
    with tollgate.Admin(server.url) as admin:
        made = admin.create_group("checkout", limit=500, priority="high", reserved=100)
        assert (made["limit"], made["priority"], made["reserved"]) == (500.0, "high", 100.0)
        with pytest.raises(tollgate.AlreadyExists):
            admin.create_group("checkout")
        changed = admin.alter_group("checkout", burst=50, dropped="count")
        assert (changed["burst"], changed["dropped"], changed["limit"]) == (50.0, "count", 500.0)
        admin.put_group("batch", limit="unlimited", weight=2)
        assert [g["name"] for g in admin.list_groups()] == ["batch", "checkout"]
        assert admin.get_group("batch")["limit"] is None
        with pytest.raises(tollgate.InvalidArgument) as bad:
            admin.alter_group("checkout", reserved=900)
        assert "reserved: must not exceed limit" in bad.value.message
        with pytest.raises(ValueError, match="colour: unknown setting"):
            admin.alter_group("checkout", colour="red")
        with pytest.raises(tollgate.NotFound):
            admin.get_group("ghost")
        assert admin.put_group("billed", budget=1000, budget_period="month")["budget_period"] == "month"
        with pytest.raises(ValueError, match="budget_period"):
            admin.put_group("billed", budget_period="year")
        assert admin.drop_group("billed") is True
        assert admin.drop_group("batch") is True
        assert admin.drop_group("batch", if_exists=True) is False
        admin.set_capacity(1000)
        status = admin.status()
        assert status["capacity"] == 1000.0
        assert [g["name"] for g in status["groups"]] == ["checkout"]


def test_a_stopped_server_is_unavailable(server: Server) -> None:
    server.stop()
    with tollgate.Admin(server.url, timeout=2) as admin:
        with pytest.raises(tollgate.TollgateError):
            admin.list_groups()
