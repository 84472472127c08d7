"""What the dashboard costs: the server's CPU and memory with 1,000 active groups, without and
with 10 dashboards open, and how long the page takes to load and draw. A load program, not a
test: it prints its figures (BENCHMARKS.md quotes them).

    TOLLGATE_BIN=target/release/tollgate target/test-venv-python/bin/python \\
        tests/browser/measure_dashboard.py [--groups 1000] [--dashboards 10] [--seconds 30]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import List, Tuple

from playwright.sync_api import sync_playwright

CHROMIUM = os.environ.get("TOLLGATE_CHROMIUM", "/usr/bin/chromium")


def cpu_and_rss(pid: int) -> Tuple[float, int]:
    """The process's CPU seconds so far and its resident memory in bytes (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    rss = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    return cpu, rss


def cpu_over(pid: int, seconds: float) -> Tuple[float, int]:
    """Percent of one core the process used over `seconds`, and its memory at the end."""
    c0, _ = cpu_and_rss(pid)
    t0 = time.monotonic()
    time.sleep(seconds)
    c1, rss = cpu_and_rss(pid)
    return 100.0 * (c1 - c0) / (time.monotonic() - t0), rss


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", type=int, default=1000)
    ap.add_argument("--dashboards", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--loads", type=int, default=10)
    a = ap.parse_args()
    binary = os.environ["TOLLGATE_BIN"]
    data = Path(tempfile.mkdtemp()) / "data"
    server = subprocess.Popen(
        [binary, "server", "--data", str(data), "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    assert server.stdout is not None
    words = server.stdout.readline().split()
    url, http = f"http://{words[4]}", f"http://{words[6]}"
    load = subprocess.Popen(
        # Ten clients, each with its own tenth of the groups, exchanging once a second.
        [binary, "bench", "exchange", "--server", url, "--clients", "10", "--groups", str(max(1, a.groups // 10)),
         "--rate", "1", "--duration", "100000"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        # Until the groups are tracked and the history holds some samples.
        for _ in range(120):
            with urllib.request.urlopen(http + "/v1/dashboard") as r:
                d = json.loads(r.read())
            if d["node"]["groups"] >= a.groups and d["next"] >= 15:
                break
            time.sleep(1)
        with urllib.request.urlopen(http + "/v1/dashboard") as r:
            size = len(r.read())
        print(f"groups tracked: {d['node']['groups']}, one /v1/dashboard answer: {size / 1024:.1f} KiB")
        quiet_cpu, quiet_rss = cpu_over(server.pid, a.seconds)
        print(f"no dashboard:        server CPU {quiet_cpu:5.1f} % of a core, RSS {quiet_rss / 2**20:.1f} MiB")

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            # Page load: from navigation to the node chart and the first group chart drawn.
            loads: List[float] = []
            for _ in range(a.loads):
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                t0 = time.monotonic()
                page.goto(http + "/")
                page.wait_for_function("state.node.t.length > 0 && state.charts.size > 0", timeout=60_000)
                loads.append(time.monotonic() - t0)
                page.close()
            print(f"page load to charts drawn: median {1000 * statistics.median(loads):.0f} ms "
                  f"(min {1000 * min(loads):.0f}, max {1000 * max(loads):.0f}, {a.loads} loads)")
            pages = []
            for _ in range(a.dashboards):
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.goto(http + "/")
                pages.append(page)
            for page in pages:
                page.wait_for_function("document.getElementById('state').textContent === 'live'", timeout=60_000)
            busy_cpu, busy_rss = cpu_over(server.pid, a.seconds)
            print(f"{a.dashboards} dashboards open: server CPU {busy_cpu:5.1f} % of a core, RSS {busy_rss / 2**20:.1f} MiB")
            print(f"the dashboards' cost: {busy_cpu - quiet_cpu:+.1f} % of a core, {(busy_rss - quiet_rss) / 2**20:+.1f} MiB")
            heaps = [page.evaluate("performance.memory ? performance.memory.usedJSHeapSize : 0") for page in pages]
            if any(heaps):
                print(f"a page's JS heap: median {statistics.median(heaps) / 2**20:.1f} MiB")
            browser.close()
    finally:
        load.kill()
        server.kill()
        load.wait()
        server.wait()


if __name__ == "__main__":
    main()
