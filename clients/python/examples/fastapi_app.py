"""Admission in front of a FastAPI service, with the asyncio limiter: each request is admitted
for its tenant's group (the ``X-Tenant`` header) or answered 429 with ``Retry-After``.

Run it (with ``pip install 'tollgate-client[examples]'``, a server on 127.0.0.1:7460)::

    uvicorn fastapi_app:app --port 8000
    curl -H 'X-Tenant: acme' http://127.0.0.1:8000/items/1
"""

from __future__ import annotations

import math
import os
from contextlib import asynccontextmanager
from typing import AsyncIterator, Awaitable, Callable, Dict

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

import tollgate

limiter = tollgate.AsyncLimiter(os.environ.get("TOLLGATE_SERVER", "http://127.0.0.1:7460"), max_wait=0.5)


@asynccontextmanager
async def lifespan(_: FastAPI) -> AsyncIterator[None]:
    # The limiter's exchange runs on the server's event loop for as long as the app lives.
    async with limiter:
        yield


app = FastAPI(lifespan=lifespan)


@app.middleware("http")
async def admission(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
    tenant = request.headers.get("x-tenant", "anonymous")
    try:
        # Awaits up to max_wait for tokens (or a new tenant's first grant) without blocking
        # the loop; the other requests go on meanwhile.
        await limiter.acquire(tenant, cost=1)
    except tollgate.Throttled as t:
        return JSONResponse(
            {"error": "throttled", "group": t.group, "retry_after_s": t.retry_after},
            status_code=429,
            headers={"Retry-After": str(max(1, math.ceil(t.retry_after)))},
        )
    except tollgate.InvalidArgument as e:
        return JSONResponse({"error": "bad tenant", "field": "X-Tenant", "rule": e.rule}, status_code=400)
    return await call_next(request)


@app.get("/items/{item}")
async def read_item(item: int) -> Dict[str, int]:
    return {"item": item}
