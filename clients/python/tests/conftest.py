"""A real `tollgate server` for each test that asks for one: the binary named by TOLLGATE_BIN
(./scripts/test.sh builds it and sets it), on free loopback ports, in a temporary directory,
stopped after the test."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List

import pytest


@dataclass
class Server:
    url: str
    http: str
    process: subprocess.Popen  # type: ignore[type-arg]
    data: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def start(data: Path, *flags: str) -> Server:
    binary = os.environ.get("TOLLGATE_BIN")
    if not binary:
        raise RuntimeError("TOLLGATE_BIN is not set: run ./scripts/test.sh, which builds tollgate and sets it")
    args: List[str] = [binary, "server", "--data", str(data), "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", *flags]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert process.stdout is not None
    line = process.stdout.readline()
    words = line.split()
    assert words[:3] == ["tollgate", "server", "listening:"], line
    return Server(url=f"http://{words[4]}", http=words[6], process=process, data=data)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    s = start(tmp_path / "data", "--tick-ms", "100", "--lease-ms", "1000")
    yield s
    s.stop()


@contextmanager
def redis_server(directory: Path) -> Iterator[str]:
    """A real redis-server (the one on PATH; ./scripts/test.sh installs Debian's) on a free
    loopback port, its files in ``directory``: its URL, until the block ends."""
    binary = shutil.which("redis-server")
    assert binary, "redis-server is not on PATH: ./scripts/test.sh installs Debian's"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(directory)]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # Up to a minute (a bound for a stuck start, not a timing assertion).
        for _ in range(600):
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as c:
                    c.sendall(b"PING\r\n")
                    if c.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            time.sleep(0.1)
        else:
            raise AssertionError("redis-server never answered")
        yield f"redis://127.0.0.1:{port}"
    finally:
        process.kill()
        process.wait()
