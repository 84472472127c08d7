"""Admission in front of a Flask service, with the synchronous limiter: each request is
admitted for its tenant's group (the ``X-Tenant`` header) or answered 429 with
``Retry-After``.

Run it (with ``pip install 'tollgate-client[examples]'``, a server on 127.0.0.1:7460)::

    flask --app flask_app run --port 8000
    curl -H 'X-Tenant: acme' http://127.0.0.1:8000/items/1
"""

from __future__ import annotations

import math
import os
from typing import Any, Dict, Optional, Tuple

from flask import Flask, jsonify, request

import tollgate

limiter = tollgate.Limiter(os.environ.get("TOLLGATE_SERVER", "http://127.0.0.1:7460"), max_wait=0.5)
app = Flask(__name__)


@app.before_request
def admission() -> Optional[Tuple[Any, int, Dict[str, str]]]:
    tenant = request.headers.get("X-Tenant", "anonymous")
    try:
        # Waits up to max_wait for tokens (or a new tenant's first grant) in this worker.
        limiter.acquire(tenant, cost=1)
    except tollgate.Throttled as t:
        body = jsonify(error="throttled", group=t.group, retry_after_s=t.retry_after)
        return body, 429, {"Retry-After": str(max(1, math.ceil(t.retry_after)))}
    except tollgate.InvalidArgument as e:
        return jsonify(error="bad tenant", field="X-Tenant", rule=e.rule), 400, {}
    return None


@app.get("/items/<int:item>")
def read_item(item: int) -> Dict[str, int]:
    return {"item": item}
