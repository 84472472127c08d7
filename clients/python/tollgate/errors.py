"""What can go wrong, as exceptions a caller can tell apart."""

from __future__ import annotations

import grpc


class TollgateError(Exception):
    """The server refused a call; ``code`` is the gRPC status code's name, the message says
    which field broke which rule."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class InvalidArgument(TollgateError):
    """A value breaks a rule (the message names the field); nothing changed."""


class NotFound(TollgateError):
    """No such group or token."""


class AlreadyExists(TollgateError):
    """The group exists already."""


class PermissionDenied(TollgateError):
    """The token's role or groups do not cover the call."""


class Unauthenticated(TollgateError):
    """No token, or one that is malformed, unknown, revoked or expired."""


class Unavailable(TollgateError):
    """The server cannot be reached, or is not the leader."""


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
