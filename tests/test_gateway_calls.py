"""Calls through the gateway under real uvicorn (in-process) with an in-process echo brain."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from dataclasses import replace
from typing import Any

import httpx
import numpy as np
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed, InvalidStatus

from rutster.brains.echo import EchoBrain
from rutster.gateway.app import startup_warnings
from rutster.gateway.config import GatewayConfig
from rutster.gateway.server import MAX_WS_MESSAGE_BYTES
from rutster.gateway.webhook_forms import MAX_WEBHOOK_FIELDS
from rutster.media.g711 import ulaw_encode
from rutster.protocols.tap import (
    AudioClear,
    AudioOut,
    Direction,
    Dtmf,
    FunctionCall,
    Hello,
    SessionEnd,
    TapDecoder,
    TapEncoder,
)
from rutster.tools.twilio_simulator import (
    StreamInstructions,
    TwilioSimulator,
    best_lag_correlation,
    connected_message,
    media_message,
    new_sid,
    signed_headers,
    start_message,
    stop_message,
)
from tests.conftest import (
    TEST_AUTH_TOKEN,
    RunningGateway,
    eventually,
    gateway_config,
    serve_gateway,
    spend_settings,
)
from tests.echo_checks import assert_echo_intact
from tests.realtime_echo import realtime_echo
from tests.support.recording_brain import RecordingBrain

FRAME = 160  # 20 ms of 8 kHz μ-law


def simulator(gateway: RunningGateway, token: str | None = TEST_AUTH_TOKEN) -> TwilioSimulator:
    return TwilioSimulator(gateway.url, auth_token=token)


async def start_stream(
    gateway: RunningGateway,
    *,
    parameters: dict[str, str] | None = None,
    brain: str | None = None,
    call_sid: str | None = None,
) -> tuple[ClientConnection, str, StreamInstructions]:
    """Webhook + media socket + connected/start; returns the socket and its streamSid.

    ``brain`` picks an (allowlisted) brain through the webhook URL's query.
    """
    sim = simulator(gateway)
    call_sid = call_sid or new_sid("CA")
    instructions = await sim.open_stream(
        call_sid,
        from_="+15550001111",
        to="+15550002222",
        query=f"brain={brain}" if brain else "",
    )
    ws = await sim.connect_media(instructions)
    stream_sid = new_sid("MZ")
    await ws.send(connected_message())
    params = parameters if parameters is not None else instructions.parameters
    await ws.send(start_message(stream_sid, call_sid, sim.account_sid, params))
    return ws, stream_sid, instructions


async def send_speech(ws: ClientConnection, stream_sid: str, pcm: bytes, first_seq: int = 2) -> int:
    mulaw = ulaw_encode(pcm)
    seq = first_seq
    for n in range(0, len(mulaw), FRAME):
        await ws.send(media_message(stream_sid, seq, seq, n // 8, mulaw[n : n + FRAME]))
        seq += 1
        await asyncio.sleep(0.02)
    return seq


async def received_media(ws: ClientConnection, seconds: float) -> int:
    """Count media messages arriving within ``seconds``."""
    count = 0
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    try:
        while (left := deadline - loop.time()) > 0:
            raw = await asyncio.wait_for(ws.recv(), left)
            if json.loads(raw).get("event") == "media":
                count += 1
    except TimeoutError:
        pass
    return count


@realtime_echo
async def test_echo_call_round_trip(gateway: RunningGateway, speech_pcm: bytes) -> None:
    pcm = speech_pcm[: 4 * 8000 * 2]
    result = await simulator(gateway).place_call(pcm, tail_s=0.8)
    lag = assert_echo_intact(pcm, result)
    assert 0 < lag / 8 < 400  # round trip in ms
    assert result.max_queue_ms <= gateway.config.pacer_lead_ms + 5
    assert result.marks_received > 0 and result.marks_echoed > 0
    await eventually(lambda: not gateway.state.calls)
    assert gateway.metric("rutster_call_tasks") == 0
    assert gateway.metric("rutster_active_calls") == 0
    assert gateway.metric("rutster_frames_out_total") >= 190


async def test_call_leaves_no_tasks(gateway: RunningGateway, speech_pcm: bytes) -> None:
    before = {t for t in asyncio.all_tasks() if not t.done()}
    ws, stream_sid, _ = await start_stream(gateway)
    await eventually(lambda: len(gateway.state.calls) == 1)
    call = next(iter(gateway.state.calls.values()))
    await eventually(lambda: call.tap.connected)
    seq = await send_speech(ws, stream_sid, speech_pcm[: 8000 * 2])
    await ws.send(stop_message(stream_sid, seq, "CA", "AC"))
    async for _ in ws:  # read the last echoes until the gateway closes the socket
        pass
    await eventually(lambda: call.ended.is_set())
    assert call.end_reason is not None and call.end_reason.value == "caller_hangup"
    assert all(t.done() for t in call.tasks)
    assert call.engine.closed  # its audio history freed now, not at the GC's next full pass
    await eventually(lambda: {t for t in asyncio.all_tasks() if not t.done()} <= before)
    assert gateway.metric("rutster_call_tasks") == 0


@realtime_echo
async def test_three_calls_at_once(gateway: RunningGateway, speech_pcm: bytes) -> None:
    pcm = speech_pcm[8000 * 2 * 5 : 8000 * 2 * 8]
    results = await asyncio.gather(
        *(simulator(gateway).place_call(pcm, tail_s=0.8) for _ in range(3))
    )
    for result in results:
        assert_echo_intact(pcm, result)


async def test_webhook_refuses_bad_signature(gateway: RunningGateway) -> None:
    url = f"{gateway.url}/twilio/voice"
    form = {"CallSid": "CA123", "From": "+1", "To": "+2"}
    async with httpx.AsyncClient() as client:
        missing = await client.post(url, data=form)
        wrong = await client.post(url, data=form, headers={"X-Twilio-Signature": "AAAA"})
        other_token = await client.post(
            url, data=form, headers=signed_headers("another-token", url, form)
        )
        good = await client.post(url, data=form, headers=signed_headers(TEST_AUTH_TOKEN, url, form))
    assert [missing.status_code, wrong.status_code, other_token.status_code] == [403, 403, 403]
    assert good.status_code == 200 and "<Connect><Stream" in good.text
    assert good.headers["content-type"].startswith("text/xml")
    assert gateway.metric("rutster_signature_failures_total", endpoint="voice") == 3


async def test_webhook_signature_covers_query_string(
    gateway: RunningGateway, echo_brain: EchoBrain
) -> None:
    url = f"{gateway.url}/twilio/voice?brain={echo_brain.url}"
    form = {"CallSid": "CA1", "From": "+1", "To": "+2"}
    async with httpx.AsyncClient() as client:
        good = await client.post(url, data=form, headers=signed_headers(TEST_AUTH_TOKEN, url, form))
        bare = f"{gateway.url}/twilio/voice"
        signed_without_query = await client.post(
            url, data=form, headers=signed_headers(TEST_AUTH_TOKEN, bare, form)
        )
    assert good.status_code == 200
    assert signed_without_query.status_code == 403


async def test_webhook_bad_bodies(gateway: RunningGateway) -> None:
    url = f"{gateway.url}/twilio/voice"
    async with httpx.AsyncClient() as client:
        as_json = await client.post(url, json={"CallSid": "CA1"})
        huge = await client.post(
            url,
            content=b"a=" + b"x" * 70_000,
            headers={"content-type": "application/x-www-form-urlencoded"},
        )
        no_sid_form: dict[str, str] = {"From": "+1"}
        no_sid = await client.post(
            url, data=no_sid_form, headers=signed_headers(TEST_AUTH_TOKEN, url, no_sid_form)
        )
        bad_sid_form = {"CallSid": "CA<script>"}
        bad_sid = await client.post(
            url, data=bad_sid_form, headers=signed_headers(TEST_AUTH_TOKEN, url, bad_sid_form)
        )
    assert as_json.status_code == 415
    assert huge.status_code == 413
    assert no_sid.status_code == 400
    assert bad_sid.status_code == 400


async def test_webhook_with_too_many_fields_is_refused_before_it_costs_the_loop(
    gateway: RunningGateway,
) -> None:
    """Issue 14, finding 1: a webhook body of thousands of short fields cost the loop
    23-40 ms to parse and sign-check, stalling every call; it is refused on a count."""
    url = f"{gateway.url}/twilio/voice"
    base = {"CallSid": "CA1", "From": "+1", "To": "+2"}
    room = {**base, **{f"SipHeader_X-{i}": "v" for i in range(MAX_WEBHOOK_FIELDS - len(base))}}
    over = {**base, **{f"SipHeader_X-{i}": "v" for i in range(MAX_WEBHOOK_FIELDS)}}
    async with httpx.AsyncClient() as client:
        fits = await client.post(url, data=room, headers=signed_headers(TEST_AUTH_TOKEN, url, room))
        refused = await client.post(
            url, data=over, headers=signed_headers(TEST_AUTH_TOKEN, url, over)
        )
        status = await client.post(
            f"{gateway.url}/twilio/status",
            content="&".join(["a=b"] * 1000),
            headers={"content-type": "application/x-www-form-urlencoded"},
        )
    assert fits.status_code == 200
    assert refused.status_code == 413 and str(MAX_WEBHOOK_FIELDS) in refused.text
    assert status.status_code == 413
    m = gateway.metric
    assert m("rutster_bad_messages_total", source="twilio_webhook", reason="too_many_fields") == 1
    assert m("rutster_bad_messages_total", source="twilio_status", reason="too_many_fields") == 1
    # Refused on the count: the signature of the refused request was never checked.
    assert m("rutster_signature_failures_total", endpoint="status") == 0


@pytest.mark.parametrize("field", ["From", "To", "Direction"])
@pytest.mark.parametrize("char", ["\x00", "\x01", "\x0b"])
async def test_webhook_party_fields_xml_cannot_carry_are_refused(
    gateway: RunningGateway, field: str, char: str
) -> None:
    """Issue 14, finding 5: a signed webhook whose From, To or Direction holds a
    character XML cannot carry got a 500 (from the TwiML builder), after the
    spend gate had admitted the call. Now: 400, counted, nothing admitted."""
    url = f"{gateway.url}/twilio/voice"
    form = {"CallSid": "CA" + "1" * 32, "From": "+15550001111", "To": "+15550002222"}
    form[field] = f"+1555{char}0001111"
    async with httpx.AsyncClient() as client:
        response = await client.post(
            url, data=form, headers=signed_headers(TEST_AUTH_TOKEN, url, form)
        )
    assert response.status_code == 400, response.text
    assert field in response.text
    assert (
        gateway.metric("rutster_bad_messages_total", source="twilio_webhook", reason="bad_party")
        == 1
    )
    assert not gateway.metric("rutster_admissions_total", outcome="admitted", reason="ok")


async def test_brain_override_must_be_allowlisted(gateway: RunningGateway) -> None:
    evil = "ws://169.254.169.254/latest"
    url = f"{gateway.url}/twilio/voice?brain={evil}"
    form = {"CallSid": "CA1", "From": "+1", "To": "+2"}
    async with httpx.AsyncClient() as client:
        response = await client.post(
            url, data=form, headers=signed_headers(TEST_AUTH_TOKEN, url, form)
        )
    assert response.status_code == 403
    assert gateway.metric("rutster_tap_url_rejections_total") == 1


async def test_upgrade_with_bad_signature_is_refused(gateway: RunningGateway) -> None:
    stream_url = gateway.config.twilio_stream_url
    with pytest.raises(InvalidStatus) as refused:
        await connect(stream_url, additional_headers={"X-Twilio-Signature": "bogus"})
    assert refused.value.response.status_code == 403
    assert gateway.metric("rutster_signature_failures_total", endpoint="stream") == 1


async def test_wrong_stream_token_closes_before_brain(
    gateway: RunningGateway, echo_brain: EchoBrain
) -> None:
    sim = simulator(gateway)
    instructions = await sim.open_stream(new_sid("CA"), from_="+1", to="+2")
    tampered = dict(instructions.parameters, rutster_token="A" * 43)
    ws, _, _ = await start_stream(gateway, parameters=tampered)
    with pytest.raises(ConnectionClosed):
        while True:
            await ws.recv()
    assert ws.close_code == 1008
    assert ws.close_reason == "invalid stream token"
    assert gateway.metric("rutster_stream_token_failures_total") == 1
    assert echo_brain.connections == 0
    assert not gateway.state.calls


def _malformed_start(kind: str, start: dict[str, Any]) -> dict[str, Any]:
    body = start["start"]
    if kind == "token_not_a_string":
        body["customParameters"]["rutster_token"] = 12345
    elif kind == "no_call_sid":
        del body["callSid"]
    else:  # an encoding Twilio does not send on bidirectional streams
        body["mediaFormat"] = {"encoding": "audio/flac", "sampleRate": 44100, "channels": 2}
    return start


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("token_not_a_string", "bad_start"),
        ("no_call_sid", "bad_start"),
        ("bad_media_format", "unsupported_media_format"),
    ],
)
async def test_malformed_start_closes_1008(
    gateway: RunningGateway, echo_brain: EchoBrain, kind: str, reason: str
) -> None:
    """Issue 14, finding 10: a malformed ``start`` is a failure to present a valid
    stream token, which the README promises closes 1008; it closed 1002."""
    sim = simulator(gateway)
    call_sid = new_sid("CA")
    instructions = await sim.open_stream(call_sid, from_="+15550001111", to="+15550002222")
    ws = await sim.connect_media(instructions)
    await ws.send(connected_message())
    start = json.loads(
        start_message(new_sid("MZ"), call_sid, sim.account_sid, instructions.parameters)
    )
    await ws.send(json.dumps(_malformed_start(kind, start)))
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            await ws.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008, closed.value
    assert gateway.metric("rutster_bad_messages_total", source="twilio", reason=reason) == 1
    assert not gateway.metric("rutster_tap_connects_total")


async def test_token_is_bound_to_the_call_sid(gateway: RunningGateway) -> None:
    sim = simulator(gateway)
    instructions = await sim.open_stream(new_sid("CA"), from_="+1", to="+2")
    ws = await sim.connect_media(instructions)
    await ws.send(connected_message())
    # A valid token replayed for another call is refused.
    await ws.send(start_message(new_sid("MZ"), new_sid("CA"), "AC1", instructions.parameters))
    with pytest.raises(ConnectionClosed):
        while True:
            await ws.recv()
    assert ws.close_reason == "invalid stream token"


async def test_bad_provider_messages_are_dropped_and_counted(
    gateway: RunningGateway, speech_pcm: bytes
) -> None:
    ws, stream_sid, _ = await start_stream(gateway)
    await eventually(lambda: len(gateway.state.calls) == 1)
    call = next(iter(gateway.state.calls.values()))
    await eventually(lambda: call.tap.connected)
    bad = [
        "{not json",
        "[1, 2]",
        json.dumps({"event": "media", "streamSid": stream_sid, "media": {"payload": "@@@"}}),
        json.dumps({"event": "surprise", "streamSid": stream_sid}),
        json.dumps(
            {
                "event": "media",
                "streamSid": stream_sid,
                "media": {"payload": base64.b64encode(b"\xff" * 70_000).decode()},
            }
        ),
        json.dumps({"event": "media", "streamSid": stream_sid, "pad": "x" * 120_000}),
    ]
    for text in bad:
        await ws.send(text)
    await ws.send(b"\x00binary")
    # An odd-length μ-law chunk is valid audio (1 byte per sample), not an error.
    await ws.send(media_message(stream_sid, 2, 1, 0, b"\xff" * 159))
    # The call keeps flowing: speech still comes back.
    await send_speech(ws, stream_sid, speech_pcm[: 8000 * 2])
    assert await received_media(ws, 1.0) > 20
    m = gateway.metric
    assert m("rutster_bad_messages_total", source="twilio", reason="malformed_json") == 1
    assert m("rutster_bad_messages_total", source="twilio", reason="not_an_object") == 1
    assert m("rutster_bad_messages_total", source="twilio", reason="bad_base64") == 1
    assert m("rutster_bad_messages_total", source="twilio", reason="payload_too_large") == 1
    assert m("rutster_bad_messages_total", source="twilio", reason="too_large") == 1
    assert m("rutster_bad_messages_total", source="twilio", reason="binary_frame") == 1
    assert m("rutster_unknown_events_total", source="twilio") == 1
    assert not call.ended.is_set()
    await ws.close()


async def test_media_before_start_is_dropped(gateway: RunningGateway) -> None:
    sim = simulator(gateway)
    call_sid = new_sid("CA")
    instructions = await sim.open_stream(call_sid, from_="+1", to="+2")
    ws = await sim.connect_media(instructions)
    stream_sid = new_sid("MZ")
    await ws.send(connected_message())
    await ws.send(media_message(stream_sid, 2, 1, 0, b"\xff" * FRAME))
    await ws.send(start_message(stream_sid, call_sid, sim.account_sid, instructions.parameters))
    await eventually(lambda: len(gateway.state.calls) == 1)
    assert (
        gateway.metric("rutster_bad_messages_total", source="twilio", reason="media_before_start")
        == 1
    )
    await ws.close()


async def test_socket_without_start_times_out_quietly(gateway: RunningGateway) -> None:
    sim = simulator(gateway)
    instructions = await sim.open_stream(new_sid("CA"), from_="+1", to="+2")
    ws = await sim.connect_media(instructions)
    await ws.send(connected_message())
    await ws.send(json.dumps({"event": "stop", "streamSid": "MZ1", "stop": {}}))
    with pytest.raises(ConnectionClosed):
        while True:
            await ws.recv()
    assert not gateway.state.calls


async def test_function_call_gets_one_answer(gateway: RunningGateway) -> None:
    # The echo brain never proposes tools; drive the handler through a live call.
    ws, _, _ = await start_stream(gateway)
    await eventually(lambda: len(gateway.state.calls) == 1)
    call = next(iter(gateway.state.calls.values()))
    await eventually(lambda: call.tap.connected)
    sent: list[object] = []
    original = call.tap.send

    async def spy(event: object, *, kind: str) -> bool:
        if kind == "function_call_output":
            sent.append(event)
        return await original(event, kind=kind)  # type: ignore[arg-type]

    call.tap.send = spy  # type: ignore[method-assign]
    # The echo brain sent no tools.update, so even a tool the gateway implements
    # is outside the brain's catalog: not_implemented, answered once, call untouched.
    await call._on_brain_event(FunctionCall(id="fc1", name="hangup", args={}))
    await call._on_brain_event(FunctionCall(id="fc1", name="hangup", args={}))
    await eventually(lambda: len(sent) >= 1)
    await asyncio.sleep(0.05)
    assert len(sent) == 1
    answer = sent[0]
    assert getattr(answer, "id", None) == "fc1"
    assert getattr(answer, "status", None) == "not_implemented"
    assert not call.ended.is_set()
    receipts = call.trail.of_type("tool_call")
    assert [r.payload["reason"] for r in receipts] == ["not_in_catalog"]
    await ws.close()


def test_dev_mode_is_loud() -> None:
    warnings = startup_warnings(GatewayConfig())
    assert any("DEV MODE" in w and "TWILIO_AUTH_TOKEN" in w for w in warnings)
    secure = GatewayConfig(
        twilio_auth_token="t",
        stream_secret=b"x" * 32,
        stream_secret_generated=False,
        public_url="https://gw.example.com",
        twilio_account_sid="AC" + "0" * 32,
        spend=spend_settings(),
    )
    assert startup_warnings(secure) == []
    no_admin = replace(secure, spend=spend_settings(admin_key=None))
    assert any("RUTSTER_ADMIN_KEY" in w for w in startup_warnings(no_admin))
    without_rest = replace(secure, twilio_account_sid=None)
    assert any("TWILIO_ACCOUNT_SID" in w for w in startup_warnings(without_rest))


async def test_healthz_and_metrics(gateway: RunningGateway) -> None:
    async with httpx.AsyncClient() as client:
        health = (await client.get(f"{gateway.url}/healthz")).json()
        metrics = (await client.get(f"{gateway.url}/metrics")).text
    assert health["status"] == "ok"
    assert health["twilio_signatures"] == "enforced"
    for name in (
        "rutster_active_calls",
        "rutster_frames_in_total",
        "rutster_frames_out_total",
        "rutster_playout_underruns_total",
        "rutster_playout_overflow_drops_total",
        "rutster_tap_reconnects_total",
        "rutster_signature_failures_total",
    ):
        assert name in metrics


async def test_dtmf_and_session_end_reach_the_brain(echo_brain: EchoBrain) -> None:
    async with RecordingBrain() as brain:
        config = gateway_config(echo_brain.url, barge_in=False, allow=brain.url)
        async with serve_gateway(config) as gateway:
            call_sid = new_sid("CA")
            ws, stream_sid, _ = await start_stream(gateway, brain=brain.url, call_sid=call_sid)
            await eventually(lambda: bool(brain.of_type(Hello)))
            for seq, digit in enumerate("7#", start=2):
                await ws.send(
                    json.dumps(
                        {
                            "event": "dtmf",
                            "sequenceNumber": str(seq),
                            "streamSid": stream_sid,
                            "dtmf": {"track": "inbound_track", "digit": digit},
                        }
                    )
                )
            await eventually(lambda: len(brain.of_type(Dtmf)) == 2)
            assert [getattr(d, "digit", None) for d in brain.of_type(Dtmf)] == ["7", "#"]
            await ws.send(stop_message(stream_sid, 9, call_sid, "AC1"))
            async for _ in ws:
                pass
            await eventually(lambda: bool(brain.of_type(SessionEnd)))
            (end,) = brain.of_type(SessionEnd)
            assert getattr(end, "reason", None) == "caller_hangup"
            (hello,) = brain.of_type(Hello)
            assert isinstance(hello, Hello)
            assert hello.call.id == call_sid and hello.call.from_ == "+15550001111"
            assert hello.resume is False


async def test_audio_clear_from_the_brain_flushes_playout_and_clears_twilio(
    echo_brain: EchoBrain,
) -> None:
    """A brain that drops its answer: unplayed audio is flushed and Twilio gets ``clear``."""

    async def brain_handler(ws: ServerConnection) -> None:
        decoder = TapDecoder(Direction.CORE_TO_BRAIN)
        encoder = TapEncoder(start_ms=0.0)
        with contextlib.suppress(ConnectionClosed):
            decoder.decode(await ws.recv())  # hello
            tone = (np.sin(np.arange(24_000) / 4) * 8000).astype("<i2").tobytes()
            for _ in range(5):  # 5 s of answer, far faster than real time
                await ws.send(encoder.encode(AudioOut(tone, item="answer"), 0.0))
            await asyncio.sleep(0.5)
            await ws.send(encoder.encode(AudioClear(), 0.0))
            async for _ in ws:
                pass

    async with serve(brain_handler, "127.0.0.1", 0, compression=None) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        brain_url = f"ws://127.0.0.1:{port}/clearing"
        async with serve_gateway(
            gateway_config(echo_brain.url, barge_in=False, allow=brain_url)
        ) as gateway:
            ws, _, _ = await start_stream(gateway, brain=brain_url)
            events: list[str] = []
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 2.0
            with contextlib.suppress(TimeoutError):
                while (left := deadline - loop.time()) > 0:
                    events.append(json.loads(await asyncio.wait_for(ws.recv(), left))["event"])
            assert "clear" in events
            before_clear = events[: events.index("clear")].count("media")
            after_clear = events[events.index("clear") :].count("media")
            # Paced at real time for ~0.5 s before the clear (not the 5 s the brain sent)...
            assert 15 <= before_clear <= 40
            # ...and nothing of the dropped answer after it.
            assert after_clear == 0
            call = next(iter(gateway.state.calls.values()))
            assert call.playout.buffered_samples == 0
            await ws.close()


async def test_frame_over_the_websocket_limit_closes_that_call_only(
    gateway: RunningGateway, speech_pcm: bytes
) -> None:
    normal = asyncio.create_task(simulator(gateway).place_call(speech_pcm[: 3 * 16000]))
    ws, _, _ = await start_stream(gateway)
    await eventually(lambda: len(gateway.state.calls) == 2)
    with contextlib.suppress(ConnectionClosed):
        await ws.send(json.dumps({"event": "media", "pad": "x" * (MAX_WS_MESSAGE_BYTES + 1)}))
        async for _ in ws:
            pass
    assert ws.close_code == 1009
    await eventually(
        lambda: (
            gateway.metric("rutster_bad_messages_total", source="twilio", reason="frame_too_large")
            == 1
        )
    )
    result = await normal
    corr, _ = best_lag_correlation(speech_pcm[: 3 * 16000], result.heard_pcm)
    assert corr >= 0.9


async def test_a_call_ends_even_if_a_task_swallows_its_cancellation(
    echo_brain: EchoBrain, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Seen under load: a cancellation turned into another exception inside a Redis call
    # left the spend task running, the call never ended and was later reaped at full
    # price. Here the spend tick swallows the first cancel it meets.
    from rutster.spend.gate import CallSpend
    from tests.conftest import fast_spend_settings

    original = CallSpend.tick
    swallowed: list[bool] = []
    in_tick = asyncio.Event()

    async def swallowing_tick(self: CallSpend, now_ms: int, **kwargs: Any) -> Any:
        try:
            in_tick.set()
            await asyncio.sleep(1.0)  # the end's cancel lands here
        except asyncio.CancelledError:
            if not swallowed:
                swallowed.append(True)
                current = asyncio.current_task()
                assert current is not None
                current.uncancel()
                return None
            raise
        return await original(self, now_ms, **kwargs)

    monkeypatch.setattr(CallSpend, "tick", swallowing_tick)
    config = gateway_config(echo_brain.url, barge_in=False, spend=fast_spend_settings())
    async with serve_gateway(config) as gw:
        ws, _, _ = await start_stream(gw)
        await asyncio.wait_for(in_tick.wait(), 5)
        await ws.close()
        await eventually(lambda: not gw.state.calls, 10)
    assert swallowed == [True]


async def test_audio_beyond_real_time_is_refused_before_it_costs_the_loop(
    gateway: RunningGateway, speech_pcm: bytes
) -> None:
    # Issue 14, finding 1: one 64 KiB payload (8 s of audio) held the event loop ~200 ms;
    # two a second took an honest call from 0 gaps to 16.
    ws, stream_sid, _ = await start_stream(gateway)
    await eventually(lambda: len(gateway.state.calls) == 1)
    loop = asyncio.get_running_loop()
    started = loop.time()
    for seq in range(4):
        await ws.send(media_message(stream_sid, 2 + seq, 1 + seq, 0, b"\xff" * 64 * 1024))
    await eventually(
        lambda: (
            gateway.metric("rutster_bad_messages_total", source="provider", reason="over_real_time")
            == 4
        )
    )
    assert loop.time() - started < 1.0
    (call,) = gateway.state.calls.values()
    assert call.engine.frames_in == 0  # refused before any per-frame work
    # The call keeps flowing: real-time speech still comes back.
    await send_speech(ws, stream_sid, speech_pcm[: 8000 * 2])
    assert await received_media(ws, 1.0) > 20
    await ws.close()
