"""The spend dashboard end to end: real headless Chromium against a real gateway under uvicorn.

A simulated Twilio caller talks to the in-process echo brain through the gateway (per-second
prices, 200 ms meter tick: :func:`tests.conftest.fast_spend_settings`), while the dashboard page
(the real static files, the real SSE feed, the real Redis-backed spend store) is watched in the
browser: the live call and its spend ticking up, the tenant's card, the call ending, the kill
switch engaged from the page and the next call refused. A second test checks what tenant keys
see. The page's own logic against scripted snapshots is tested in ``test_dashboard_page.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Final

import httpx
from playwright.async_api import Browser, BrowserContext, Expect, Locator, Page

from rutster.brains.echo import EchoBrain
from rutster.tools.twilio_simulator import (
    SIM_FRAME_BYTES,
    SIM_SAMPLE_RATE,
    SimulatedCallResult,
    TwilioSimulator,
    new_sid,
)
from tests.browser import (  # noqa: F401  (chromium_* are pytest fixtures, used by name)
    artifact_path,
    chromium_browser,
    chromium_executable,
    record_page_errors,
)
from tests.conftest import (
    FAST_MICROS_PER_MINUTE,
    TEST_ADMIN_KEY,
    TEST_AUTH_TOKEN,
    RunningGateway,
    fast_spend_settings,
    gateway_config,
    serve_gateway,
)

#: Playwright waits (ms) for the page to show what the gateway did. The feed pushes a snapshot
#: every DASHBOARD_PUSH_S = 1 s, so anything should show within ~2 s; 8 s covers a loaded box.
EXPECT_TIMEOUT_MS: Final = 8_000
#: This module's ``expect`` waits EXPECT_TIMEOUT_MS (a module-local instance: Playwright's shared
#: ``expect.set_options`` would change every other browser test too).
expect: Final = Expect()
expect.set_options(timeout=EXPECT_TIMEOUT_MS)
#: How long the gateway may take to register a placed call (webhook, media socket, start).
LIVE_CALL_TIMEOUT_S: Final = 5.0
#: Caller speech of the admin test's call: long enough to watch the spend tick twice after the
#: row appears (≤ 2 s to appear, ~1 s per tick), short enough to keep the test near 15 s.
ADMIN_CALL_SPEECH_S: Final = 7
#: Caller speech of the tenant test's call (only visibility is checked there).
TENANT_CALL_SPEECH_S: Final = 6
#: Silence the simulated caller waits after the speech before hanging up (echo still arriving).
CALL_TAIL_S: Final = 0.8
#: How many times the live spend must be seen to rise (the acceptance criterion says twice).
SPEND_TICKS: Final = 2
#: Day budget set on tenant "default", so the card shows a budget meter (any amount far above
#: what a few seconds at 0.60 USD/min cost does).
DAY_BUDGET: Final = "5.00"
#: Micro-dollars per second of a call at the fast test price (0.60 USD a minute, per second).
MICROS_PER_SECOND: Final = FAST_MICROS_PER_MINUTE // 60
#: Fresh snapshots to wait for before asserting that a page does NOT show something: the first
#: one after a moment may have been computed just before it, the second surely was not.
FRESH_SNAPSHOTS: Final = 2
#: The page's money display ("$1,234.50", "$0.0042"): at least 2 and at most 6 decimals.
SHOWN_MONEY: Final = re.compile(r"^\$(\d{1,3}(?:,\d{3})*)\.(\d{2,6})$")
#: Numbers of the simulated callers (E.164, the 555 fiction range).
CALLER: Final = "+15551230000"
REFUSED_CALLER: Final = "+15551239999"
OUR_NUMBER: Final = "+15559870000"
#: Tenant of inbound calls on numbers without a mapping (RUTSTER_DEFAULT_TENANT's default).
DEFAULT_TENANT: Final = "default"
OTHER_TENANT: Final = "other"


def shown_micros(text: str | None) -> int:
    """Micro-dollars of a money amount as the page displays it; AssertionError if it is not one."""
    match = SHOWN_MONEY.fullmatch((text or "").strip())
    assert match is not None, f"not a displayed money amount: {text!r}"
    amount = Decimal(f"{match[1].replace(',', '')}.{match[2]}") * 1_000_000
    assert amount == amount.to_integral_value(), text
    return int(amount)


def speech(pcm: bytes, seconds: int) -> bytes:
    """The first ``seconds`` of the speech fixture (PCM16 8 kHz)."""
    return pcm[: seconds * SIM_SAMPLE_RATE * 2]


def call_row(page: Page, call_id: str) -> Locator:
    """The active-calls row of ``call_id``."""
    return page.locator(f'[data-testid="call-row"][data-call-id="{call_id}"]')


def ended_item(page: Page, call_id: str) -> Locator:
    """The recently-ended entry of ``call_id``."""
    return page.locator(f'[data-testid="ended-call"][data-call-id="{call_id}"]')


def tenant_card(page: Page, tenant: str) -> Locator:
    """The card of ``tenant``."""
    return page.locator(f'[data-testid="tenant-card"][data-tenant="{tenant}"]')


async def open_dashboard(
    context: BrowserContext, base_url: str, key: str
) -> tuple[Page, list[str]]:
    """A page on ``/dashboard`` logged in with ``key`` and live; returns it and its error log."""
    page = await context.new_page()
    page.set_default_timeout(EXPECT_TIMEOUT_MS)
    errors = record_page_errors(page)
    await page.goto(f"{base_url}/dashboard")
    await page.get_by_test_id("login-key").fill(key)
    await page.get_by_test_id("login-submit").click()
    await expect(page.get_by_test_id("connection-state")).to_have_attribute("data-state", "live")
    return page, errors


async def fresh_snapshots(page: Page, count: int = FRESH_SNAPSHOTS) -> None:
    """Wait until ``page`` has rendered ``count`` more snapshots (its "updated" time changed)."""
    stamp = page.get_by_test_id("snapshot-at")
    for _ in range(count):
        before = await stamp.text_content()
        await expect(stamp).not_to_have_text(before or "")


async def create_key(gateway: RunningGateway, tenant: str) -> str:
    """A tenant API key issued through ``POST /v1/admin/keys`` with the admin key."""
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        response = await client.post(
            "/v1/admin/keys",
            json={"tenant": tenant, "label": "dashboard e2e"},
            headers={"Authorization": f"Bearer {TEST_ADMIN_KEY}"},
        )
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["tenant"] == tenant and body["role"] == "tenant"
    key = body["key"]
    assert isinstance(key, str) and key.startswith("rk_live_")
    return key


@contextlib.asynccontextmanager
async def simulated_call(
    gateway: RunningGateway, pcm: bytes
) -> AsyncIterator[asyncio.Task[SimulatedCallResult]]:
    """A simulated inbound Twilio call running as a task for the block (cancelled if left)."""
    simulator = TwilioSimulator(gateway.url, auth_token=TEST_AUTH_TOKEN)
    task = asyncio.create_task(
        simulator.place_call(pcm, from_=CALLER, to=OUR_NUMBER, tail_s=CALL_TAIL_S)
    )
    try:
        yield task
    finally:
        if not task.done():
            task.cancel()
        # Leaving early means the test already failed: that failure is the one to report, not
        # whatever the cancelled simulator raises on its way out.
        await asyncio.gather(task, return_exceptions=True)


async def live_call_id(gateway: RunningGateway, task: asyncio.Task[SimulatedCallResult]) -> str:
    """The public id (``call_…``) of the one call the gateway holds, once it holds it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + LIVE_CALL_TIMEOUT_S
    while not gateway.state.calls_by_id:
        if task.done():
            task.result()  # the simulator's own error, if it failed
            raise AssertionError("the simulated call ended before the gateway registered it")
        assert loop.time() < deadline, "the gateway did not register the simulated call"
        await asyncio.sleep(0.02)
    (call_id,) = gateway.state.calls_by_id
    assert call_id.startswith("call_"), call_id
    return call_id


async def test_admin_watches_live_spend_and_kills_new_calls(
    chromium_browser: Browser,  # noqa: F811
    echo_brain: EchoBrain,
    speech_pcm: bytes,
) -> None:
    config = gateway_config(echo_brain.url, barge_in=False, spend=fast_spend_settings())
    async with serve_gateway(config) as gateway:
        async with httpx.AsyncClient(base_url=gateway.url) as client:
            response = await client.put(
                f"/v1/tenants/{DEFAULT_TENANT}/limits",
                json={"budget_day": DAY_BUDGET},
                headers={"Authorization": f"Bearer {TEST_ADMIN_KEY}"},
            )
            assert response.status_code == 200, response.text
        context = await chromium_browser.new_context(viewport={"width": 1280, "height": 1000})
        try:
            page, errors = await open_dashboard(context, gateway.url, TEST_ADMIN_KEY)
            kill_switch = page.get_by_test_id("kill-switch")
            await expect(kill_switch).to_have_attribute("data-engaged", "false")
            await expect(page.get_by_test_id("role")).to_have_text("admin")

            # 1. A live call: its row, its spend ticking up, the tenant's reservation.
            pcm = speech(speech_pcm, ADMIN_CALL_SPEECH_S)
            async with simulated_call(gateway, pcm) as call_task:
                call_id = await live_call_id(gateway, call_task)
                row = call_row(page, call_id)
                await expect(row).to_be_visible()
                await expect(row.get_by_test_id("call-tenant")).to_have_text(DEFAULT_TENANT)
                spend_cell = row.get_by_test_id("call-spend")
                shown = await spend_cell.text_content()
                seen = [shown_micros(shown)]
                for _ in range(SPEND_TICKS):
                    await expect(spend_cell).not_to_have_text(shown or "")
                    shown = await spend_cell.text_content()
                    seen.append(shown_micros(shown))
                    assert seen[-1] > seen[-2], f"live spend went {seen[-2]} -> {seen[-1]}"
                card = tenant_card(page, DEFAULT_TENANT)
                await expect(card.get_by_test_id("tenant-today-figures")).to_have_text(
                    re.compile(rf" of \${re.escape(DAY_BUDGET)}$")
                )
                foot = (
                    await card.get_by_test_id("tenant-today").locator(".budget-foot").inner_text()
                )
                reserved = re.search(r"incl\. (\S+) reserved", foot)
                assert reserved is not None, foot
                assert shown_micros(reserved[1]) > 0, foot
                await page.screenshot(path=artifact_path("dashboard-e2e.png"), full_page=True)

                # 2. The call ends: gone from the table, listed as ended, spend settled.
                result = await call_task
            # One μ-law byte per PCM16 sample: every 20 ms frame of the speech was sent.
            assert result.frames_sent == len(pcm) // 2 // SIM_FRAME_BYTES
            assert not result.hung_up_by_provider
            await expect(row).to_have_count(0)
            ended = ended_item(page, call_id)
            await expect(ended).to_be_visible()
            await expect(ended).to_contain_text("caller_hangup")
            await expect(ended).to_contain_text(DEFAULT_TENANT)
            ended_text = await ended.locator(".money").text_content()
            spent = shown_micros(ended_text)
            assert gateway.state.spend_store is not None
            record = await gateway.state.spend_store.get_call(call_id)
            assert record is not None and record["spent"] == spent, (record, spent)
            # Billed per second from the stream's start: at least the whole speech.
            assert spent >= max(seen[-1], ADMIN_CALL_SPEECH_S * MICROS_PER_SECOND), (spent, seen)
            # The tenant's card and chart carry the settled spend (same formatter, same micros).
            await expect(card.get_by_test_id("tenant-today-figures")).to_have_text(
                f"{ended_text} of ${DAY_BUDGET}"
            )
            bars = await card.get_by_test_id("hour-bar").evaluate_all(
                "bars => bars.map(bar => bar.getAttribute('data-spent'))"
            )
            assert sum(shown_micros(bar) for bar in bars) == spent, bars

            # 3. The kill switch, engaged from the page (two steps), refuses the next call.
            await kill_switch.click()
            await page.get_by_test_id("kill-switch-confirm").click()
            await expect(kill_switch).to_have_attribute("data-engaged", "true")
            await expect(page.get_by_test_id("kill-switch-banner")).to_be_visible()
            simulator = TwilioSimulator(gateway.url, auth_token=TEST_AUTH_TOKEN)
            response = await simulator.post_voice_webhook(
                new_sid("CA"), from_=REFUSED_CALLER, to=OUR_NUMBER
            )
            assert response.status_code == 200, response.text
            twiml = ET.fromstring(response.text)
            assert twiml.find("Reject") is not None and twiml.find("Connect") is None, twiml
            refusal = page.get_by_test_id("refusal").filter(has_text="kill_switch")
            await expect(refusal).to_have_count(1)
            await expect(refusal).to_contain_text(DEFAULT_TENANT)
            await expect(refusal).to_contain_text(REFUSED_CALLER)
            # Checked at once, not awaited: the refusal's snapshot would also carry its call.
            assert await page.get_by_test_id("call-row").count() == 0
            assert not gateway.state.calls
            await page.screenshot(path=artifact_path("dashboard-e2e-refused.png"), full_page=True)
            assert errors == []
        finally:
            # Closing the page ends its SSE stream, so uvicorn can shut down.
            await context.close()


async def test_tenant_keys_see_only_their_own_calls(
    chromium_browser: Browser,  # noqa: F811
    echo_brain: EchoBrain,
    speech_pcm: bytes,
) -> None:
    config = gateway_config(echo_brain.url, barge_in=False, spend=fast_spend_settings())
    async with serve_gateway(config) as gateway:
        own_key = await create_key(gateway, DEFAULT_TENANT)
        other_key = await create_key(gateway, OTHER_TENANT)
        own_context = await chromium_browser.new_context()
        other_context = await chromium_browser.new_context()
        try:
            own, own_errors = await open_dashboard(own_context, gateway.url, own_key)
            other, other_errors = await open_dashboard(other_context, gateway.url, other_key)
            await expect(own.get_by_test_id("role")).to_have_text(f"tenant {DEFAULT_TENANT}")
            await expect(other.get_by_test_id("role")).to_have_text(f"tenant {OTHER_TENANT}")

            pcm = speech(speech_pcm, TENANT_CALL_SPEECH_S)
            async with simulated_call(gateway, pcm) as call_task:
                call_id = await live_call_id(gateway, call_task)
                # The call's tenant sees it, its own card only, and no kill switch.
                await expect(call_row(own, call_id)).to_be_visible()
                await expect(own.get_by_test_id("tenant-card")).to_have_count(1)
                await expect(tenant_card(own, DEFAULT_TENANT)).to_be_visible()
                # Absence is checked at once (an awaited "count 0" would pass on a later,
                # emptier snapshot), on pages that have rendered snapshots of the live call.
                assert await own.get_by_test_id("kill-switch").count() == 0
                assert await own.get_by_test_id("kill-switch-confirm").count() == 0
                # Another tenant, with snapshots taken while the call is live, sees none of it.
                await fresh_snapshots(other)
                assert await other.get_by_test_id("call-row").count() == 0
                assert await other.get_by_test_id("active-count").text_content() == "0 calls"
                cards = other.get_by_test_id("tenant-card")
                assert await cards.evaluate_all("cs => cs.map(c => c.dataset.tenant)") == [
                    OTHER_TENANT
                ]
                assert await other.get_by_test_id("kill-switch").count() == 0
                assert call_id in gateway.state.calls_by_id, "the call ended too soon to prove it"
                await expect(call_row(own, call_id)).to_be_visible()
                await call_task

            await expect(call_row(own, call_id)).to_have_count(0)
            await expect(ended_item(own, call_id)).to_be_visible()
            await fresh_snapshots(other)
            assert await other.get_by_test_id("ended-call").count() == 0
            assert call_id not in await other.locator("body").inner_text()
            assert own_errors == [] and other_errors == []
        finally:
            await own_context.close()
            await other_context.close()
