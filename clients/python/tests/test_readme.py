"""The README's example runs as written, against a real server."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

from conftest import Server


def test_the_readme_example_runs(server: Server) -> None:
    readme = (pathlib.Path(__file__).resolve().parent.parent / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", readme, re.S)
    assert code is not None
    env = dict(os.environ, TOLLGATE_SERVER=server.url)
    root = pathlib.Path(__file__).resolve().parent.parent
    env["PYTHONPATH"] = str(root)
    done = subprocess.run([sys.executable, "-c", code.group(1)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "served A-17" in done.stdout, done.stdout
