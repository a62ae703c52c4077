"""The dashboard page's own logic, in real headless Chromium, against a scripted backend.

The backend here is test-only (``ScriptedDashboardBackend``): it serves the real static files
from ``gateway/dashboard/static`` and an SSE stream whose every byte the test writes, so the
page's SSE parsing, rendering, reconnects, login and kill-switch flow are checked exactly. The
end-to-end test against the real gateway lives elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Final

import pytest
import uvicorn
from playwright.async_api import Browser, Page, expect
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from rutster.gateway.dashboard import STATIC_DIR
from rutster.tools.launcher import LOOPBACK, free_port
from tests.browser import (  # noqa: F401  (chromium_* are pytest fixtures, used by name)
    artifact_path,
    chromium_browser,
    chromium_executable,
    record_page_errors,
)
from tests.conftest import eventually

ADMIN_KEY: Final = "rk_live_admin_0123456789abcdefghijklmnopq"
TENANT_KEY: Final = "rk_live_acme_0123456789abcdefghijklmnopqr"
#: The strict policy the gateway should serve the page with: the page must work under it.
PAGE_CSP: Final = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)
#: Playwright waits (ms) for the page to reflect a pushed snapshot; generous for a loaded CI box.
EXPECT_TIMEOUT_MS: Final = 5_000
#: How long to give the page to (wrongly) react to a partial event before checking it did not.
SETTLE_S: Final = 0.25


@dataclass
class StreamConnection:
    """One open ``/v1/dashboard/events`` response; the test feeds its bytes."""

    authorization: str
    chunks: asyncio.Queue[bytes | None] = field(default_factory=asyncio.Queue)


class ScriptedDashboardBackend:
    """Test-only backend: the real dashboard static files plus a scripted SSE stream.

    ``keys`` maps API keys to roles; a missing key gets the API's 401 error body. Every byte
    of the events stream comes from :meth:`send`; ``PUT /v1/admin/kill-switch`` is recorded.
    """

    def __init__(self, keys: dict[str, str]) -> None:
        self.keys = dict(keys)
        self.connections: list[StreamConnection] = []
        self.kill_switch_puts: list[tuple[str, Any]] = []
        self.kill_switch = False
        #: When set, the kill-switch PUT fails with this (status, message).
        self.kill_switch_failure: tuple[int, str] | None = None
        self.app = Starlette(
            routes=[
                Route("/dashboard", self.index),
                Mount("/dashboard/static", app=StaticFiles(directory=STATIC_DIR)),
                Route("/v1/dashboard/events", self.events),
                Route("/v1/admin/kill-switch", self.put_kill_switch, methods=["PUT"]),
            ]
        )

    @staticmethod
    def error(status: int, code: str, message: str) -> JSONResponse:
        return JSONResponse(
            {"error": {"code": code, "message": message, "field": None}}, status_code=status
        )

    def role_of(self, request: Request) -> str | None:
        header = request.headers.get("authorization", "")
        scheme, _, key = header.partition(" ")
        return self.keys.get(key) if scheme == "Bearer" else None

    async def index(self, request: Request) -> Response:
        return FileResponse(
            STATIC_DIR / "index.html",
            headers={"Content-Security-Policy": PAGE_CSP, "Cache-Control": "no-store"},
        )

    async def events(self, request: Request) -> Response:
        if self.role_of(request) is None:
            return self.error(401, "unauthorized", "unknown or revoked API key")
        connection = StreamConnection(request.headers["authorization"])
        self.connections.append(connection)

        async def body() -> AsyncIterator[bytes]:
            while (chunk := await connection.chunks.get()) is not None:
                yield chunk

        return StreamingResponse(
            body(), media_type="text/event-stream", headers={"Cache-Control": "no-store"}
        )

    async def put_kill_switch(self, request: Request) -> Response:
        role = self.role_of(request)
        if role is None:
            return self.error(401, "unauthorized", "unknown or revoked API key")
        if role != "admin":
            return self.error(403, "forbidden", "admin key required")
        body = await request.json()
        self.kill_switch_puts.append((request.headers["authorization"], body))
        if self.kill_switch_failure is not None:
            status, message = self.kill_switch_failure
            return self.error(status, "unavailable", message)
        self.kill_switch = bool(body["engaged"])
        return JSONResponse({"engaged": self.kill_switch})

    async def send(self, data: bytes | str) -> None:
        """Write raw bytes to the newest open stream."""
        assert self.connections, "no open events stream"
        self.connections[-1].chunks.put_nowait(data.encode() if isinstance(data, str) else data)
        await asyncio.sleep(0)

    async def send_snapshot(self, snapshot: dict[str, Any]) -> None:
        """One whole ``snapshot`` event."""
        await self.send(f"event: snapshot\ndata: {json.dumps(snapshot)}\n\n")

    def close_streams(self) -> None:
        """End every open stream (the page sees the server hang up)."""
        for connection in self.connections:
            connection.chunks.put_nowait(None)

    async def wait_connections(self, count: int, timeout_s: float = 5.0) -> StreamConnection:
        """Wait until ``count`` streams have been opened; return the newest."""
        await eventually(lambda: len(self.connections) >= count, timeout_s)
        return self.connections[-1]


@contextlib.asynccontextmanager
async def serve_backend(backend: ScriptedDashboardBackend) -> AsyncIterator[str]:
    """Run ``backend`` under uvicorn on a free loopback port; yields its base URL."""
    port = free_port()
    config = uvicorn.Config(
        backend.app,
        host=LOOPBACK,
        port=port,
        log_level="warning",
        lifespan="off",
        ws="none",
        access_log=False,
        timeout_graceful_shutdown=2,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    try:
        yield f"http://{LOOPBACK}:{port}"
    finally:
        backend.close_streams()
        server.should_exit = True
        await asyncio.wait_for(task, 10)


@dataclass
class DashboardRig:
    """A browser page, the scripted backend behind it, and the page's error log."""

    page: Page
    backend: ScriptedDashboardBackend
    url: str
    errors: list[str]

    async def login(self, key: str) -> None:
        await self.page.get_by_test_id("login-key").fill(key)
        await self.page.get_by_test_id("login-submit").click()


@pytest.fixture
async def rig(chromium_browser: Browser) -> AsyncIterator[DashboardRig]:  # noqa: F811
    backend = ScriptedDashboardBackend({ADMIN_KEY: "admin", TENANT_KEY: "tenant"})
    async with serve_backend(backend) as url:
        context = await chromium_browser.new_context(viewport={"width": 1280, "height": 900})
        page = await context.new_page()
        page.set_default_timeout(EXPECT_TIMEOUT_MS)
        errors = record_page_errors(page)
        await page.goto(f"{url}/dashboard")
        try:
            yield DashboardRig(page, backend, url, errors)
        finally:
            await context.close()


# ---------------------------------------------------------------------------------------------
# Snapshot builders (shapes from docs/SPEND.md, "The dashboard")


def hours(spent: Callable[[int], str]) -> list[dict[str, str]]:
    """24 hourly buckets, oldest first, ending at 12:00 on 2026-11-30."""
    out: list[dict[str, str]] = []
    for i in range(24):
        hour = (13 + i) % 24
        day = 29 if i < 11 else 30
        out.append({"hour": f"2026-11-{day}T{hour:02d}:00:00Z", "spent": spent(i)})
    return out


def tenant_entry(
    tenant_id: str, *, spent: str, reserved: str, budget: str | None, month_budget: str | None
) -> dict[str, Any]:
    return {
        "id": tenant_id,
        "today": {"spent": spent, "reserved": reserved, "budget": budget},
        "month": {"spent": "41.300000", "reserved": reserved, "budget": month_budget},
        "by_hour": hours(lambda i: f"0.{(i * 37) % 90 + 5:02d}0000"),
    }


def call_entry(
    call_id: str, *, spend: str, duration_s: float, tenant: str = "acme"
) -> dict[str, Any]:
    return {
        "id": call_id,
        "tenant": tenant,
        "provider": "twilio",
        "direction": "outbound",
        "brain": "support-bot",
        "state": "talking",
        "duration_s": duration_s,
        "spend": spend,
        "reserved": "0.072300",
    }


def snapshot(
    *,
    role: str = "tenant",
    calls: list[dict[str, Any]] | None = None,
    tenants: list[dict[str, Any]] | None = None,
    refusals: list[dict[str, Any]] | None = None,
    ended: list[dict[str, Any]] | None = None,
    kill_switch: bool = False,
    at: str = "2026-11-30T12:00:00Z",
) -> dict[str, Any]:
    return {
        "at": at,
        "role": role,
        "tenant": None if role == "admin" else "acme",
        "kill_switch": kill_switch,
        "active_calls": calls or [],
        "tenants": tenants
        if tenants is not None
        else [
            tenant_entry(
                "acme", spent="1.250000", reserved="0.072300", budget="5.00", month_budget="100"
            )
        ],
        "recent_refusals": refusals or [],
        "recent_ended": ended or [],
    }


async def session_key(page: Page) -> Any:
    return await page.evaluate("() => sessionStorage.getItem('rutster.dashboard.apiKey')")


# ---------------------------------------------------------------------------------------------
# Tests


async def test_login_then_a_call_appears_changes_and_ends(rig: DashboardRig) -> None:
    page, backend = rig.page, rig.backend
    await expect(page.get_by_test_id("login-view")).to_be_visible()
    await expect(page.get_by_test_id("dashboard")).to_be_hidden()

    await page.get_by_test_id("login-submit").click()
    await expect(page.get_by_test_id("login-message")).to_have_text("Enter an API key.")
    assert backend.connections == []

    await rig.login(TENANT_KEY)
    stream = await backend.wait_connections(1)
    assert stream.authorization == f"Bearer {TENANT_KEY}"
    assert await session_key(page) == TENANT_KEY
    await expect(page.get_by_test_id("connection-state")).to_have_text("reconnecting")

    await backend.send_snapshot(
        snapshot(calls=[call_entry("call_a1", spend="0.004200", duration_s=12.3)])
    )
    state = page.get_by_test_id("connection-state")
    await expect(state).to_have_text("live")
    await expect(state).to_have_attribute("data-state", "live")
    row = page.locator('[data-testid="call-row"][data-call-id="call_a1"]')
    await expect(row).to_be_visible()
    await expect(row.get_by_test_id("call-spend")).to_have_text("$0.0042")
    await expect(row.get_by_test_id("call-duration")).to_have_text("0:12")
    await expect(row.get_by_test_id("call-provider")).to_have_text("twilio (outbound)")

    # The tenant view: its own card, no kill switch.
    cards = page.get_by_test_id("tenant-card")
    await expect(cards).to_have_count(1)
    card = page.locator('[data-testid="tenant-card"][data-tenant="acme"]')
    await expect(card.get_by_test_id("tenant-today-figures")).to_have_text("$1.25 of $5.00")
    # (1.25 + 0.0723) / 5 = 26.446 % -> 2644 basis points, in integer micros.
    await expect(card.get_by_test_id("tenant-today-meter")).to_have_attribute(
        "data-used-bp", "2644"
    )
    await expect(card.get_by_test_id("hour-bar")).to_have_count(24)
    await expect(card.get_by_test_id("budget-line")).to_have_count(1)
    await expect(page.get_by_test_id("role")).to_have_text("tenant acme")
    await expect(page.get_by_test_id("kill-switch")).to_have_count(0)
    await expect(page.get_by_test_id("kill-switch-banner")).to_be_hidden()

    # Same row element, new numbers (keyed update, not a rebuilt table).
    await row.evaluate("node => { node.dataset.marker = 'kept'; }")
    await backend.send_snapshot(
        snapshot(calls=[call_entry("call_a1", spend="0.012345", duration_s=73.9)])
    )
    await expect(row.get_by_test_id("call-spend")).to_have_text("$0.012345")
    await expect(row.get_by_test_id("call-duration")).to_have_text("1:13")
    await expect(row).to_have_attribute("data-marker", "kept")

    await backend.send_snapshot(
        snapshot(
            ended=[
                {
                    "at": "2026-11-30T12:00:02Z",
                    "id": "call_a1",
                    "tenant": "acme",
                    "reason": "max_duration",
                    "spent": "0.012345",
                }
            ]
        )
    )
    await expect(page.get_by_test_id("call-row")).to_have_count(0)
    await expect(page.get_by_test_id("active-calls")).to_contain_text("No active calls")
    ended = page.get_by_test_id("ended").locator('[data-call-id="call_a1"]')
    await expect(ended).to_contain_text("max_duration")
    await expect(ended).to_contain_text("$0.012345")
    await expect(ended).to_contain_text("12:00:02")

    # A reload keeps the key (sessionStorage) and reconnects without the login form.
    await page.reload()
    stream = await backend.wait_connections(2)
    assert stream.authorization == f"Bearer {TENANT_KEY}"
    await expect(page.get_by_test_id("login-view")).to_be_hidden()
    await backend.send_snapshot(snapshot(kill_switch=True))
    await expect(page.get_by_test_id("connection-state")).to_have_text("live")
    # A tenant is told about an engaged kill switch but gets no toggle.
    await expect(page.get_by_test_id("kill-switch-banner")).to_be_visible()
    await expect(page.get_by_test_id("kill-switch")).to_have_count(0)
    assert rig.errors == []


async def test_chunk_split_events_keepalives_and_bad_input(rig: DashboardRig) -> None:
    page, backend = rig.page, rig.backend
    await rig.login(TENANT_KEY)
    await backend.wait_connections(1)
    await backend.send(": keepalive\n\n")
    await backend.send_snapshot(snapshot())
    await expect(page.get_by_test_id("connection-state")).to_have_text("live")
    await expect(page.get_by_test_id("refusals")).to_contain_text("No refusals.")

    hostile = "Zoë <img src=x onerror=alert(1)>"
    refusal = {"at": "2026-11-30T12:00:09Z", "tenant": "acme", "reason": "budget_day"}
    data = json.dumps(snapshot(refusals=[{**refusal, "caller": hostile}]), ensure_ascii=False)
    # CR LF line endings, the JSON over two data lines, a comment inside the event.
    half = data.index('"recent_refusals"')
    event = (
        f"event: snapshot\r\ndata: {data[:half]}\r\n: keepalive\r\ndata: {data[half:]}\r\n\r\n"
    ).encode()
    umlaut = event.index("ë".encode())
    last_break = len(event) - 2
    # Split inside the two-byte "ë", between a CR and its LF, and before the blank line's CR LF
    # (a CR alone already ends a line, so the event is complete only with the last chunk).
    cuts = [0, umlaut + 1, event.index(b"\r\n", umlaut) + 1, last_break, len(event)]
    for start, end in itertools.pairwise(cuts[:-1]):
        await backend.send(event[start:end])
        await asyncio.sleep(SETTLE_S)
        await expect(page.get_by_test_id("refusal")).to_have_count(0)
    await backend.send(event[cuts[-2] :])
    item = page.get_by_test_id("refusal")
    await expect(item).to_have_count(1)
    await expect(item).to_contain_text(hostile)
    await expect(item).to_contain_text("budget_day")
    # Server text is text, never markup.
    assert await page.locator("img").count() == 0

    # A malformed snapshot is dropped and counted; the stream stays live and goes on.
    await backend.send("event: snapshot\ndata: {not json\n\n")
    await backend.send('event: snapshot\ndata: ["an array"]\n\n')
    await backend.send("event: something-new\ndata: {}\n\n")  # unknown type: ignored
    await expect(page.get_by_test_id("dropped-events")).to_have_text("2")
    await backend.send_snapshot(
        snapshot(calls=[call_entry("call_b2", spend="not-money", duration_s=-1)])
    )
    row = page.locator('[data-testid="call-row"][data-call-id="call_b2"]')
    await expect(row.get_by_test_id("call-spend")).to_have_text("—")
    await expect(row.get_by_test_id("call-duration")).to_have_text("—")
    await expect(page.get_by_test_id("connection-state")).to_have_text("live")
    assert rig.errors == []


PARSER_CHECK_JS: Final = """
async () => {
  const m = await import('/dashboard/static/dashboard.js');
  const text =
    ': hello\\n\\n' +
    'event: snapshot\\r\\ndata: {"a":"caf\u00e9 \U0001f4de"}\\r\\n\\r\\n' +
    'data: line one\\rdata: line two\\r\\r' +
    'id: 7\\nretry: 1500\\ndata\\ndata:no-space\\n\\n' +
    'event: ignored-without-data\\n\\n' +
    'event: tail\\ndata: unterminated';
  const bytes = new TextEncoder().encode(text);
  const run = (chunks) => {
    const parser = new m.SseParser();
    const events = [];
    for (const chunk of chunks) events.push(...parser.push(chunk));
    return {events, retry: parser.retryMs, comments: parser.comments};
  };
  const whole = run([bytes]);
  const mismatches = [];
  for (let i = 1; i < bytes.length; i++) {
    const split = run([bytes.slice(0, i), bytes.slice(i)]);
    if (JSON.stringify(split) !== JSON.stringify(whole)) mismatches.push(i);
  }
  const single = run(Array.from(bytes, (b) => Uint8Array.of(b)));
  const small = new m.SseParser({maxLineChars: 16});
  const kept = [
    ...small.push('data: ' + 'x'.repeat(40)),
    ...small.push('x\\ndata: more of the same event\\n\\n'),
    ...small.push('data: ok\\n\\n'),
  ];
  return {
    whole, mismatches, singleSame: JSON.stringify(single) === JSON.stringify(whole),
    oversized: {events: kept, count: small.oversizedLines},
  };
}
"""

MONEY_CHECK_JS: Final = """
async () => {
  const m = await import('/dashboard/static/dashboard.js');
  const fmt = ['0.004200', '0.014', '12.5', '1234567.000001', '0', '0.000050', '5',
               '1e3', '-1', '0.0000001', '', ' 1', 'NaN', null, 3].map(m.formatUsd);
  return {
    fmt,
    sum: m.formatMicros(m.sumMicros(['0.1', '0.2', 'junk'])),
    bp: [m.basisPoints(m.parseMicros('1.322300'), m.parseMicros('5')),
         m.basisPoints(7n, 0n)],
    pct: m.formatBasisPoints(2644),
    durations: [m.formatDuration(0), m.formatDuration(59.99), m.formatDuration(3723),
                m.formatDuration(NaN)],
  };
}
"""


async def test_sse_parser_and_money_helpers_in_the_browser(rig: DashboardRig) -> None:
    """The page's own parser and money formatting, run by Chromium, split at every byte."""
    result = await rig.page.evaluate(PARSER_CHECK_JS)
    assert result["mismatches"] == []
    assert result["singleSame"] is True
    assert result["whole"] == {
        "events": [
            {"type": "snapshot", "data": '{"a":"café 📞"}', "lastEventId": ""},
            {"type": "message", "data": "line one\nline two", "lastEventId": ""},
            {"type": "message", "data": "\nno-space", "lastEventId": "7"},
        ],
        "retry": 1500,
        "comments": 1,
    }
    assert result["oversized"] == {
        "events": [{"type": "message", "data": "ok", "lastEventId": ""}],
        "count": 1,
    }

    money = await rig.page.evaluate(MONEY_CHECK_JS)
    assert money["fmt"] == [
        "$0.0042",
        "$0.014",
        "$12.50",
        "$1,234,567.000001",
        "$0.00",
        "$0.00005",
        "$5.00",
        "—",
        "—",
        "—",
        "—",
        "—",
        "—",
        "—",
        "—",
    ]
    assert money["sum"] == "$0.30"  # 0.1 + 0.2 in floats would be 0.30000000000000004
    assert money["bp"] == [2644, 0]
    assert money["pct"] == "26.4 %"
    assert money["durations"] == ["0:00", "0:59", "1:02:03", "—"]
    assert rig.errors == []


async def test_admin_kill_switch_round_trip(rig: DashboardRig) -> None:
    page, backend = rig.page, rig.backend
    await rig.login(ADMIN_KEY)
    await backend.wait_connections(1)
    tenants = [
        tenant_entry(
            "acme", spent="3.912000", reserved="0.216900", budget="5.00", month_budget="100"
        ),
        tenant_entry(
            "globex", spent="0.480250", reserved="0.072300", budget=None, month_budget=None
        ),
    ]
    calls = [
        call_entry("call_7f3a9c", spend="0.084512", duration_s=311.2),
        call_entry("call_7f3b02", spend="0.031870", duration_s=95.0),
        call_entry("call_91de44", spend="0.002210", duration_s=4.1, tenant="globex"),
    ]
    refusals = [
        {"at": "2026-11-30T11:59:41Z", "tenant": "acme", "reason": "budget_day", "caller": None},
        {
            "at": "2026-11-30T11:58:02Z",
            "tenant": "globex",
            "reason": "caller_rate",
            "caller": "+15550100",
        },
    ]
    ended = [
        {"at": "2026-11-30T11:59:58Z", "id": "call_6b21e0", "tenant": "acme",
         "reason": "hangup", "spent": "0.142300"},
        {"at": "2026-11-30T11:57:12Z", "id": "call_5c0f11", "tenant": "globex",
         "reason": "budget_exhausted", "spent": "0.500000"},
    ]  # fmt: skip
    rich: dict[str, Any] = {
        "role": "admin",
        "tenants": tenants,
        "calls": calls,
        "refusals": refusals,
        "ended": ended,
    }
    await backend.send_snapshot(snapshot(**rich))
    await expect(page.get_by_test_id("tenant-card")).to_have_count(2)
    await expect(page.get_by_test_id("call-row")).to_have_count(3)
    await expect(page.get_by_test_id("role")).to_have_text("admin")
    globex = page.locator('[data-testid="tenant-card"][data-tenant="globex"]')
    await expect(globex.get_by_test_id("budget-line")).to_have_count(0)
    await expect(globex.get_by_test_id("tenant-today-figures")).to_have_text(
        "$0.48025 spent · no budget"
    )

    toggle = page.get_by_test_id("kill-switch")
    confirm = page.get_by_test_id("kill-switch-confirm")
    await expect(toggle).to_have_attribute("data-engaged", "false")
    await expect(confirm).to_have_count(0)

    # First click only arms; cancel disarms; nothing is sent.
    await toggle.click()
    await expect(confirm).to_be_visible()
    await page.get_by_test_id("kill-switch-cancel").click()
    await expect(confirm).to_have_count(0)
    await asyncio.sleep(SETTLE_S)
    assert backend.kill_switch_puts == []

    # Click, confirm: one PUT with the admin key; the button waits for the server's snapshot.
    await toggle.click()
    await confirm.click()
    await eventually(lambda: bool(backend.kill_switch_puts))
    assert backend.kill_switch_puts == [(f"Bearer {ADMIN_KEY}", {"engaged": True})]
    status = page.get_by_test_id("kill-switch-status")
    await expect(status).to_contain_text("waiting for the server")
    await expect(toggle).to_have_attribute("data-engaged", "false")
    await backend.send_snapshot(snapshot(**rich, kill_switch=backend.kill_switch))
    await expect(toggle).to_have_attribute("data-engaged", "true")
    await expect(status).to_have_count(0)
    await expect(page.get_by_test_id("kill-switch-banner")).to_be_visible()
    await page.screenshot(path=artifact_path("dashboard-page.png"), full_page=True)

    # Releasing goes the same way; a server error is shown and the state does not move.
    backend.kill_switch_failure = (503, "spend store unavailable")
    await toggle.click()
    await confirm.click()
    await expect(status).to_contain_text("spend store unavailable (HTTP 503)")
    assert backend.kill_switch_puts[-1] == (f"Bearer {ADMIN_KEY}", {"engaged": False})
    await expect(toggle).to_have_attribute("data-engaged", "true")
    backend.kill_switch_failure = None
    await toggle.click()
    await confirm.click()
    await expect(status).to_contain_text("waiting for the server")
    await backend.send_snapshot(snapshot(**rich, kill_switch=backend.kill_switch))
    await expect(toggle).to_have_attribute("data-engaged", "false")
    await expect(page.get_by_test_id("kill-switch-banner")).to_be_hidden()
    assert len(backend.kill_switch_puts) == 3
    # The page asked for nothing it was not told to: 503 above is a fetch error on the console.
    assert [e for e in rig.errors if "status of 503" not in e] == []


async def test_reconnect_then_401_returns_to_login(rig: DashboardRig) -> None:
    page, backend = rig.page, rig.backend
    await rig.login("rk_live_wrong")
    await expect(page.get_by_test_id("login-view")).to_be_visible()
    await expect(page.get_by_test_id("login-message")).to_contain_text("unknown or revoked API key")
    assert await session_key(page) is None

    await rig.login(TENANT_KEY)
    await backend.wait_connections(1)
    await backend.send_snapshot(snapshot(calls=[call_entry("call_c3", spend="0.1", duration_s=1)]))
    state = page.get_by_test_id("connection-state")
    await expect(state).to_have_text("live")

    # The server hangs up: reconnecting, a new stream with the same key, live again.
    backend.close_streams()
    await expect(state).to_have_text("reconnecting")
    stream = await backend.wait_connections(2)
    assert stream.authorization == f"Bearer {TENANT_KEY}"
    await backend.send_snapshot(snapshot())
    await expect(state).to_have_text("live")

    # The key is revoked: the next reconnect gets 401 and the page returns to the login form.
    del backend.keys[TENANT_KEY]
    backend.close_streams()
    await expect(page.get_by_test_id("login-view")).to_be_visible()
    await expect(page.get_by_test_id("dashboard")).to_be_hidden()
    await expect(page.get_by_test_id("login-message")).to_have_text(
        "Key rejected: unknown or revoked API key (HTTP 401)"
    )
    await expect(page.get_by_test_id("call-row")).to_have_count(0)
    assert await session_key(page) is None
    assert [e for e in rig.errors if "status of 401" not in e] == []
