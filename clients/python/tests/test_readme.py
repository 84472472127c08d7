"""Every Python example in this package's README, docs/python.md and docs/backend.md runs as
written, against a real server."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

from conftest import Server, redis_server

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT.parent.parent / "docs" / "python.md", ROOT.parent.parent / "docs" / "backend.md"]
BLOCKS = [
    (page, i, code)
    for page in PAGES
    for i, code in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), re.S))
]


def test_the_pages_have_examples() -> None:
    assert {page for page, _, _ in BLOCKS} == set(PAGES)


@pytest.mark.parametrize("page,index,code", BLOCKS, ids=[f"{p.name}-{i}" for p, i, _ in BLOCKS])
def test_the_example_runs(server: Server, page: pathlib.Path, index: int, code: str, tmp_path: pathlib.Path) -> None:
    env = dict(os.environ, TOLLGATE_SERVER=server.url, PYTHONPATH=str(ROOT))
    if "StoreLimiter(" in code:
        # Store mode's examples run against a Redis of their own.
        with redis_server(tmp_path) as redis_url:
            env["TOLLGATE_REDIS"] = redis_url
            done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    else:
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{page.name} example {index}:\n{done.stderr}"
    if "tollgate.Reporter(" in code:
        assert "tenant-a: at most 300.0 units/s here" in done.stdout, done.stdout
    if 'handle("A-17")' in code:
        assert "served A-17" in done.stdout, done.stdout
