"""Channels to a tollgate server, with TLS for https:// addresses and the token on every call."""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import grpc

Metadata = Sequence[Tuple[str, str]]


def channel(url: str, ca_file: Optional[str] = None) -> grpc.Channel:
    """A channel to ``url``: ``http://HOST:PORT`` (plain), ``https://HOST:PORT`` (TLS, checked
    against ``ca_file`` or the system's authorities), or a bare ``HOST:PORT``."""
    if url.startswith("https://"):
        roots = None
        if ca_file is not None:
            with open(ca_file, "rb") as f:
                roots = f.read()
        return grpc.secure_channel(url[len("https://") :].rstrip("/"), grpc.ssl_channel_credentials(roots))
    if ca_file is not None:
        raise ValueError(f"{url!r}: a CA file needs an https:// address")
    target = url[len("http://") :] if url.startswith("http://") else url
    return grpc.insecure_channel(target.rstrip("/"))


def metadata(token: Optional[str]) -> Metadata:
    """The call metadata that carries ``token`` (none without one)."""
    if token is None:
        return ()
    token = token.strip()
    if not token or len(token) > 256 or not token.isascii() or any(c.isspace() for c in token):
        raise ValueError("token: 1 to 256 printable ASCII characters, as `tollgate token create` prints")
    return (("authorization", f"Bearer {token}"),)
