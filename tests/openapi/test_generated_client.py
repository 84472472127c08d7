"""The HTTP API as a program in another language meets it: the OpenAPI document the real
`tollgate server` (TOLLGATE_BIN) serves passes a spec validator (PyPI's
openapi-spec-validator), and a typed client generated from it by a maintained generator (PyPI's
openapi-python-client) creates groups, checks, pages through groups and reads an error's field
against that server, on free loopback ports.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator, List

import pytest
from openapi_spec_validator import validate


class Server:
    def __init__(self, data: Path) -> None:
        binary = os.environ.get("TOLLGATE_BIN")
        if not binary:
            raise RuntimeError("TOLLGATE_BIN is not set: run ./scripts/test.sh, which builds tollgate and sets it")
        args = [binary, "server", "--data", str(data), "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--tick-ms", "100"]
        self.process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self.process.stdout is not None
        words = self.process.stdout.readline().split()
        assert words[:3] == ["tollgate", "server", "listening:"], words
        self.http = f"http://{words[6]}"

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[Server]:
    s = Server(tmp_path / "data")
    yield s
    s.stop()


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url) as r:
        return json.loads(r.read())


def send(server: Server, method: str, path: str, body: Any) -> Any:
    """``body`` as JSON to ``path``; the answer's JSON, whatever its status."""
    request = urllib.request.Request(
        server.http + path, data=json.dumps(body).encode(), method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        return json.loads(e.read())


def generated(doc: dict[str, Any], into: Path) -> Any:
    """The client openapi-python-client generates from `doc` under the names it picks itself,
    as a user running it with no options gets (the formatting hooks aside), imported. Its
    distribution must not take the official Python client's name, `tollgate-client`."""
    spec = into / "openapi.json"
    spec.write_text(json.dumps(doc))
    config = into / "config.json"
    config.write_text(json.dumps({"post_hooks": []}))
    tool = Path(sys.executable).with_name("openapi-python-client")
    subprocess.run(
        [str(tool), "generate", "--path", str(spec), "--config", str(config)],
        check=True,
        capture_output=True,
        cwd=into,
    )
    project = into / "tollgate-http-api-client"
    made = (project / "pyproject.toml").read_text()
    assert 'name = "tollgate-http-api-client"' in made, made
    assert 'name = "tollgate-client"' not in made
    sys.path.insert(0, str(project))
    return importlib.import_module("tollgate_http_api_client")


def test_the_document_validates_and_a_generated_client_works(server: Server, tmp_path: Path) -> None:
    with urllib.request.urlopen(server.http + "/v1/openapi.json") as r:
        doc = json.loads(r.read())
    validate(doc)
    assert doc["openapi"] == "3.1.0"
    operations = {op["operationId"] for path in doc["paths"].values() for op in path.values()}
    assert {"listGroups", "createGroup", "getGroup", "putGroup", "alterGroup", "dropGroup", "check"} <= operations

    generated(doc, tmp_path)
    from tollgate_http_api_client import Client  # type: ignore[import-not-found]
    from tollgate_http_api_client.api.admission import check  # type: ignore[import-not-found]
    from tollgate_http_api_client.api.groups import create_group, list_groups, put_group  # type: ignore[import-not-found]
    from tollgate_http_api_client.models import Admitted, CheckBody, Group, GroupBody, GroupPage, Problem  # type: ignore[import-not-found]

    client = Client(base_url=server.http)
    # Create: 201 with the typed group.
    made = create_group.sync_detailed(client=client, body=GroupBody(name="acme", limit=5.0, reserved=1.0))
    assert made.status_code == 201, made.content
    assert isinstance(made.parsed, Group) and made.parsed.name == "acme"
    assert made.parsed.settings.limit == 5.0
    # Check: admitted, typed, with the rate-limit headers.
    checked = check.sync_detailed(client=client, body=CheckBody(group="acme", cost=1.0))
    assert checked.status_code == 200, checked.content
    assert isinstance(checked.parsed, Admitted) and checked.parsed.admitted
    assert "ratelimit-policy" in checked.headers
    # Page through the groups, two at a time.
    for i in range(4):
        assert put_group.sync_detailed(name=f"more-{i}", client=client, body=GroupBody(limit=10.0)).status_code == 201
    names: List[str] = []
    token = None
    while True:
        kwargs: dict[str, Any] = {"client": client, "limit": 2}
        if token:
            kwargs["page_token"] = token
        page = list_groups.sync(**kwargs)
        assert isinstance(page, GroupPage)
        assert len(page.groups) <= 2
        names += [g.name for g in page.groups]
        if not page.next_page_token:
            break
        token = page.next_page_token
    assert names == ["acme", "more-0", "more-1", "more-2", "more-3"]
    # An error, typed: the field and the rule.
    again = create_group.sync_detailed(client=client, body=GroupBody(name="acme"))
    assert again.status_code == 409
    assert isinstance(again.parsed, Problem) and again.parsed.field == "name", again.content
    broken = put_group.sync_detailed(name="acme", client=client, body=GroupBody(reserved=50.0))
    assert broken.status_code == 400
    assert isinstance(broken.parsed, Problem)
    assert (broken.parsed.field, broken.parsed.rule) == ("reserved", "must not exceed limit (50 > 5)"), broken.content


def test_real_answers_match_the_documents_schemas(server: Server) -> None:
    """Every answer the document describes, as the server really gives it, validates against
    the document's schema for it (objects are closed: a field missing from the document fails)."""
    from jsonschema import Draft202012Validator

    doc = get_json(f"{server.http}/v1/openapi.json")
    send(server, "PUT", "/v1/groups/acme", {"limit": 100, "reserved": 10, "ramp": {"min": 1, "max": 50, "duration_s": 60}})
    send(server, "PUT", "/v1/groups/globex/properties", {"reserved": 5, "hard_limit": "unlimited"})
    for _ in range(3):
        send(server, "POST", "/v1/check", {"group": "acme", "cost": 1})
    checked = {
        ("/v1/status", "get"): "/v1/status",
        ("/v1/dashboard", "get"): "/v1/dashboard?charts=acme,ghost",
        ("/v1/dashboard/groups/{name}", "get"): "/v1/dashboard/groups/acme",
        ("/v1/node/properties", "get"): "/v1/node/properties",
        ("/v1/groups/{name}/properties", "get"): "/v1/groups/globex/properties",
        ("/v1/groups", "get"): "/v1/groups?limit=1",
        ("/v1/groups/{name}", "get"): "/v1/groups/acme",
        ("/v1/node", "get"): "/v1/node",
    }
    for (path, method), url in checked.items():
        schema = doc["paths"][path][method]["responses"]["200"]["content"]["application/json"]["schema"]
        validator = Draft202012Validator({**schema, "components": doc["components"]})
        answer = get_json(f"{server.http}{url}")
        errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(answer)]
        assert not errors, (url, errors[:5])
    # And the check must fail on a field the document does not know.
    status = doc["paths"]["/v1/status"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    answer = get_json(f"{server.http}/v1/status")
    answer["surprise"] = 1
    assert not Draft202012Validator({**status, "components": doc["components"]}).is_valid(answer)
