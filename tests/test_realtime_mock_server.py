"""The MOCK OpenAI Realtime server, driven by the real ``openai`` SDK client.

Every event the mock sends is parsed with the SDK's ``parse_event`` and must
come out as the typed model for its ``type``, and validate strictly against it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
import wave
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, get_args

import numpy as np
import pydantic
import pytest
from openai import AsyncOpenAI
from openai.resources.realtime.realtime import AsyncRealtimeConnection
from openai.types.realtime import (
    ConversationItemTruncatedEvent,
    RateLimitsUpdatedEvent,
    RealtimeErrorEvent,
    RealtimeSessionCreateRequest,
    ResponseAudioDeltaEvent,
    ResponseDoneEvent,
    SessionCreatedEvent,
    SessionUpdatedEvent,
)
from openai.types.realtime.realtime_conversation_item_assistant_message import (
    RealtimeConversationItemAssistantMessage,
)
from openai.types.realtime.realtime_conversation_item_function_call import (
    RealtimeConversationItemFunctionCall,
)
from openai.types.realtime.response_function_call_arguments_done_event import (
    ResponseFunctionCallArgumentsDoneEvent,
)
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosedError, ConnectionClosedOK, InvalidStatus

from rutster.media.g711 import ulaw_decode, ulaw_encode
from rutster.media.resample import StreamResampler
from rutster.tools.marker_tone import contains_marker_tone, marker_tone_pcm
from rutster.tools.realtime_mock_server import (
    DEFAULT_MARKER_TOOL,
    DELTA_MS,
    MAX_KEPT_TURNS,
    MOCK_TRANSCRIPT,
    MockRealtimeServer,
    MockServerConfigError,
    mock_usage,
)
from rutster.tools.realtime_mock_voice import (
    MockVoiceError,
    ReplyWavError,
    load_reply_wav,
    synthesize_reply,
)

SPEECH_WAV = Path(__file__).parent / "fixtures" / "audio" / "caller_speech_8k.wav"
REPO_ROOT = Path(__file__).resolve().parent.parent
Event = tuple[dict[str, Any], Any]

#: Event types of an audio response other than the deltas, in order (live capture order).
AUDIO_RESPONSE_SEQUENCE = [
    "response.created",
    "response.output_item.added",
    "conversation.item.added",
    "response.content_part.added",
    "response.output_audio_transcript.delta",
    "response.output_audio.done",
    "response.output_audio_transcript.done",
    "response.content_part.done",
    "conversation.item.done",
    "response.output_item.done",
    "response.done",
]


@pytest.fixture(scope="module")
def speech_24k() -> bytes:
    """Two seconds of the recorded-speech fixture at 24 kHz (via load_reply_wav)."""
    return load_reply_wav(SPEECH_WAV)[: 24_000 * 2 * 2]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def dbfs(pcm: bytes) -> float:
    x = np.frombuffer(pcm, dtype="<i2").astype(np.float64) / 32768.0
    return 20 * math.log10(max(float(np.sqrt(np.mean(x * x))), 1e-12))


class Realtime:
    """A real SDK connection; every event received is checked against the SDK types."""

    def __init__(self, conn: AsyncRealtimeConnection) -> None:
        self.conn = conn

    async def next(self, timeout_s: float = 5.0) -> Event:
        raw = await asyncio.wait_for(self.conn.recv_bytes(), timeout_s)
        data = json.loads(raw)
        event = self.conn.parse_event(raw)
        assert isinstance(event, pydantic.BaseModel), data["type"]
        assert get_args(type(event).model_fields["type"].annotation) == (data["type"],)
        type(event).model_validate(data)  # strict: required fields present, right types
        return data, event

    async def until(self, *types: str) -> list[Event]:
        events = [await self.next()]
        while events[-1][0]["type"] not in types:
            events.append(await self.next())
        return events

    async def error(self) -> dict[str, Any]:
        data, event = await self.next()
        assert isinstance(event, RealtimeErrorEvent), data
        return dict(data["error"])


@contextlib.asynccontextmanager
async def realtime(server: MockRealtimeServer) -> AsyncIterator[Realtime]:
    async with (
        AsyncOpenAI(api_key="mock-key", websocket_base_url=server.websocket_base_url) as client,
        client.realtime.connect(model="gpt-realtime") as conn,
    ):
        rt = Realtime(conn)
        data, event = await rt.next()
        assert isinstance(event, SessionCreatedEvent), data
        yield rt


@pytest.fixture
async def server() -> AsyncIterator[MockRealtimeServer]:
    """The mock at its default pace (4x real time)."""
    async with MockRealtimeServer() as running:
        yield running


@pytest.fixture
async def fast() -> AsyncIterator[MockRealtimeServer]:
    """The mock with no pacing, for tests that don't measure time."""
    async with MockRealtimeServer(speed=math.inf) as running:
        yield running


async def manual_turns(rt: Realtime) -> None:
    await rt.conn.session.update(
        session={"type": "realtime", "audio": {"input": {"turn_detection": None}}}
    )
    await rt.until("session.updated")


async def commit(rt: Realtime, pcm: bytes) -> str:
    await rt.conn.input_audio_buffer.append(audio=b64(pcm))
    await rt.conn.input_audio_buffer.commit()
    events = await rt.until("conversation.item.done")
    assert [d["type"] for d, _ in events] == [
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
    ]
    return str(events[0][0]["item_id"])


async def reply(rt: Realtime) -> list[Event]:
    await rt.conn.response.create()
    events = await rt.until("response.done")
    assert (await rt.next())[0]["type"] == "rate_limits.updated"
    return events


def audio_of(events: list[Event]) -> bytes:
    return b"".join(
        base64.b64decode(e.delta) for _, e in events if isinstance(e, ResponseAudioDeltaEvent)
    )


# --- session -------------------------------------------------------------------------


async def test_session_created_is_the_ga_default_and_updates_are_recorded(
    fast: MockRealtimeServer,
) -> None:
    async with (
        AsyncOpenAI(api_key="mock-key", websocket_base_url=fast.websocket_base_url) as client,
        client.realtime.connect(model="gpt-realtime") as conn,
    ):
        rt = Realtime(conn)
        data, created = await rt.next()
        assert isinstance(created, SessionCreatedEvent)
        assert data["session"]["id"].startswith("sess_mock_")
        session = created.session
        assert isinstance(session, RealtimeSessionCreateRequest)
        assert (session.type, session.model) == ("realtime", "gpt-realtime")
        assert session.audio and session.audio.input and session.audio.output
        turn_detection = session.audio.input.turn_detection
        assert turn_detection is not None and turn_detection.type == "server_vad"
        assert session.audio.output.format and session.audio.output.format.type == "audio/pcm"

        await conn.session.update(
            session={
                "type": "realtime",
                "instructions": "be brief",
                "audio": {"input": {"turn_detection": None}},
            }
        )
        _, updated = await rt.next()
        assert isinstance(updated, SessionUpdatedEvent)
        session = updated.session
        assert isinstance(session, RealtimeSessionCreateRequest)
        assert session.audio and session.audio.input and session.audio.input.format
        assert session.audio.input.turn_detection is None
        # Untouched nested settings survive a partial update.
        assert session.audio.input.format.type == "audio/pcm"
        assert session.instructions == "be brief"

    (record,) = fast.sessions
    assert record.model == "gpt-realtime"
    assert record.auth_header_present
    assert record.session_config["audio"]["input"]["turn_detection"] is None
    assert record.session_updates[0]["type"] == "session.update"
    assert record.events == ["session.update"]
    await fast.wait_for(lambda: record.closed)
    assert record.close_code == 1000
    assert fast.connections_total == 1


# --- replies -------------------------------------------------------------------------


async def test_reply_is_voiced_audio_sent_faster_than_real_time_with_usage(
    server: MockRealtimeServer, speech_24k: bytes
) -> None:
    async with realtime(server) as rt:
        await manual_turns(rt)
        await commit(rt, speech_24k[: 24_000 * 2])  # 1 s of caller speech
        started = time.monotonic()
        events = await reply(rt)
        elapsed = time.monotonic() - started

    kinds = [d["type"] for d, _ in events if d["type"] != "response.output_audio.delta"]
    assert kinds == AUDIO_RESPONSE_SEQUENCE
    deltas = [e for _, e in events if isinstance(e, ResponseAudioDeltaEvent)]
    audio = audio_of(events)
    audio_s = len(audio) / 48_000
    assert audio_s >= 2.0
    assert all(len(base64.b64decode(d.delta)) == DELTA_MS * 48 for d in deltas)
    assert len({(d.response_id, d.item_id) for d in deltas}) == 1
    # Paced, yet well ahead of real time (default 4x).
    assert (len(deltas) - 1) * DELTA_MS / 1000 / 4 * 0.8 <= elapsed < audio_s / 2
    assert dbfs(audio) > -30.0
    assert not contains_marker_tone(audio)

    _, done = events[-1]
    assert isinstance(done, ResponseDoneEvent)
    assert done.response.status == "completed"
    (item,) = done.response.output or []
    assert isinstance(item, RealtimeConversationItemAssistantMessage)
    assert item.content[0].transcript == MOCK_TRANSCRIPT
    usage = done.response.usage
    assert usage is not None and usage.input_token_details and usage.output_token_details
    assert usage.input_token_details.audio_tokens == 10  # 1 s at the mock's 10/s
    assert usage.output_token_details.audio_tokens == round(audio_s * 20)
    assert usage.total_tokens == (usage.input_tokens or 0) + (usage.output_tokens or 0)
    (record,) = server.sessions
    assert record.commits == 1 and record.responses_created == 1
    assert record.committed_turns == [speech_24k[: 24_000 * 2]]
    assert record.responses[0].status == "completed"


async def test_cancel_stops_the_audio_and_reports_what_was_sent(
    server: MockRealtimeServer, speech_24k: bytes
) -> None:
    async with realtime(server) as rt:
        await manual_turns(rt)
        await commit(rt, speech_24k)
        await rt.conn.response.create()
        events = await rt.until("response.output_audio.delta")
        while sum(isinstance(e, ResponseAudioDeltaEvent) for _, e in events) < 3:
            events.append(await rt.next())
        await rt.conn.response.cancel()
        events += await rt.until("response.done")
        assert (await rt.next())[0]["type"] == "rate_limits.updated"
        # Nothing more arrives for this response.
        with pytest.raises(TimeoutError):
            await rt.next(timeout_s=0.2)

    sent_ms = len(audio_of(events)) // 48
    assert DELTA_MS * 3 <= sent_ms < 2_000
    _, done = events[-1]
    assert isinstance(done, ResponseDoneEvent)
    assert done.response.status == "cancelled"
    assert done.response.status_details is not None
    assert done.response.status_details.type == "cancelled"
    assert done.response.status_details.reason == "client_cancelled"
    (item,) = done.response.output or []
    assert isinstance(item, RealtimeConversationItemAssistantMessage)
    assert item.status == "incomplete"
    usage = done.response.usage
    assert usage is not None and usage.output_token_details is not None
    assert usage.output_token_details.audio_tokens == round(sent_ms * 20 / 1000) < 50
    (record,) = server.sessions
    assert record.cancels == 1
    assert record.responses[0].status == "cancelled"
    assert record.responses[0].audio_ms == sent_ms


async def test_one_response_at_a_time_and_cancel_needs_one(
    server: MockRealtimeServer, speech_24k: bytes
) -> None:
    async with realtime(server) as rt:
        await manual_turns(rt)
        await commit(rt, speech_24k)
        await rt.conn.response.create()
        await rt.until("response.created")
        await rt.conn.response.create()
        error = await rt.until("error")
        assert error[-1][0]["error"]["code"] == "conversation_already_has_active_response"
        await rt.conn.response.cancel()
        done = await rt.until("response.done")
        assert done[-1][0]["response"]["status"] == "cancelled"
        await rt.until("rate_limits.updated")
        await rt.conn.response.cancel()
        assert (await rt.error())["code"] == "response_cancel_not_active"
    assert server.sessions[0].responses_created == 1


async def test_truncate_is_recorded_and_checked_against_the_audio(
    fast: MockRealtimeServer, speech_24k: bytes
) -> None:
    async with realtime(fast) as rt:
        await manual_turns(rt)
        user_item = await commit(rt, speech_24k)
        events = await reply(rt)
        item_id = events[-1][1].response.output[0].id
        reply_ms = len(audio_of(events)) // 48

        await rt.conn.conversation.item.truncate(item_id=item_id, content_index=0, audio_end_ms=800)
        _, truncated = await rt.next()
        assert isinstance(truncated, ConversationItemTruncatedEvent)
        assert (truncated.item_id, truncated.audio_end_ms) == (item_id, 800)

        await rt.conn.conversation.item.truncate(
            item_id=item_id, content_index=0, audio_end_ms=reply_ms
        )
        error = await rt.error()
        assert (error["code"], error["param"]) == ("invalid_value", "audio_end_ms")
        assert error["message"] == f"Audio content of 800ms is already shorter than {reply_ms}ms"

        await rt.conn.conversation.item.truncate(
            item_id="item_nope", content_index=0, audio_end_ms=1
        )
        assert (await rt.error())["code"] == "item_truncate_invalid_item_id"
        await rt.conn.conversation.item.truncate(item_id=user_item, content_index=0, audio_end_ms=1)
        assert (await rt.error())["code"] == "unsupported_content_type"

    assert fast.sessions[0].truncations == [
        {"item_id": item_id, "content_index": 0, "audio_end_ms": 800}
    ]


# --- tools ---------------------------------------------------------------------------


async def test_marker_tone_turn_makes_a_function_call_and_its_output_is_recorded(
    fast: MockRealtimeServer, speech_24k: bytes
) -> None:
    turn = speech_24k[:24_000] + marker_tone_pcm() + speech_24k[:24_000]
    async with realtime(fast) as rt:
        await manual_turns(rt)
        await commit(rt, turn)
        events = await reply(rt)

        kinds = [d["type"] for d, _ in events]
        assert "response.output_audio.delta" not in kinds
        assert kinds[-5:] == [
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "conversation.item.done",
            "response.output_item.done",
            "response.done",
        ]
        deltas = "".join(d["delta"] for d, _ in events if d["type"].endswith("arguments.delta"))
        (done_args,) = [
            e for _, e in events if isinstance(e, ResponseFunctionCallArgumentsDoneEvent)
        ]
        assert done_args.name == DEFAULT_MARKER_TOOL.name == "hangup"
        assert done_args.call_id.startswith("call_")
        assert deltas == done_args.arguments
        assert json.loads(done_args.arguments) == {"reason": "caller asked to end the call"}
        _, response_done = events[-1]
        assert response_done.response.status == "completed"
        (item,) = response_done.response.output
        assert isinstance(item, RealtimeConversationItemFunctionCall)
        assert (item.call_id, item.name) == (done_args.call_id, "hangup")
        assert response_done.response.usage.output_token_details.audio_tokens == 0

        await rt.conn.conversation.item.create(
            item={"type": "function_call_output", "call_id": done_args.call_id, "output": "ok"}
        )
        added = await rt.until("conversation.item.done")
        assert [d["type"] for d, _ in added] == [
            "conversation.item.added",
            "conversation.item.done",
        ]
        assert added[0][0]["item"]["id"].startswith("item_")
        await rt.conn.conversation.item.create(
            item={"type": "function_call_output", "call_id": "call_unknown", "output": "x"}
        )
        assert (await rt.error())["param"] == "item.call_id"

        # The marker is used up: the next response speaks again.
        after = await reply(rt)
        assert len(audio_of(after)) >= 2 * 48_000
        usage = after[-1][1].response.usage
        assert usage.input_token_details.cached_tokens > 0  # re-read context counts as cached

    assert fast.sessions[0].function_call_outputs == [
        {"call_id": done_args.call_id, "output": "ok"}
    ]


async def test_scripted_tool_call_is_used_by_the_next_response(fast: MockRealtimeServer) -> None:
    fast.script_tool_call("lookup_order", {"id": "A-42"})
    async with realtime(fast) as rt:
        first = await reply(rt)
        (call,) = [e for _, e in first if isinstance(e, ResponseFunctionCallArgumentsDoneEvent)]
        assert call.name == "lookup_order"
        assert json.loads(call.arguments) == {"id": "A-42"}
        second = await reply(rt)
        assert len(audio_of(second)) > 0


async def test_text_only_session_replies_in_text(fast: MockRealtimeServer) -> None:
    async with realtime(fast) as rt:
        await rt.conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
        await rt.until("session.updated")
        events = await reply(rt)
    kinds = [d["type"] for d, _ in events]
    assert "response.output_audio.delta" not in kinds
    (text_done,) = [d for d, _ in events if d["type"] == "response.output_text.done"]
    assert text_done["text"] == MOCK_TRANSCRIPT
    assert events[-1][0]["response"]["output"][0]["content"][0]["type"] == "output_text"


# --- faults and bad input ------------------------------------------------------------


async def test_bad_key_is_refused_in_band_like_the_real_service() -> None:
    async with (
        MockRealtimeServer(reject_auth=True) as mock,
        AsyncOpenAI(api_key="sk-mock-bad-key", websocket_base_url=mock.websocket_base_url) as c,
    ):
        # The upgrade succeeds: the SDK's connect does not raise.
        async with c.realtime.connect(model="gpt-realtime") as conn:
            rt = Realtime(conn)
            error = await rt.error()
            assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_api_key")
            assert error["message"].startswith("Incorrect API key provided: sk-***-key.")
            with pytest.raises(ConnectionClosedError) as closed:
                async for _ in conn:
                    pass
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 3000
        assert closed.value.rcvd.reason == "invalid_request_error.invalid_api_key"
        assert mock.sessions[0].rejected == "invalid_api_key"

        mock.reject_auth = False  # settable at runtime
        async with realtime(mock):
            pass


async def test_bad_key_refused_at_the_handshake_raises_invalid_status_401() -> None:
    async with (
        MockRealtimeServer(reject_auth=True, auth_rejection="handshake") as mock,
        AsyncOpenAI(api_key="mock-key", websocket_base_url=mock.websocket_base_url) as client,
    ):
        with pytest.raises(InvalidStatus) as refused:
            async with client.realtime.connect(model="gpt-realtime"):
                pass
        response = refused.value.response
        assert response.status_code == 401
        assert response.headers["Content-Type"] == "application/json"
        assert "MOCK" in response.headers["Server"]
        assert json.loads(response.body)["error"]["code"] == "invalid_api_key"
        assert mock.connections_total == 1
        assert mock.sessions == []


async def test_missing_header_model_or_beta_header_close_the_socket(
    fast: MockRealtimeServer,
) -> None:
    url = fast.websocket_base_url + "/realtime"
    auth = {"Authorization": "Bearer mock-key"}
    cases = [
        (url + "?model=gpt-realtime", {}, None, 3000, "invalid_request_error"),
        (url, auth, "missing_model", 4000, "invalid_request_error.missing_model"),
        (
            url + "?model=gpt-realtime",
            {**auth, "OpenAI-Beta": "realtime=v1"},
            "beta_api_shape_disabled",
            4000,
            "invalid_request_error.beta_api_shape_disabled",
        ),
    ]
    for target, headers, code, close_code, reason in cases:
        async with ws_connect(target, additional_headers=headers) as ws:
            error = json.loads(await ws.recv())
            assert error["type"] == "error" and error["error"]["code"] == code
            with pytest.raises(ConnectionClosedError) as closed:
                await ws.recv()
            assert closed.value.rcvd is not None
            assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (close_code, reason)

    with pytest.raises(InvalidStatus) as not_found:
        async with ws_connect(fast.websocket_base_url + "/other", additional_headers=auth):
            pass
    assert not_found.value.response.status_code == 404


async def test_dropped_connection_makes_the_sdk_iterator_raise(fast: MockRealtimeServer) -> None:
    async with realtime(fast) as rt:

        async def consume() -> None:
            async for _ in rt.conn:
                pass

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.05)
        await fast.drop_connections()
        with pytest.raises(ConnectionClosedError):
            await asyncio.wait_for(task, 5)
    (record,) = fast.sessions
    assert record.closed and record.close_code == 1006


async def test_bad_input_gets_error_events_and_the_session_carries_on(
    fast: MockRealtimeServer,
) -> None:
    async with realtime(fast) as rt:
        send = rt.conn.send_raw
        await send("not json")
        assert (await rt.error())["code"] == "invalid_json"
        await send(json.dumps({"type": "nope", "event_id": "evt_1"}))
        error = await rt.error()
        assert (error["code"], error["param"], error["event_id"]) == (
            "invalid_value",
            "type",
            "evt_1",
        )
        assert error["message"].startswith("Invalid value: 'nope'. Supported values are:")
        await send(b"\x00\x01binary")
        assert (await rt.error())["code"] == "invalid_event"
        await send(json.dumps({"type": "input_audio_buffer.append", "audio": "***"}))
        assert (await rt.error())["param"] == "audio"
        await send(json.dumps({"type": "session.update", "session": {"instructions": "x"}}))
        assert (await rt.error())["param"] == "session.type"
        await send(json.dumps({"type": "session.update", "session": {"type": "transcription"}}))
        assert (await rt.error())["param"] == "session.type"
        await send(json.dumps({"type": "session.update", "session": {"type": "realtime", "x": 1}}))
        assert (await rt.error())["code"] == "unknown_parameter"
        wav_format = {"type": "realtime", "audio": {"input": {"format": {"type": "audio/wav"}}}}
        await send(json.dumps({"type": "session.update", "session": wav_format}))
        assert (await rt.error())["param"] == "session.audio.input.format.type"
        await rt.conn.input_audio_buffer.append(audio=b64(b"\x00\x00" * 240))  # 10 ms
        await rt.conn.input_audio_buffer.commit()
        error = await rt.error()
        assert error["code"] == "input_audio_buffer_commit_empty"
        assert "buffer only has 10.00ms of audio" in error["message"]
        await rt.conn.input_audio_buffer.clear()
        assert (await rt.next())[0]["type"] == "input_audio_buffer.cleared"
        # Null nested objects are legal and must not break the session.
        await send(
            json.dumps(
                {
                    "type": "session.update",
                    "session": {"type": "realtime", "audio": {"input": None}},
                }
            )
        )
        assert (await rt.next())[0]["type"] == "session.updated"
        await rt.conn.input_audio_buffer.append(audio=b64(b"\x00\x00" * 4_800))
        await rt.conn.input_audio_buffer.commit()
        await rt.until("conversation.item.done")
        await manual_turns(rt)  # still alive

    (record,) = fast.sessions
    assert record.malformed_messages == 2
    assert len(record.errors) == 9
    assert record.session_updates[-1]["session"]["audio"]["input"]["turn_detection"] is None
    assert record.appended_bytes == 480 + 9_600


async def test_mulaw_session_detects_the_marker_and_replies_in_mulaw(
    fast: MockRealtimeServer, speech_24k: bytes
) -> None:
    to_8k = StreamResampler(24_000, 8_000, steady=False)
    speech_8k = to_8k.process(speech_24k[:48_000]) + to_8k.flush()
    tone_8k = marker_tone_pcm(sample_rate=8_000)
    async with realtime(fast) as rt:
        await rt.conn.session.update(
            session={
                "type": "realtime",
                "audio": {
                    "input": {"format": {"type": "audio/pcmu"}, "turn_detection": None},
                    "output": {"format": {"type": "audio/pcmu"}},
                },
            }
        )
        await rt.until("session.updated")
        await commit(rt, ulaw_encode(speech_8k + tone_8k + speech_8k))
        call = await reply(rt)
        assert any(isinstance(e, ResponseFunctionCallArgumentsDoneEvent) for _, e in call)
        events = await reply(rt)
    deltas = [e for _, e in events if isinstance(e, ResponseAudioDeltaEvent)]
    assert all(len(base64.b64decode(d.delta)) == DELTA_MS * 8 for d in deltas[:-1])
    audio = audio_of(events)
    assert len(audio) == 2_500 * 8
    assert dbfs(ulaw_decode(audio)) > -30.0
    done = events[-1][1]
    assert done.response.audio.output.format.type == "audio/pcmu"
    assert fast.sessions[0].committed_ms_total == 2 * 1000 + 400


async def test_committed_turns_are_bounded_and_session_close_closes(
    fast: MockRealtimeServer,
) -> None:
    turn = b"\x01\x00" * 2_400  # 100 ms
    async with realtime(fast) as rt:
        await manual_turns(rt)
        for _ in range(MAX_KEPT_TURNS + 3):
            await commit(rt, turn)
        await rt.conn.send_raw(json.dumps({"type": "session.close"}))
        with pytest.raises(ConnectionClosedOK):
            await rt.next()
    (record,) = fast.sessions
    assert record.commits == MAX_KEPT_TURNS + 3
    assert len(record.committed_turns) == MAX_KEPT_TURNS
    await fast.wait_for(lambda: record.closed)
    assert record.close_code == 1000


def test_bad_settings_are_refused() -> None:
    with pytest.raises(MockServerConfigError) as bad:
        MockRealtimeServer(reply_ms=0)
    assert bad.value.reason == "bad_reply_ms"
    with pytest.raises(MockServerConfigError) as bad:
        MockRealtimeServer(speed=0)
    assert bad.value.reason == "bad_speed"


def test_mock_usage_has_the_real_shape() -> None:
    usage = mock_usage(
        input_audio_ms=3_000,
        input_text_chars=40,
        cached_audio_tokens=100,
        cached_text_tokens=4,
        output_audio_ms=2_500,
        output_text_chars=12,
    )
    assert usage == {
        "total_tokens": 30 + 10 + 50 + 3,
        "input_tokens": 40,
        "output_tokens": 53,
        "input_token_details": {
            "text_tokens": 10,
            "audio_tokens": 30,
            "image_tokens": 0,
            "cached_tokens": 34,  # cached audio capped at the 30 input audio tokens
            "cached_tokens_details": {"text_tokens": 4, "audio_tokens": 30, "image_tokens": 0},
        },
        "output_token_details": {"text_tokens": 3, "audio_tokens": 50},
    }


def test_main_prints_a_mock_banner_and_the_base_url() -> None:
    with subprocess.Popen(
        [sys.executable, "-m", "rutster.tools.realtime_mock_server", "--port", "0"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    ) as proc:
        assert proc.stdout is not None
        try:
            banner = proc.stdout.readline()
            url = proc.stdout.readline().strip()
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=10)
    assert "MOCK OpenAI Realtime server (offline, not OpenAI)" in banner
    assert url.startswith("ws://127.0.0.1:") and url.endswith("/v1")
    assert code == 0


# --- mock_voice ----------------------------------------------------------------------


def test_mock_voice_is_deterministic_voiced_and_never_silent() -> None:
    started = time.perf_counter()
    pcm = synthesize_reply(2_000, seed=3)
    assert time.perf_counter() - started < 0.1  # measured ~6 ms
    assert len(pcm) == 2 * 24_000 * 2
    assert pcm == synthesize_reply(2_000, seed=3)
    assert pcm != synthesize_reply(2_000, seed=4)
    windows = [pcm[i : i + 4_800] for i in range(0, len(pcm), 4_800)]  # 100 ms each
    assert min(dbfs(w) for w in windows) > -40.0
    x = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
    assert np.max(np.abs(x)) < 32_767  # not clipped
    # Voiced: each 40 ms stretch repeats at a pitch period between 100 and 220 Hz.
    for start in range(0, x.size - 960, 4_800):
        seg = x[start : start + 960] - x[start : start + 960].mean()
        ac = np.correlate(seg, seg, "full")[seg.size - 1 :]
        lag = int(np.argmax(ac[24_000 // 250 : 24_000 // 80])) + 24_000 // 250
        assert 100 <= 24_000 / lag <= 230
    for seed in range(5):
        assert not contains_marker_tone(synthesize_reply(3_000, seed=seed))


def test_mock_voice_rejects_bad_durations() -> None:
    for bad in (0, -5, 10**9):
        with pytest.raises(MockVoiceError) as err:
            synthesize_reply(bad)
        assert err.value.reason == "bad_duration"


def write_wav(path: Path, rate: int, channels: int = 1, width: int = 2, frames: int = 800) -> Path:
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(channels)
        wav.setsampwidth(width)
        wav.setframerate(rate)
        wav.writeframes(b"\x10\x00" * (frames * channels * width // 2))
    return path


def test_load_reply_wav_resamples_and_refuses_bad_files(tmp_path: Path) -> None:
    pcm = load_reply_wav(SPEECH_WAV)
    assert len(pcm) == 30 * 24_000 * 2  # 30 s at 8 kHz -> 24 kHz
    assert len(load_reply_wav(write_wav(tmp_path / "a.wav", 24_000))) == 800 * 2
    (tmp_path / "junk.wav").write_bytes(b"not a wav at all")
    cases = {
        "not_mono": write_wav(tmp_path / "s.wav", 8_000, channels=2),
        "not_16bit": write_wav(tmp_path / "b.wav", 8_000, width=1),
        "empty": write_wav(tmp_path / "e.wav", 8_000, frames=0),
        "not_wav": tmp_path / "junk.wav",
        "unreadable": tmp_path / "missing.wav",
    }
    for reason, path in cases.items():
        with pytest.raises(ReplyWavError) as err:
            load_reply_wav(path)
        assert err.value.reason == reason


async def test_wav_reply_is_sent_as_is(tmp_path: Path) -> None:
    wav = write_wav(tmp_path / "r.wav", 8_000, frames=8_000)  # 1 s
    async with MockRealtimeServer(reply_wav=wav, speed=math.inf) as mock, realtime(mock) as rt:
        events = await reply(rt)
    assert len(audio_of(events)) == 24_000 * 2
    assert isinstance(events[0][1], pydantic.BaseModel)
    assert not isinstance(events[-1][1], RateLimitsUpdatedEvent)
