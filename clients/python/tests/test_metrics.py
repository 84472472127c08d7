"""The server's /metrics, read by Prometheus's own Python parsers: the OpenMetrics text a
Prometheus scrape asks for, and the classic text everything else gets."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Dict

from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families as classic_families

import tollgate
from conftest import Server


def scrape(server: Server, accept: str | None) -> tuple[str, str]:
    request = urllib.request.Request(f"http://{server.http}/metrics")
    if accept is not None:
        request.add_header("Accept", accept)
    with urllib.request.urlopen(request, timeout=5) as r:
        return r.headers["content-type"], r.read().decode()


def check(server: Server, group: str) -> int:
    body = json.dumps({"group": group, "cost": 1}).encode()
    request = urllib.request.Request(f"http://{server.http}/v1/check", data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def test_both_formats_parse_with_prometheus_client(server: Server) -> None:
    with tollgate.Admin(server.url) as admin:
        admin.create_group("web", limit=5)
    codes = [check(server, "web") for _ in range(20)]
    assert 200 in codes and 429 in codes, codes

    kind, text = scrape(server, "application/openmetrics-text;version=1.0.0,text/plain;q=0.5")
    assert kind.startswith("application/openmetrics-text"), kind
    families: Dict[str, str] = {f.name: f.type for f in openmetrics_families(text)}
    assert families["tollgate_group_throttled_requests"] == "counter"
    assert families["tollgate_group_throttled_requests_per_second"] == "gauge"
    assert families["tollgate_exchange_latency_seconds"] == "histogram"

    # The server's own client reports the checks at its next exchange (a tick, 100 ms here).
    deadline = time.monotonic() + 30
    while True:
        kind, text = scrape(server, None)
        assert kind.startswith("text/plain; version=0.0.4"), kind
        samples = {
            (s.name, s.labels.get("group")): s.value for f in classic_families(text) for s in f.samples
        }
        admitted = samples.get(("tollgate_group_admitted_requests_total", "web"), 0)
        refused = samples.get(("tollgate_group_throttled_requests_total", "web"), 0)
        if admitted + refused == len(codes) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert (admitted, refused) == (codes.count(200), codes.count(429))
