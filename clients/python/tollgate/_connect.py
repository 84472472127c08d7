"""Channels to a tollgate server, with TLS for https:// addresses and the token on every call."""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import grpc
import grpc.aio

from .errors import InvalidArgument

Metadata = Sequence[Tuple[str, str]]

#: The most controller addresses a limiter is given (as the Rust client).
CONTROLLERS_MAX = 16


def _target(url: str, ca_file: Optional[str]) -> Tuple[str, Optional[grpc.ChannelCredentials]]:
    """The address to dial and, for ``https://``, the TLS credentials."""
    if not isinstance(url, str) or not url:
        raise InvalidArgument.of("url", f"must be http://HOST:PORT, https://HOST:PORT or HOST:PORT, got {url!r}")
    if url.startswith("https://"):
        roots = None
        if ca_file is not None:
            with open(ca_file, "rb") as f:
                roots = f.read()
        return url[len("https://") :].rstrip("/"), grpc.ssl_channel_credentials(roots)
    if ca_file is not None:
        raise InvalidArgument.of("ca_file", f"needs an https:// address, got {url!r}")
    target = url[len("http://") :] if url.startswith("http://") else url
    return target.rstrip("/"), None


def channel(url: str, ca_file: Optional[str] = None) -> grpc.Channel:
    """A channel to ``url``: ``http://HOST:PORT`` (plain), ``https://HOST:PORT`` (TLS, checked
    against ``ca_file`` or the system's authorities), or a bare ``HOST:PORT``."""
    target, credentials = _target(url, ca_file)
    if credentials is not None:
        return grpc.secure_channel(target, credentials)
    return grpc.insecure_channel(target)


def aio_channel(url: str, ca_file: Optional[str] = None) -> grpc.aio.Channel:
    """The same channel for asyncio (``grpc.aio``)."""
    target, credentials = _target(url, ca_file)
    if credentials is not None:
        return grpc.aio.secure_channel(target, credentials)
    return grpc.aio.insecure_channel(target)


def metadata(token: Optional[str]) -> Metadata:
    """The call metadata that carries ``token`` (none without one)."""
    if token is None:
        return ()
    token = token.strip()
    if not token or len(token) > 256 or not token.isascii() or any(c.isspace() for c in token):
        raise InvalidArgument.of("token", "must be 1 to 256 printable ASCII characters, as `tollgate token create` prints")
    return (("authorization", f"Bearer {token}"),)


def addresses(url: str, ca_file: Optional[str] = None) -> List[str]:
    """The controllers' addresses in ``url``: one, or several comma-separated (controllers
    sharing one etcd), each checked as :func:`channel` would."""
    if not isinstance(url, str):
        raise InvalidArgument.of("url", f"must be http://HOST:PORT, https://HOST:PORT or HOST:PORT, got {url!r}")
    urls = [u.strip() for u in url.split(",")]
    if len(urls) > CONTROLLERS_MAX or any(not u for u in urls):
        raise InvalidArgument.of("url", f"give 1 to {CONTROLLERS_MAX} controller addresses, comma-separated, none empty, got {url!r}")
    for u in urls:
        _target(u, ca_file)
    return urls
