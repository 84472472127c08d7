"""The framework examples in examples/ run against a real server: requests over the tenant's
limit are answered 429 with Retry-After, other tenants are served."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import sys
from types import ModuleType

import pytest

import tollgate
from conftest import Server, start

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def load(name: str, server: Server) -> ModuleType:
    os.environ["TOLLGATE_SERVER"] = server.url
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    # The examples wait 0.5 s at most, for tokens or a new tenant's first grant; a loaded test
    # machine may take longer for the first grant.
    module.limiter._core.max_wait = 30.0
    return module


def limited(server: Server) -> None:
    with tollgate.Admin(server.url) as admin:
        # Three requests, then one per 100 s: what is served does not depend on speed.
        admin.create_group("acme", limit=0.01, burst=3)
        admin.create_group("globex", limit=1000)


def test_fastapi_answers_429_with_retry_after(server: Server) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    limited(server)
    app = load("fastapi_app", server)
    with TestClient(app.app) as client:
        codes = [client.get("/items/1", headers={"X-Tenant": "acme"}).status_code for _ in range(3)]
        assert codes == [200, 200, 200]
        refused = client.get("/items/1", headers={"X-Tenant": "acme"})
        assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
        assert refused.json()["group"] == "acme"
        assert client.get("/items/2", headers={"X-Tenant": "globex"}).json() == {"item": 2}
        assert client.get("/items/2", headers={"X-Tenant": ""}).status_code == 400


def test_flask_answers_429_with_retry_after(server: Server) -> None:
    pytest.importorskip("flask")
    limited(server)
    app = load("flask_app", server)
    try:
        client = app.app.test_client()
        codes = [client.get("/items/1", headers={"X-Tenant": "acme"}).status_code for _ in range(3)]
        assert codes == [200, 200, 200]
        refused = client.get("/items/1", headers={"X-Tenant": "acme"})
        assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
        assert client.get("/items/2", headers={"X-Tenant": "globex"}).get_json() == {"item": 2}
    finally:
        app.limiter.close()


def test_every_new_tenants_first_request_is_served_between_ticks(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("fastapi")
    pytest.importorskip("flask")
    from fastapi.testclient import TestClient

    # A tick a minute long: a new tenant whose first grant waited for the next tick would be
    # answered 429 after the examples' wait.
    server = start(tmp_path / "data", "--tick-ms", "60000", "--lease-ms", "120000")
    try:
        with tollgate.Admin(server.url) as admin:
            admin.create_group("globex", limit=1000)
            admin.create_group("initech", limit=1000)
        fast = load("fastapi_app", server)
        flask = load("flask_app", server)
        for module in (fast, flask):
            # A loaded test machine may take a while for an exchange; never a minute.
            module.limiter._core.max_wait = 10.0
        with TestClient(fast.app) as client:
            assert client.get("/items/1", headers={"X-Tenant": "globex"}).status_code == 200
            codes = [client.get("/items/1", headers={"X-Tenant": f"new-{i}"}).status_code for i in range(8)]
            assert codes == [200] * 8
        try:
            client2 = flask.app.test_client()
            assert client2.get("/items/1", headers={"X-Tenant": "initech"}).status_code == 200
            codes = [client2.get("/items/1", headers={"X-Tenant": f"other-{i}"}).status_code for i in range(8)]
            assert codes == [200] * 8
        finally:
            flask.limiter.close()
    finally:
        server.stop()
