"""Tollgate's Python client.

- :class:`Limiter` and, for asyncio, :class:`AsyncLimiter`: admission by each request's cost,
  per group, fed by a tollgate server's grants (the Rust client's remote mode):
  ``try_acquire``, ``acquire`` (waits), a context manager and a decorator, permits settled
  with the actual cost or priced by a :class:`CostModel`, dropped work, unthrottled handles,
  leases and safe mode.
- :class:`tollgate.embedded.EmbeddedLimiter`: the same limiter with the groups' settings in
  the process and no server; :class:`tollgate.store.StoreLimiter`: pools shared through Redis
  with no controller, with the Rust client's store mode (``pip install
  'tollgate-client[store]'``).
- :class:`ClientThrottle`: Google's client-side adaptive throttling, for a client whose
  backend sheds: it refuses a share of requests itself rather than send what will be refused.
- :class:`Reporter` and, for asyncio, :class:`AsyncReporter`: a backend's reports of its health
  and busiest groups, and the soft limits the controller pushes back.
- :class:`Admin` and, for asyncio, :class:`AsyncAdmin`: the admin calls (groups and ramps, the
  node, status, tokens, usage, the audit log, the RLS rules, limits files imported, the
  trace), with typed results
  (:mod:`tollgate.models`).

Errors are :class:`TollgateError` subclasses; a bad value is :class:`InvalidArgument` naming
its ``field`` and ``rule``; a refusal is :class:`Throttled` with ``retry_after`` in seconds.
"""

from .admin import Admin, AsyncAdmin
from .aio import AsyncLimiter
from .cost import Consumption, CostModel, Usage
from .errors import (
    AlreadyExists,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Throttled,
    TollgateError,
    Unauthenticated,
    Unavailable,
)
from .limiter import GroupStats, Limiter, Permit, RemoteStatus
from .models import AuditEntry, BackendStatus, Group, GroupStatus, Imported, NewToken, Node, Ramp, RateMarks, Status, Token, TokenStatus, UsageRecord
from .reporter import AsyncReporter, QueueBytes, Reporter, Utilisation
from .throttle import ClientThrottle, RefusedLocally

__version__ = "0.1.0"
"""The client's version (the distribution ``tollgate-client``'s)."""

__all__ = [
    "Admin",
    "AlreadyExists",
    "AsyncAdmin",
    "AsyncLimiter",
    "AsyncReporter",
    "AuditEntry",
    "BackendStatus",
    "ClientThrottle",
    "Consumption",
    "CostModel",
    "Group",
    "GroupStats",
    "GroupStatus",
    "Imported",
    "InvalidArgument",
    "Limiter",
    "NewToken",
    "Node",
    "NotFound",
    "PermissionDenied",
    "Permit",
    "QueueBytes",
    "Ramp",
    "RateMarks",
    "RefusedLocally",
    "RemoteStatus",
    "Reporter",
    "Status",
    "Throttled",
    "Token",
    "TokenStatus",
    "TollgateError",
    "Unauthenticated",
    "Unavailable",
    "Usage",
    "UsageRecord",
    "Utilisation",
    "__version__",
]
