"""The dashboard in a real headless browser: Debian's chromium driven by Playwright (its own
browser download is never used), against the real `tollgate server` binary (TOLLGATE_BIN) under
load from `tollgate bench accuracy`, on free loopback ports.

Waits are bounded (a stuck test fails after a minute) and assert what the page shows, never
how fast. With TOLLGATE_SCREENSHOT=FILE the loaded page is also saved there (docs/ holds one).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator, List

import pytest
from playwright.sync_api import ConsoleMessage, Page, sync_playwright

CHROMIUM = os.environ.get("TOLLGATE_CHROMIUM", "/usr/bin/chromium")
BOUND_MS = 60_000


class Server:
    def __init__(self, data: Path, *flags: str) -> None:
        binary = os.environ.get("TOLLGATE_BIN")
        if not binary:
            raise RuntimeError("TOLLGATE_BIN is not set: run ./scripts/test.sh, which builds tollgate and sets it")
        self.binary = binary
        self.data = data
        args = [binary, "server", "--data", str(data), "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", *flags]
        self.process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self.process.stdout is not None
        words = self.process.stdout.readline().split()
        assert words[:3] == ["tollgate", "server", "listening:"], words
        self.url = f"http://{words[4]}"
        self.http = f"http://{words[6]}"
        self.others: List[subprocess.Popen] = []  # type: ignore[type-arg]

    def cli(self, *args: str, token: str = "") -> str:
        env = dict(os.environ, TOLLGATE_SERVER=self.url)
        if token:
            env["TOLLGATE_TOKEN"] = token
        out = subprocess.run([self.binary, *args], env=env, capture_output=True, text=True, check=True)
        return out.stdout

    def load(self, *args: str, token: str = "") -> None:
        """Starts `tollgate bench accuracy` against this server, stopped with the server."""
        env = dict(os.environ, TOLLGATE_SERVER=self.url)
        if token:
            env["TOLLGATE_TOKEN"] = token
        cmd = [self.binary, "bench", "accuracy", "--setup", "--server", self.url, *args]
        self.others.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def stop(self) -> None:
        for p in [*self.others, self.process]:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    s = Server(tmp_path / "data")
    yield s
    s.stop()


@pytest.fixture
def browser() -> Iterator[object]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


def watch(page: Page) -> List[str]:
    """Every script error and failed request the page logs."""
    errors: List[str] = []

    def console(m: ConsoleMessage) -> None:
        if m.type == "error":
            errors.append(f"console: {m.text}")

    page.on("console", console)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url}"))
    return errors


def test_the_dashboard_draws_a_loaded_server_and_shows_a_group_on_click(server: Server, browser: object) -> None:
    server.cli("group", "create", "gold", "--reserved", "300", "--limit", "600")
    server.cli("group", "create", "idle", "--reserved", "10")
    server.cli("node", "capacity", "5000")
    server.load("--clients", "8", "--duration", "600", "--limit", "400")

    page = browser.new_page(viewport={"width": 1280, "height": 900})  # type: ignore[attr-defined]
    errors = watch(page)
    page.goto(server.http + "/")
    page.wait_for_function("document.getElementById('state').textContent === 'live'", timeout=BOUND_MS)
    # The load's group is charted with data the server sampled under load: admitted units and
    # refused requests (8 clients asking twice the limit).
    page.wait_for_function(
        """() => {
            const c = state.charts.get('accuracy');
            return c && c.data.t.length >= 3 && c.data.admitted.some(v => v > 0)
                && c.data.throttled.some(v => v > 0) && c.data.clients.some(v => v >= 8)
                && state.node.t.length >= 3 && state.node.capacity.some(v => v > 0);
        }""",
        timeout=BOUND_MS,
    )
    # Drawn: uPlot put a canvas in each chart, with a legend naming each series.
    assert page.locator("#node-chart canvas").count() == 1
    assert page.locator("#group-charts .group-card").filter(has_text="accuracy").count() == 1
    legend = page.locator("#group-charts").inner_text()
    for series in ["target", "admitted", "demand", "refused/s", "clients", "saturation-limited"]:
        assert series in legend, legend
    # Legends show the newest values with the pointer elsewhere (uPlot shows "--" for none).
    page.wait_for_function(
        """() => [...document.querySelectorAll('#group-charts .u-legend .u-series')]
            .filter(r => r.innerText.includes('admitted'))
            .every(r => /[0-9]/.test(r.querySelector('.u-value').innerText))""",
        timeout=BOUND_MS,
    )
    # Every chart on one time axis: the same span, ending at the same moment.
    spans = page.evaluate(
        """() => [state.nodePlot, ...[...state.charts.values()].flatMap(c => [c.units, c.other])]
            .map(u => [u.scales.x.min, u.scales.x.max])"""
    )
    assert len(spans) >= 3 and all(s == spans[0] for s in spans), spans
    # The capacity card and the table agree with the server.
    assert page.locator("#capacity").inner_text() != "–"
    rows = page.locator("#group-table tbody tr")
    assert rows.filter(has_text="accuracy").count() == 1
    assert rows.filter(has_text="gold").count() == 1
    # The table: reserved, limit and the unit beside target, admitted and refused; "throttled"
    # is refusing work, saturation its own column.
    head = page.locator("#group-table thead").inner_text()
    for column in ["reserved requests/s", "limit requests/s", "target requests/s", "admitted requests/s", "refused/s", "throttled", "saturation"]:
        assert column in head, head
    gold = rows.filter(has_text="gold").first.inner_text()
    assert "300" in gold and "600" in gold, gold
    page.wait_for_function(
        "document.querySelector('#group-table tr[data-group=accuracy]').innerText.includes('refusing')", timeout=BOUND_MS
    )
    # Every configured group is listed, an idle one too, but an idle one is never charted; rows
    # are by name, so they keep their places from one refresh to the next.
    assert rows.filter(has_text="idle").count() == 1
    assert page.evaluate("!state.charts.has('idle') && !state.charts.has('gold')")
    order = page.evaluate("[...document.querySelectorAll('#group-table tbody tr')].map(r => r.dataset.group)")
    assert order == sorted(order), order
    page.wait_for_function(f"state.next > {page.evaluate('state.next')}", timeout=BOUND_MS)
    assert page.evaluate("[...document.querySelectorAll('#group-table tbody tr')].map(r => r.dataset.group)") == order
    assert page.locator("#client-table tbody tr").filter(has_text="accuracy-0").count() == 1

    # Left open for a day: a day of samples through the page's own bookkeeping keeps at most a
    # window of them.
    kept = page.evaluate(
        """() => {
            const into = { t: [], capacity: [], admitted: [], demand: [] };
            for (let day = 0; day < 96; day++) {
                const n = 900, t = [], v = [];
                for (let i = 0; i < n; i++) { t.push(day * n + i); v.push(i); }
                append(into, { t, capacity: v, admitted: v, demand: v }, NODE_SERIES);
            }
            return [into.t.length, into.t[into.t.length - 1], state.window];
        }"""
    )
    assert kept == [900, 96 * 900 - 1, 900], kept

    # A group's settings on click.
    rows.filter(has_text="gold").first.click()
    page.wait_for_function("document.getElementById('detail-settings').innerText.includes('reserved')", timeout=BOUND_MS)
    settings = page.locator("#detail-settings").inner_text()
    assert "600" in settings and "300" in settings, settings
    assert page.locator("#detail-name").inner_text() == "gold"
    # A group has its own address, which opens it.
    assert page.evaluate("location.hash") == "#/groups/gold"
    other = browser.new_page(viewport={"width": 1280, "height": 900})  # type: ignore[attr-defined]
    other_errors = watch(other)
    other.goto(server.http + "/#/groups/idle")
    other.wait_for_function("document.getElementById('detail-name').textContent === 'idle'", timeout=BOUND_MS)
    other.wait_for_function("document.getElementById('detail-settings').innerText.includes('reserved')", timeout=BOUND_MS)
    assert other_errors == [], other_errors
    other.close()

    # The filter narrows the table.
    page.fill("#filter", "gol")
    page.wait_for_function(
        "document.querySelectorAll('#group-table tbody tr').length === 1", timeout=BOUND_MS
    )

    shot = os.environ.get("TOLLGATE_SCREENSHOT")
    if shot:
        page.fill("#filter", "")
        page.locator("#detail-close").click()
        # Half a minute of samples, for a picture worth looking at.
        page.wait_for_function(
            "document.querySelectorAll('#group-table tbody tr').length >= 2 && state.node.t.length >= 30",
            timeout=BOUND_MS,
        )
        page.screenshot(path=shot, full_page=True)
    assert errors == [], errors


def test_shadow_mode_and_the_one_switch_show_on_the_page(server: Server, browser: object) -> None:
    server.load("--clients", "4", "--duration", "600", "--limit", "200")
    page = browser.new_page(viewport={"width": 1280, "height": 900})  # type: ignore[attr-defined]
    errors = watch(page)
    page.goto(server.http + "/")
    row = "document.querySelector('#group-table tr[data-group=accuracy]')"
    page.wait_for_function(f"{row} && {row}.innerText.includes('refusing')", timeout=BOUND_MS)
    # In shadow mode the group refuses nothing, and the page counts what it would have refused.
    server.cli("group", "alter", "accuracy", "--shadow", "true")
    page.wait_for_function(
        f"""() => {{ const m = {row}.innerText.match(/shadow: would refuse ([0-9]+)/);
            return m && Number(m[1]) > 0; }}""",
        timeout=BOUND_MS,
    )
    assert page.locator("#node-mode").is_hidden()
    # An in-flight quota shows as what the clients hold of it.
    server.cli("group", "alter", "accuracy", "--max-in-flight", "3")
    page.wait_for_function(f"/[0-9]+ of 3/.test({row}.innerText)", timeout=BOUND_MS)
    # The one switch shows beside the connection's state, and goes when turned back on.
    server.cli("node", "throttling", "off")
    page.wait_for_function("document.getElementById('node-mode').textContent === 'throttling off'", timeout=BOUND_MS)
    server.cli("node", "throttling", "on")
    page.wait_for_function("document.getElementById('node-mode').hidden", timeout=BOUND_MS)
    assert errors == [], errors


def test_the_dashboard_fits_a_phone(server: Server, browser: object) -> None:
    server.load("--clients", "2", "--duration", "600", "--limit", "100")
    page = browser.new_page(viewport={"width": 390, "height": 844}, device_scale_factor=2)  # type: ignore[attr-defined]
    errors = watch(page)
    page.goto(server.http + "/")
    page.wait_for_function("state.charts.size >= 1 && state.node.t.length >= 2", timeout=BOUND_MS)
    # Nothing wider than the screen but the tables, which scroll in their own boxes.
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, width
    assert errors == [], errors


def test_with_auth_the_page_asks_for_a_token(tmp_path: Path, browser: object) -> None:
    s = Server(tmp_path / "data", "--auth")
    try:
        admin = (tmp_path / "data" / "admin.token").read_text().strip()
        reader = s.cli("token", "create", "--role", "reader", "--name", "dashboard", token=admin).strip().split()[-1]
        assert reader.startswith("tg_"), reader
        page = browser.new_page()  # type: ignore[attr-defined]
        errors: List[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(s.http + "/")
        page.wait_for_selector("#login:not([hidden])", timeout=BOUND_MS)
        page.fill("#token", "tg_wrong_token")
        page.click("#login button")
        page.wait_for_function(
            "document.getElementById('login-error').textContent.includes('refused')", timeout=BOUND_MS
        )
        page.fill("#token", reader)
        page.click("#login button")
        page.wait_for_function("document.getElementById('state').textContent === 'live'", timeout=BOUND_MS)
        assert "No client token" in page.locator("#tokens-note").inner_text()
        # Clients exchanging under a token show in the tokens' panel, with their largest
        # request; the groups' table shows each group's.
        client = s.cli("token", "create", "--role", "client", "--name", "checkout", token=admin).strip().split()[-1]
        s.cli("group", "create", "orders", "--limit", "1000", token=admin)
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "clients" / "python"))
        import tollgate

        with tollgate.Limiter(s.url, token=client) as limiter:
            for cost in (1, 40, 3):
                limiter.acquire("orders", cost)
            row = page.locator("#token-table tbody tr").filter(has_text="checkout")
            row.first.wait_for(timeout=BOUND_MS)
            page.wait_for_function(
                "[...document.querySelectorAll('#token-table tbody tr td:nth-child(4)')].some((c) => c.textContent === '40.0')",
                timeout=BOUND_MS,
            )
            largest = page.locator("#group-table thead th").all_inner_texts().index("largest request/1m") + 1
            page.wait_for_function(
                f"[...document.querySelectorAll('#group-table tbody tr td:nth-child({largest})')].some((c) => c.textContent === '40.0')",
                timeout=BOUND_MS,
            )
        assert errors == [], errors
    finally:
        s.stop()


def test_bad_requests_are_answered_clearly(server: Server) -> None:
    import json
    import urllib.error
    import urllib.request

    def get(path: str) -> tuple[int, dict]:  # type: ignore[type-arg]
        try:
            with urllib.request.urlopen(server.http + path) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    code, body = get("/v1/dashboard/groups/nosuch")
    assert (code, body["field"]) == (404, "name"), body
    assert "nosuch" in body["error"]
    code, body = get("/v1/dashboard?since=99999999")
    assert (code, body["field"]) == (400, "since"), body
    code, body = get("/v1/dashboard?since=-5")
    assert (code, body["field"]) == (400, "since"), body
    code, body = get("/v1/dashboard?charts=" + ",".join(f"g{i}" for i in range(13)))
    assert (code, body["field"]) == (400, "charts"), body
    code, body = get("/v1/dashboard?filter=" + "x" * 300)
    assert (code, body["field"]) == (400, "filter"), body
    code, body = get("/v1/dashboard?bogus=1")
    assert (code, body["field"]) == (400, "bogus"), body
    code, body = get("/v1/dashboard?charts=nosuch")
    assert code == 200 and body["unknown"] == ["nosuch"], body
    code, body = get("/v1/dashboard?page=-1")
    assert (code, body["field"]) == (400, "page"), body
    code, body = get("/v1/dashboard?page=20001")
    assert (code, body["field"]) == (400, "page"), body


def test_groups_are_listed_by_name_a_page_at_a_time(server: Server, browser: object) -> None:
    server.cli("sql", "; ".join(f"CREATE RESOURCE GROUP p{i:02d} RU_PER_SEC = 10" for i in range(55)))
    page = browser.new_page(viewport={"width": 1280, "height": 900})  # type: ignore[attr-defined]
    errors = watch(page)
    page.goto(server.http + "/")
    names = lambda: page.evaluate("[...document.querySelectorAll('#group-table tbody tr')].map(r => r.dataset.group)")  # noqa: E731
    page.wait_for_function("document.querySelectorAll('#group-table tbody tr').length === 50", timeout=BOUND_MS)
    assert names() == [f"p{i:02d}" for i in range(50)]
    assert "Groups 1 to 50 of 55" in page.locator("#groups-note").inner_text()
    page.click("#page-next")
    page.wait_for_function("document.querySelectorAll('#group-table tbody tr').length === 5", timeout=BOUND_MS)
    assert names() == [f"p{i:02d}" for i in range(50, 55)]
    assert page.locator("#page-next").is_hidden()
    page.click("#page-prev")
    page.wait_for_function("document.querySelectorAll('#group-table tbody tr').length === 50", timeout=BOUND_MS)
    # No group is in traffic: none is charted.
    assert page.evaluate("state.charts.size") == 0
    assert errors == [], errors
