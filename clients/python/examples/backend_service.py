"""A backend that reports to Tollgate: a small HTTP service that does work for tenants, tells the
controller its load and each tenant's share of it (``tollgate.Reporter``), and holds each
tenant to the soft limit the controller pushes back for this backend (``backend_limit``).

Run it (with ``pip install 'tollgate-client[examples]'``, a server on 127.0.0.1:7460)::

    python backend_service.py --listen 127.0.0.1:8100 --capacity 1000
    curl -X POST -H 'X-Tenant: acme' -H 'X-Units: 5' http://127.0.0.1:8100/work
    curl http://127.0.0.1:8100/limits

``POST /work`` does ``X-Units`` units of work (1 by default) for the ``X-Tenant`` tenant, or
answers 429 with ``Retry-After`` when that would take the tenant past its soft limit here: a
token bucket at the limit's rate holding ``--burst-s`` seconds of it. ``GET /limits`` shows the
soft limits as last heard. The first line printed is ``listening on HOST:PORT``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, Tuple

import tollgate


class SoftLimits:
    """Each tenant's bucket at its soft limit: ``burst_s`` seconds of the rate, refilled
    continuously; tenants without a limit are not held."""

    def __init__(self, reporter: tollgate.Reporter, burst_s: float) -> None:
        self.reporter = reporter
        self.burst_s = burst_s
        self.lock = threading.Lock()
        self.buckets: Dict[str, Tuple[float, float, float]] = {}  # tenant: (rate, tokens, at)

    def take(self, tenant: str, units: float) -> float:
        """0 when ``units`` may be served now (and are taken), else the seconds to wait."""
        rate = self.reporter.soft_limits().get(tenant)
        if rate is None:
            return 0.0
        now = time.monotonic()
        burst = rate * self.burst_s
        with self.lock:
            known, tokens, at = self.buckets.get(tenant, (rate, burst, now))
            tokens = burst if known != rate else min(burst, tokens + (now - at) * rate)
            if units > burst:
                return math.inf
            if tokens >= units:
                self.buckets[tenant] = (rate, tokens - units, now)
                return 0.0
            self.buckets[tenant] = (rate, tokens, now)
            return (units - tokens) / rate


def handler(reporter: tollgate.Reporter, limits: SoftLimits) -> type:
    class Handler(BaseHTTPRequestHandler):
        def answer(self, code: int, body: object, headers: Dict[str, str] = {}) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - the standard library's name
            if self.path == "/limits":
                self.answer(200, reporter.soft_limits())
            else:
                self.answer(404, {"error": "no such path"})

        def do_POST(self) -> None:  # noqa: N802
            if self.path != "/work":
                self.answer(404, {"error": "no such path"})
                return
            tenant = self.headers.get("X-Tenant", "")
            try:
                units = float(self.headers.get("X-Units", "1"))
            except ValueError:
                units = -1.0
            if not tenant or not (math.isfinite(units) and units > 0):
                self.answer(400, {"error": "give X-Tenant and X-Units (a number above 0)"})
                return
            wait = limits.take(tenant, units)
            if wait > 0:
                retry = "3600" if math.isinf(wait) else str(max(1, math.ceil(wait)))
                self.answer(429, {"error": "over the soft limit", "tenant": tenant}, {"Retry-After": retry})
                return
            reporter.record(tenant, units)  # the work would be done here
            self.answer(200, {"tenant": tenant, "units": units})

        def log_message(self, *_: object) -> None:
            pass

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:8100", help="HOST:PORT (port 0: any free one)")
    parser.add_argument("--server", default=os.environ.get("TOLLGATE_SERVER", "http://127.0.0.1:7460"))
    parser.add_argument("--backend-id", default="backend-py")
    parser.add_argument("--zone", default="zone")
    parser.add_argument("--capacity", type=float, default=1000.0, help="units/s this backend can do")
    parser.add_argument("--burst-s", type=float, default=1.0, help="seconds of its soft limit a tenant may use at once")
    args = parser.parse_args()
    host, _, port = args.listen.rpartition(":")
    with tollgate.Reporter(args.server, args.backend_id, args.zone, capacity=args.capacity) as reporter:
        limits = SoftLimits(reporter, args.burst_s)
        server = ThreadingHTTPServer((host, int(port)), handler(reporter, limits))
        print(f"listening on {host}:{server.server_address[1]}", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()


if __name__ == "__main__":
    main()
