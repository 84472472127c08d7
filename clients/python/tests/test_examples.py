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
from conftest import Server

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
