"""The framework examples in examples/ run against a real server: requests over the tenant's
limit are answered 429 with Retry-After, other tenants are served."""

from __future__ import annotations

import ast
import time
import importlib.util
import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from types import ModuleType
from email.message import Message
from typing import Any, Dict, Tuple

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


def imported(path: pathlib.Path) -> set[str]:
    """The top-level modules a file imports, outside the standard library and this package."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != "tollgate"}


def test_the_examples_extra_installs_what_each_example_imports_and_runs_with() -> None:
    tomllib = pytest.importorskip("tomllib")
    pyproject = tomllib.loads((EXAMPLES.parent / "pyproject.toml").read_text())
    extra = {re.split(r"[<>=!~ \[;]", r, maxsplit=1)[0].lower() for r in pyproject["project"]["optional-dependencies"]["examples"]}
    for path in sorted(EXAMPLES.glob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        assert "pip install 'tollgate-client[examples]'" in doc, f"{path.name} says to install the extra"
        # The command the docstring runs it with: the first line of its indented block.
        command = doc.split("::", 1)[1].strip().splitlines()[0].split()[0]
        assert command == "python" or command in extra, f"{path.name} runs under {command}, which the extra must install"
        missing = imported(path) - extra
        assert not missing, f"{path.name} imports {sorted(missing)}, which the extra does not install"


def test_the_fastapi_example_serves_under_uvicorn_as_its_docstring_runs_it(server: Server) -> None:
    pytest.importorskip("uvicorn")
    limited(server)
    # The listening socket made here and handed over (`--fd`): no port to race for.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    app = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "fastapi_app:app", "--fd", str(listener.fileno())],
        cwd=EXAMPLES,
        # This checkout's package, as `pip install` would have put it on the path.
        env={**os.environ, "TOLLGATE_SERVER": server.url, "PYTHONPATH": str(EXAMPLES.parent)},
        pass_fds=[listener.fileno()],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    listener.close()

    def get(path: str, tenant: str) -> Tuple[int, Message, bytes]:
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"X-Tenant": tenant})
        try:
            with urllib.request.urlopen(request, timeout=30) as r:
                return r.status, r.headers, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read()

    try:
        # The connection waits in the socket's backlog until uvicorn has started; a new
        # tenant's first grant may take longer than the example's wait on a loaded machine,
        # so globex, far from its limit, is asked until served.
        served = False
        for _ in range(20):
            assert app.poll() is None, f"uvicorn stopped: {app.communicate()[1].decode()}"
            served = get("/items/2", "globex")[0] == 200
            if served:
                break
        assert served, "globex never served"
        codes = []
        for _ in range(10):
            code, headers, body = get("/items/1", "acme")
            codes.append(code)
            if code == 429:
                # Header names are read case-blind, as HTTP has them.
                assert int(headers["Retry-After"]) >= 1 and json.loads(body)["group"] == "acme"
                break
        # Three requests' burst, then one per 100 s: refused by the fourth at the latest.
        assert codes[-1] == 429 and codes.count(200) <= 3, codes
    finally:
        app.terminate()
        _, err = app.communicate(timeout=30)
    assert b"Traceback" not in err, err.decode()


def test_the_backend_service_reports_its_load_and_holds_tenants_to_their_soft_limits(server: Server) -> None:
    with tollgate.Admin(server.url) as admin:
        # A minute of a unit a second at once, then a unit a second: a second request of 60
        # units is refused unless a minute passed, whatever the machine's speed.
        admin.create_group("heavy", limit=1000, backend_limit=1)
        admin.create_group("light", limit=1000)
    service = subprocess.Popen(
        [sys.executable, "backend_service.py", "--listen", "127.0.0.1:0", "--backend-id", "kv-example", "--capacity", "100", "--burst-s", "60"],
        cwd=EXAMPLES,
        env={**os.environ, "TOLLGATE_SERVER": server.url, "PYTHONPATH": str(EXAMPLES.parent)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert service.stdout is not None
        line = service.stdout.readline()
        assert line.startswith("listening on "), line + (service.stderr.read() if service.stderr else "")
        address = line.split()[-1]

        def call(method: str, path: str, headers: Dict[str, str]) -> Tuple[int, Message, Any]:
            request = urllib.request.Request(f"http://{address}{path}", method=method, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=30) as r:
                    return r.status, r.headers, json.loads(r.read())
            except urllib.error.HTTPError as e:
                return e.code, e.headers, json.loads(e.read())

        # The soft limits come from the controller at start.
        deadline = time.monotonic() + 30
        while call("GET", "/limits", {})[2] != {"heavy": 1.0}:
            assert time.monotonic() < deadline, call("GET", "/limits", {})
            time.sleep(0.05)
        work = lambda tenant, units: call("POST", "/work", {"X-Tenant": tenant, "X-Units": str(units)})  # noqa: E731
        assert work("heavy", 60)[0] == 200
        refused = work("heavy", 60)
        assert refused[0] == 429 and int(refused[1]["Retry-After"]) >= 1 and refused[2]["tenant"] == "heavy", refused
        assert all(work("light", 60)[0] == 200 for _ in range(3)), "a tenant without a soft limit is not held"
        assert work("", 1)[0] == 400 and work("light", -1)[0] == 400
        # Its reports reach the controller: the backend, with the tenants it served.
        deadline = time.monotonic() + 30
        while True:
            with tollgate.Admin(server.url) as admin:
                seen = [b for b in admin.status().backend_detail if b.name == "kv-example"]
            if seen and {g for g, _ in seen[0].top_groups} == {"heavy", "light"}:
                break
            assert time.monotonic() < deadline, seen
            time.sleep(0.05)
        assert seen[0].utilisation > 0
    finally:
        service.terminate()
        service.communicate(timeout=30)
