"""The browser softphone (``/phone``) in headless Chromium with a fake microphone.

Chromium's fake capture device plays the speech fixture (looped) as the microphone:
the page admits a call with the admin key, streams 8 kHz μ-law from its AudioWorklet
on Twilio's wire, plays what comes back, echoes marks and obeys ``clear``. Checked:
the echo brain's reply arrives and the call is billed as ``phone``; over the realtime
brain (MOCK server) the caller's speech interrupts a reply (the page gets ``clear``);
hang-up ends the call. A screenshot is kept in tests/artifacts/.
"""

from __future__ import annotations

from pathlib import Path

from playwright.async_api import Page

from rutster.brains.echo import EchoBrain
from rutster.tools.launcher import LOOPBACK, free_port, realtime_brain_process
from rutster.tools.realtime_mock_server import MockRealtimeServer
from tests.browser import (  # noqa: F401  (chromium_executable is a pytest fixture)
    artifact_path,
    chromium_executable,
    launch_chromium,
    record_page_errors,
)
from tests.conftest import (
    SPEECH_WAV,
    TEST_ADMIN_KEY,
    RunningGateway,
    eventually,
    gateway_config,
    serve_gateway,
)

#: Chromium's fake microphone: the speech fixture, looped; no permission prompt; audio
#: may start without a gesture (the test clicks, but a headless run has no speakers).
FAKE_MIC_ARGS = (
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
    f"--use-file-for-fake-audio-capture={SPEECH_WAV}",
    "--autoplay-policy=no-user-gesture-required",
)


async def until(page: Page, condition: str, timeout_ms: int) -> None:
    """Poll ``condition`` (a JavaScript expression) in the page until it holds.

    Not ``wait_for_function``: the page's CSP forbids the ``eval`` that uses.
    """
    for _ in range(timeout_ms // 100):
        if await page.evaluate(f"() => Boolean({condition})"):
            return
        await page.wait_for_timeout(100)
    stats = await page.evaluate("() => JSON.stringify(window.rutsterPhone)")
    raise AssertionError(f"{condition} did not hold within {timeout_ms} ms: {stats}")


async def dial(page: Page, gateway: RunningGateway) -> None:
    await page.goto(f"{gateway.url}/phone")
    await page.fill("#key", TEST_ADMIN_KEY)
    await page.click("#call")
    await until(page, "window.rutsterPhone.sent > 25", 15_000)


async def test_the_softphone_hears_the_echo_brain_and_hangs_up(
    echo_brain: EchoBrain,
    chromium_executable: Path,  # noqa: F811
) -> None:
    async with (
        serve_gateway(gateway_config(echo_brain.url)) as gateway,
        launch_chromium(chromium_executable, FAKE_MIC_ARGS) as browser,
    ):
        page = await browser.new_page(viewport={"width": 1100, "height": 720})
        errors = record_page_errors(page)
        await dial(page, gateway)
        # The echo of the microphone's speech comes back and plays.
        await until(page, "window.rutsterPhone.received > 50", 20_000)
        await until(page, "window.rutsterPhone.marks > 0", 10_000)
        assert len(gateway.state.calls) == 1
        call = next(iter(gateway.state.calls.values()))
        assert call.context.provider == "phone"
        await page.wait_for_timeout(1_500)  # a spend poll or two for the picture
        await page.screenshot(path=str(artifact_path("phone.png")))
        await page.click("#hangup")
        await until(page, "window.rutsterPhone.ended === 1", 10_000)
        await eventually(lambda: not gateway.state.calls, 10)
        assert await page.text_content("#state") == "ended"
    assert not errors, errors


async def test_speaking_over_the_assistant_clears_its_reply_in_the_page(
    chromium_executable: Path,  # noqa: F811
) -> None:
    async with MockRealtimeServer(reply_ms=4_000) as mock:
        port = free_port()
        with realtime_brain_process(mock.websocket_base_url, port):
            config = gateway_config(f"ws://{LOOPBACK}:{port}/realtime")
            async with (
                serve_gateway(config) as gateway,
                launch_chromium(chromium_executable, FAKE_MIC_ARGS) as browser,
            ):
                page = await browser.new_page()
                errors = record_page_errors(page)
                await dial(page, gateway)
                # The looped speech has pauses: a turn ends, the mock answers 4 s of
                # voice, and the speech resuming over it is a barge-in.
                await until(page, "window.rutsterPhone.received > 10", 30_000)
                await until(page, "window.rutsterPhone.clears > 0", 40_000)
                await page.click("#hangup")
                await eventually(lambda: not gateway.state.calls, 10)
    assert not errors, errors
