"""Issue 3 end to end: Twilio simulator → gateway (uvicorn) → realtime brain → mock Realtime.

The realtime brain runs the real code (official SDK client, translator, bridge)
against the MOCK OpenAI Realtime server, which runs in this test process so the
test can read what it received.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from rutster.brains.realtime.config import MOCK_API_KEY, RealtimeBrainConfig
from rutster.brains.realtime.server import RealtimeBrain
from rutster.gateway.tool_registry import ToolLimits
from rutster.gateway.transfer_allowlist import TransferAllowlist
from rutster.media.resample import StreamResampler
from rutster.protocols.tap import SessionEndReason
from rutster.protocols.tool_catalog import HANGUP_TOOL, TRANSFER_TOOL
from rutster.tools.launcher import LOOPBACK, free_port, realtime_brain_process
from rutster.tools.marker_tone import marker_tone_pcm
from rutster.tools.realtime_mock_server import MockRealtimeServer, MockSession
from rutster.tools.twilio_simulator import SimulatedCallResult, TwilioSimulator, new_sid
from tests.conftest import (
    TEST_AUTH_TOKEN,
    RunningGateway,
    eventually,
    gateway_config,
    serve_gateway,
)
from tests.support.fake_twilio_rest import FakeTwilioRest

SAMPLE_RATE_8K = 8_000
#: Fluent speech in the fixture (the endpointer tests show 9-14 s is never cut).
SPEECH_FROM_S = 9.0
ACCOUNT_SID = "AC" + "1" * 32


def pcm8k_slice(pcm: bytes, start_s: float, seconds: float) -> bytes:
    a = int(start_s * SAMPLE_RATE_8K) * 2
    return pcm[a : a + int(seconds * SAMPLE_RATE_8K) * 2]


def silence_8k(seconds: float) -> bytes:
    return b"\x00\x00" * int(seconds * SAMPLE_RATE_8K)


def tone_8k() -> bytes:
    """The marker tone at 8 kHz (what a caller's phone would carry)."""
    resampler = StreamResampler(24_000, SAMPLE_RATE_8K)
    return resampler.process(marker_tone_pcm()) + resampler.flush()


def rms(pcm: bytes) -> float:
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
    return float(np.sqrt(np.mean(samples**2))) if samples.size else 0.0


def only_session(mock: MockRealtimeServer) -> MockSession:
    opened = [s for s in mock.sessions if s.rejected is None]
    assert len(opened) == 1, f"expected one Realtime session, saw {len(opened)}"
    return opened[0]


@contextlib.asynccontextmanager
async def in_process_brain(mock: MockRealtimeServer, **config: Any) -> AsyncIterator[RealtimeBrain]:
    cfg = RealtimeBrainConfig(
        api_key=MOCK_API_KEY,
        tools=config.pop("tools", (HANGUP_TOOL, TRANSFER_TOOL)),
        port=0,
        websocket_base_url=mock.websocket_base_url,
        mock=True,
    )
    async with RealtimeBrain(cfg) as brain:
        yield brain


async def test_caller_hears_the_mock_reply_after_an_end_of_turn(speech_pcm: bytes) -> None:
    """Acceptance 1, with the realtime brain in its own process."""
    caller = pcm8k_slice(speech_pcm, SPEECH_FROM_S, 3.0) + silence_8k(5.0)
    async with MockRealtimeServer(reply_ms=2_500) as mock:
        port = free_port()
        with realtime_brain_process(mock.websocket_base_url, port):
            brain_url = f"ws://{LOOPBACK}:{port}/realtime"
            async with serve_gateway(gateway_config(brain_url)) as gw:
                sim = TwilioSimulator(gw.url, auth_token=TEST_AUTH_TOKEN)
                result = await sim.place_call(caller, tail_s=0.2)
            await eventually(lambda: any(s.closed for s in mock.sessions))
    session = only_session(mock)
    audio_input = session.session_config["audio"]["input"]
    assert "turn_detection" in audio_input and audio_input["turn_detection"] is None
    assert session.session_config["audio"]["input"]["format"] == {
        "type": "audio/pcm",
        "rate": 24_000,
    }
    # Every 20 ms of the 8 s call was appended, at 24 kHz s16 (960 bytes per frame).
    assert session.appended_bytes >= 0.95 * 8.0 * 48_000
    assert session.commits >= 1
    assert session.responses_created >= 1
    assert session.events.index("input_audio_buffer.commit") < session.events.index(
        "response.create"
    )
    assert "input_audio_buffer.commit" in session.events
    # The caller heard the reply: ≥ 2 s of voiced audio after their turn ended.
    heard_after_turn = result.heard_pcm[int(3.4 * SAMPLE_RATE_8K) * 2 :]
    voiced = [
        rms(heard_after_turn[i : i + 320]) > 300 for i in range(0, len(heard_after_turn), 320)
    ]
    assert sum(voiced) * 0.02 >= 2.0, f"heard only {sum(voiced) * 0.02:.2f} s of reply"
    assert result.heard_gaps == 0  # the reply played without a hole


async def run_tool_call(
    mock: MockRealtimeServer,
    *,
    caller: bytes,
    fake_delay_s: float = 0.0,
    receipts_wanted: int | None = None,
    **overrides: Any,
) -> tuple[SimulatedCallResult, RunningGateway, FakeTwilioRest, bool]:
    """One simulated call with the realtime brain in-process and a fake Twilio REST API.

    The call ends when Twilio would end it (the gateway hung up through REST), or,
    with ``receipts_wanted``, as soon as that many tool receipts are in the trail
    (the caller hangs up). Returns whether the REST hang-up happened.
    """
    fake = FakeTwilioRest(account_sid=ACCOUNT_SID, auth_token=TEST_AUTH_TOKEN, delay_s=fake_delay_s)
    async with fake, in_process_brain(mock) as brain:
        config = gateway_config(
            brain.url,
            twilio_account_sid=ACCOUNT_SID,
            twilio_api_base_url=fake.base_url,
            **overrides,
        )
        async with serve_gateway(config) as gw:
            call_sid = new_sid("CA")
            end_call = asyncio.Event()
            rest_hangup = asyncio.Event()

            async def on_completed() -> None:
                rest_hangup.set()
                end_call.set()

            async def on_redirect(twiml: str) -> None:
                end_call.set()  # Twilio leaves <Connect><Stream> for the new TwiML

            async def watch_receipts() -> None:
                while receipts_wanted is not None:
                    calls = list(gw.state.calls.values())
                    if calls and len(calls[0].trail.of_type("tool_call")) >= receipts_wanted:
                        await asyncio.sleep(0.2)  # let the brain pass the answer upstream
                        end_call.set()
                        return
                    await asyncio.sleep(0.02)

            fake.register_call(call_sid, on_completed=on_completed, on_redirect=on_redirect)
            watcher = asyncio.create_task(watch_receipts())
            sim = TwilioSimulator(gw.url, auth_token=TEST_AUTH_TOKEN)
            try:
                result = await sim.place_call(
                    caller, call_sid=call_sid, provider_hangup=end_call, tail_s=0.2
                )
            finally:
                watcher.cancel()
            await eventually(lambda: not gw.state.calls)
            return result, gw, fake, rest_hangup.is_set()


async def test_hangup_tool_round_trip(speech_pcm: bytes) -> None:
    """Acceptance 2: the mock asks for hangup; the gateway hangs up through Twilio REST."""
    caller = pcm8k_slice(speech_pcm, SPEECH_FROM_S, 1.5) + tone_8k() + silence_8k(8.0)
    async with MockRealtimeServer() as mock:
        result, gw, fake, rest_hangup = await run_tool_call(mock, caller=caller)
        await eventually(lambda: any(s.closed for s in mock.sessions))
    assert result.hung_up_by_provider and rest_hangup
    hangups = [r for r in fake.requests if r.form.get("Status") == "completed"]
    assert len(hangups) == 1 and hangups[0].authorized
    assert result.call_sid in hangups[0].path
    (trail,) = gw.state.recent_trails.values()
    (receipt,) = trail.of_type("tool_call")
    assert receipt.payload["tool"] == "hangup"
    assert receipt.payload["status"] == "ok"
    assert "reason" in receipt.payload and "caller asked" not in json.dumps(receipt.payload)
    (ended,) = trail.of_type("call_ended")
    assert ended.payload["reason"] == SessionEndReason.HANGUP_TOOL.value
    session = only_session(mock)
    assert session.closed
    outputs = session.function_call_outputs
    assert len(outputs) == 1 and json.loads(outputs[0]["output"])["status"] == "ok"


@pytest.mark.parametrize(
    ("scripted", "overrides", "status", "reason"),
    [
        ([("launch_missiles", {})], {}, "not_implemented", "not_in_catalog"),
        ([("hangup", {"reason": 5})], {}, "error", "invalid_args"),
        (
            [("transfer", {"destination": "+1900"}), ("transfer", {"destination": "+1900"})],
            {"tool_limits": ToolLimits(calls_per_turn=1)},
            "rejected",
            "turn_budget",
        ),
        (
            [("transfer", {"destination": "+15550001111"})],
            {
                "tool_limits": ToolLimits(timeout_ms=300),
                "transfer_allowlist": TransferAllowlist.parse("+15550001111"),
                "fake_delay_s": 2.0,
            },
            "error",
            "timeout",
        ),
        (
            [("transfer", {"destination": "+19005550000"})],
            {"transfer_allowlist": TransferAllowlist.parse("+15550001111")},
            "rejected",
            "destination_not_allowed",
        ),
    ],
)
async def test_registry_statuses_through_a_live_call(
    speech_pcm: bytes,
    scripted: list[tuple[str, dict[str, Any]]],
    overrides: dict[str, Any],
    status: str,
    reason: str,
) -> None:
    """Acceptance 2: unknown tool, invalid args, budget and timeout each get their status."""
    caller = pcm8k_slice(speech_pcm, SPEECH_FROM_S, 1.5) + silence_8k(8.0)
    delay = overrides.pop("fake_delay_s", 0.0)
    async with MockRealtimeServer() as mock:
        for name, args in scripted:
            mock.script_tool_call(name, args)
        _, gw, _, rest_hangup = await run_tool_call(
            mock,
            caller=caller,
            fake_delay_s=delay,
            receipts_wanted=len(scripted),
            **overrides,
        )
    (trail,) = gw.state.recent_trails.values()
    receipts = trail.of_type("tool_call")
    assert receipts, "no tool call reached the registry"
    last = receipts[-1].payload
    assert (last["status"], last["reason"]) == (status, reason)
    assert not rest_hangup  # the call stayed up until the caller left
    session = only_session(mock)
    answered = [json.loads(o["output"])["status"] for o in session.function_call_outputs]
    assert answered[-1] == status


async def test_transfer_to_an_allowlisted_number_redirects_the_call(speech_pcm: bytes) -> None:
    caller = pcm8k_slice(speech_pcm, SPEECH_FROM_S, 1.5) + silence_8k(8.0)
    async with MockRealtimeServer() as mock:
        mock.script_tool_call("transfer", {"destination": "+15550001111"})
        result, gw, fake, rest_hangup = await run_tool_call(
            mock,
            caller=caller,
            transfer_allowlist=TransferAllowlist.parse("+15550001111"),
        )
        await eventually(lambda: any(s.closed for s in mock.sessions))
    assert result.hung_up_by_provider and not rest_hangup
    (redirect,) = [r for r in fake.requests if "Twiml" in r.form]
    assert "<Dial><Number>+15550001111</Number></Dial>" in redirect.form["Twiml"]
    (trail,) = gw.state.recent_trails.values()
    (receipt,) = trail.of_type("tool_call")
    assert (receipt.payload["tool"], receipt.payload["status"]) == ("transfer", "ok")
    assert trail.of_type("call_ended")[0].payload["reason"] == "transferred"
    assert "+15550001111" not in json.dumps([e.payload for e in trail.events])


async def test_barge_in_truncates_the_mock_item_at_what_the_caller_heard(
    speech_pcm: bytes,
) -> None:
    """Issue 4: a barge-in through uvicorn cuts the reply where the caller stopped hearing it."""
    turn = pcm8k_slice(speech_pcm, SPEECH_FROM_S, 2.0) + silence_8k(1.5)  # reply starts ~2.5 s
    barge = pcm8k_slice(speech_pcm, 12.0, 1.5)  # the caller talks over the reply at 3.5 s
    caller = turn + barge + silence_8k(3.0)
    async with MockRealtimeServer(reply_ms=4_000) as mock, in_process_brain(mock) as brain:
        async with serve_gateway(gateway_config(brain.url)) as gw:
            sim = TwilioSimulator(gw.url, auth_token=TEST_AUTH_TOKEN)
            result = await sim.place_call(caller, tail_s=0.2)
        await eventually(lambda: bool(mock.sessions and mock.sessions[0].truncations))
    session = only_session(mock)
    (truncation,) = session.truncations
    # What the caller heard of the reply: from its first voiced frame to the cut.
    frame = 320  # 20 ms of PCM16 at 8 kHz
    heard = result.heard_pcm
    voiced = [rms(heard[i : i + frame]) > 180 for i in range(0, len(heard) - frame + 1, frame)]
    start = next(i for i in range(125, len(voiced)) if voiced[i])  # after the first turn
    end = start
    while end < len(voiced) and voiced[end]:
        end += 1
    heard_ms = (end - start) * 20
    assert 2_500 <= start * 20 <= 3_000  # the turn ended 500 ms after the caller stopped
    assert abs(truncation["audio_end_ms"] - heard_ms) <= 60, (truncation, heard_ms)
    assert heard_ms < 4_000 - 500  # it really was cut, well before its end
    # The mock had already sent the whole reply (4x real time), so there was no
    # response left to cancel: the truncation is what tells the model what was said.
    (trail,) = gw.state.recent_trails.values()
    (confirmed,) = trail.of_type("barge_in_confirmed")
    assert confirmed.payload["played_ms"] == truncation["audio_end_ms"]
    assert result.clears_received >= 1
