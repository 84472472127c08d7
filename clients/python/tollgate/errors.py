"""What can go wrong, as exceptions a caller can tell apart."""

from __future__ import annotations

import re
from typing import Optional

import grpc

# "field: rule", as the server words a refusal (a field may be a path: "ramp.max").
_FIELD_RULE = re.compile(r"^([A-Za-z_][A-Za-z0-9_.\[\]-]*): (.+)$", re.S)


class TollgateError(Exception):
    """A call was refused; ``code`` is the gRPC status code's name, the message says which
    field broke which rule. ``field`` and ``rule`` hold them apart when the message names a
    field (``None`` otherwise)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        found = _FIELD_RULE.match(message)
        self.field: Optional[str] = found.group(1) if found else None
        self.rule: Optional[str] = found.group(2) if found else None


class InvalidArgument(TollgateError, ValueError):
    """A value breaks a rule: ``field`` names it, ``rule`` says what it must be; nothing
    changed. Raised by the server's answers and by the client's own checks alike (it is a
    ``ValueError`` too)."""

    @classmethod
    def of(cls, field: str, rule: str) -> "InvalidArgument":
        """The error for ``field`` breaking ``rule``."""
        return cls("INVALID_ARGUMENT", f"{field}: {rule}")


class NotFound(TollgateError):
    """No such group or token."""


class AlreadyExists(TollgateError):
    """The group exists already."""


class PermissionDenied(TollgateError):
    """The token's role or groups do not cover the call."""


class Unauthenticated(TollgateError):
    """No token, or one that is malformed, unknown, revoked or expired."""


class Unavailable(TollgateError):
    """The server cannot be reached, or it follows a leader it cannot reach."""


_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
}


def from_rpc(e: grpc.RpcError) -> TollgateError:
    """The exception for a failed call."""
    code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
    details = e.details() if hasattr(e, "details") else str(e)
    kind = _BY_CODE.get(code, TollgateError)
    return kind(code.name if code is not None else "UNKNOWN", details or str(code))


class Throttled(Exception):
    """The group is over its allowance: try again after ``retry_after`` seconds."""

    def __init__(self, group: str, retry_after: float) -> None:
        super().__init__(f"group {group!r} is throttled: retry after {retry_after:.3f} s")
        self.group = group
        self.retry_after = retry_after
