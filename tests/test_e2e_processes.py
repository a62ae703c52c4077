"""Acceptance tests: the gateway under uvicorn and the echo brain, each in its own process.

Three simultaneous simulated Twilio calls of recorded speech must come back as
the same speech (8k → 24k → 8k) with paced outbound frames; killing the brain
mid-call must not end the call, and audio must flow again once it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.exceptions import ConnectionClosed

from rutster.base.backoff import TAP_RECONNECT_DELAYS_S
from rutster.media.pacer import DEFAULT_LEAD_MS
from rutster.protocols.tap import Hello, SessionEnd
from rutster.tools.launcher import LOOPBACK, Service, echo_brain_process, gateway_process, spawn
from rutster.tools.twilio_simulator import (
    TwilioSimulator,
    best_lag_correlation,
    connected_message,
    echo_windows,
    new_sid,
    start_message,
)
from tests.conftest import eventually
from tests.echo_checks import (
    ECHO_SHORTFALL,
    MAX_LASTING_STEP_SAMPLES,
    assert_echo_intact,
    transient_steps_only,
)
from tests.realtime_echo import realtime_echo

#: Slack on the pacing check: one event-loop hop on a loaded 2-core CI machine.
PACING_SLACK_MS = 10.0
#: Most pacer wake-ups per frame sent. A frame's arrival wakes the pacer and the
#: frame's deadline may wake it again, plus one re-armed wait when the event loop's
#: millisecond timer fired early (gateway/call.py MIN_PACER_WAIT_S). Measured on this
#: test's three calls (2-core dev VM, 2026-12-06): 1.06, and 2.09 with both cores
#: busy, with that floor; 12.2 and 15.4 without it, when the pacer re-armed 0 ms
#: timers until each deadline passed.
MAX_POLLS_PER_FRAME = 4.0
#: The killed-brain call: long enough that a brain needing ~6 s to start again (seen on
#: a loaded 2-core CI machine) still leaves seconds of echo to judge after it reconnects.
KILLED_BRAIN_CALL_S = 18
#: After the reconnect attempt: the dial and the first echoed audio reaching the caller.
RECONNECT_SLACK_S = 1.0
#: At least this much speech after the reconnect, or the test cannot judge the echo.
MIN_JUDGED_S = 3.0


async def settled_metrics(url: str, timeout_s: float = 5.0) -> dict[str, float]:
    """Metrics once the gateway has finished ending its calls."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        values = metrics(url)
        if values["rutster_active_calls"] == 0 or asyncio.get_running_loop().time() > deadline:
            return values
        await asyncio.sleep(0.05)


def metrics(url: str) -> dict[str, float]:
    totals: dict[str, float] = {}
    text = httpx.get(f"{url}/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


@dataclass
class Stack:
    url: str
    token: str
    brain: Service


@pytest.fixture
def stack() -> Iterator[Stack]:
    """Gateway and echo brain, each in its own process, on free loopback ports."""
    token = secrets.token_urlsafe(16)
    with echo_brain_process() as brain:
        env = {
            "RUTSTER_TAP_URL": f"ws://{LOOPBACK}:{brain.port}/echo",
            "RUTSTER_BARGE_IN": "off",  # the echo brain talks over the caller by design
            "TWILIO_AUTH_TOKEN": token,
            "RUTSTER_STREAM_SECRET": secrets.token_urlsafe(32),
        }
        with gateway_process(env) as gateway:
            yield Stack(f"http://{LOOPBACK}:{gateway.port}", token, brain)


@realtime_echo
async def test_three_simultaneous_calls_echo_the_speech(stack: Stack, speech_pcm: bytes) -> None:
    url, token = stack.url, stack.token
    pcm = speech_pcm[: 8 * 8000 * 2]
    sims = [TwilioSimulator(url, auth_token=token) for _ in range(3)]
    results = await asyncio.gather(*(s.place_call(pcm, tail_s=1.0) for s in sims))
    for result in results:
        # Judged window by window: a stall on this loaded 2-core box may cost a short
        # step in delay, which must be won back (tests/echo_checks.py).
        lag = assert_echo_intact(pcm, result)
        assert lag / 8 < 300, f"round trip {lag / 8} ms"
        # Paced: Twilio never holds more than the lead (no burst).
        assert result.max_queue_ms <= DEFAULT_LEAD_MS + PACING_SLACK_MS
        assert result.media_received >= result.frames_sent - 5
    final = await settled_metrics(url)
    assert final["rutster_calls_total"] == 3
    assert final["rutster_active_calls"] == 0
    assert final["rutster_call_tasks"] == 0
    assert final.get("rutster_signature_failures_total", 0.0) == 0
    # The pacer wakes for frames, not in a spin at each deadline.
    polls_per_frame = final["rutster_pacer_polls_total"] / final["rutster_frames_out_total"]
    assert polls_per_frame <= MAX_POLLS_PER_FRAME, f"{polls_per_frame:.2f} pacer polls a frame"


@realtime_echo
async def test_brain_killed_mid_call_comes_back(stack: Stack, speech_pcm: bytes) -> None:
    # The echo after the reconnect is judged in real time (tests/realtime_echo.py): a
    # clean-clone CI run at a254e0f failed it once with its last two windows at 0.80
    # and 0.73 (a one-frame step and back), every window before them at 0.9999.
    url, token = stack.url, stack.token
    pcm = speech_pcm[: KILLED_BRAIN_CALL_S * 8000 * 2]
    sim = TwilioSimulator(url, auth_token=token)
    revived: list[Service] = []
    loop = asyncio.get_running_loop()
    call_started = loop.time()
    back_at_s: list[float] = []

    async def kill_and_revive() -> None:
        await asyncio.sleep(2.0)
        stack.brain.proc.kill()
        await asyncio.to_thread(stack.brain.proc.wait)
        await asyncio.sleep(1.0)
        revived.append(
            await asyncio.to_thread(
                spawn,
                ["brain", "echo"],
                port=stack.brain.port,
                env={"RUTSTER_BRAIN_BIND": f"{LOOPBACK}:{stack.brain.port}"},
            )
        )
        back_at_s.append(loop.time() - call_started)

    chaos = asyncio.create_task(kill_and_revive())
    try:
        result = await sim.place_call(pcm, tail_s=1.0)
        await chaos
        heard = np.frombuffer(result.heard_pcm, dtype=np.int16)
        # The call stayed up to the end: every frame was sent, the gateway did not hang up.
        assert result.frames_sent == len(pcm) // 320
        assert result.close_code in (1000, None)
        # Audio flows again once the brain is back, by the documented schedule: the next
        # attempt is at most its last delay after the brain is listening (a slow machine
        # takes seconds to start a Python brain, so judge from then, not a fixed time).
        echoed_from_s = back_at_s[0] + TAP_RECONNECT_DELAYS_S[-1] + RECONNECT_SLACK_S
        judged_s = KILLED_BRAIN_CALL_S - echoed_from_s
        assert judged_s >= MIN_JUDGED_S, f"brain took {back_at_s[0]:.1f} s to come back"
        judged = round(judged_s * 8000)
        start = len(pcm) - judged * 2
        _, base_lag = best_lag_correlation(
            pcm[start:], heard[start // 2 :].tobytes(), max_lag_samples=2 * 8000
        )
        windows = [
            w
            for w in echo_windows(pcm, result, base_lag_samples=base_lag)
            if w.start_ms >= echoed_from_s * 1000 and not w.harness_stalled
        ]
        stalls = round(sum(ms for _, ms in result.harness_stalls) * 8)
        problem = transient_steps_only(
            [(w.correlation, w.lag_samples) for w in windows], MAX_LASTING_STEP_SAMPLES + stalls
        )
        assert problem is None, (
            f"{ECHO_SHORTFALL}: after reconnect (brain back at {back_at_s[0]:.1f} s): "
            f"{problem}: {windows}"
        )
        final = await settled_metrics(url)
        assert final["rutster_tap_reconnects_total"] >= 1
        assert final["rutster_active_calls"] == 0
    finally:
        chaos.cancel()
        for service in revived:
            service.stop()


async def test_gateway_shutdown_ends_calls_with_reason_shutdown() -> None:
    from tests.support.recording_brain import RecordingBrain

    token = secrets.token_urlsafe(16)
    async with RecordingBrain() as brain:
        env = {
            "RUTSTER_TAP_URL": brain.url,
            "TWILIO_AUTH_TOKEN": token,
            "RUTSTER_STREAM_SECRET": secrets.token_urlsafe(32),
        }
        with gateway_process(env) as gateway:
            sim = TwilioSimulator(f"http://{LOOPBACK}:{gateway.port}", auth_token=token)
            call_sid = new_sid("CA")
            instructions = await sim.open_stream(call_sid, from_="+1", to="+2")
            ws = await sim.connect_media(instructions)
            await ws.send(connected_message())
            await ws.send(
                start_message(new_sid("MZ"), call_sid, sim.account_sid, instructions.parameters)
            )
            await eventually(lambda: bool(brain.of_type(Hello)))
            stopping = asyncio.create_task(asyncio.to_thread(gateway.stop))
            with contextlib.suppress(ConnectionClosed):
                async for _ in ws:  # the gateway closes the media socket as it shuts down
                    pass
            assert ws.close_code == 1012  # service restart
            assert await stopping == 0  # a requested stop that went well
        await eventually(lambda: bool(brain.of_type(SessionEnd)))
        (end,) = brain.of_type(SessionEnd)
        assert getattr(end, "reason", None) == "shutdown"
