"""Tollgate's Python client.

- :class:`Limiter`: admission by each request's cost, per group, fed by a tollgate server's
  grants (the Rust client's remote mode): ``try_acquire``, ``acquire`` (waits), a context
  manager and a decorator, permits settled with the actual cost, leases and safe mode.
- :class:`Admin`: the admin calls (groups, node capacity, status).

Errors are :class:`TollgateError` subclasses; a refusal is :class:`Throttled` with
``retry_after`` in seconds.
"""

from .admin import Admin
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

__all__ = [
    "Admin",
    "AlreadyExists",
    "GroupStats",
    "InvalidArgument",
    "Limiter",
    "NotFound",
    "PermissionDenied",
    "Permit",
    "RemoteStatus",
    "Throttled",
    "TollgateError",
    "Unauthenticated",
    "Unavailable",
]
