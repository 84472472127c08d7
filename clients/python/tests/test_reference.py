"""The API reference is generated from the docstrings (pdoc), and every public name is in it."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

import tollgate

# What docs/python.md's command documents: the package, and the modules whose own pages say
# more than the package's (the asyncio limiter, the cost models' formulas, the admin models,
# the embedded limiter, store mode).
MODULES = ("tollgate", "tollgate.aio", "tollgate.cost", "tollgate.models", "tollgate.embedded", "tollgate.store")


def test_the_api_reference_builds(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("pdoc")
    root = pathlib.Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-m", "pdoc", *MODULES, "-o", str(tmp_path)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "tollgate.html").read_text()
    for name in tollgate.__all__:
        assert name in page, name
    for module in MODULES[1:]:
        assert (tmp_path / "tollgate" / f"{module.split('.')[1]}.html").exists(), module


def test_the_version_is_the_distributions() -> None:
    text = (pathlib.Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    assert 'name = "tollgate-client"' in text and 'attr = "tollgate.__version__"' in text
    assert tollgate.__version__.count(".") == 2
