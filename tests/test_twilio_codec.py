"""Twilio Media Streams codec: docs/PROVIDERS.md §1.3-1.4 message shapes, the state machine."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from rutster.media.formats import TWILIO_MULAW_8K
from rutster.protocols.ingress import (
    AudioReceived,
    CallContext,
    CallDirection,
    ClearPlayback,
    DtmfReceived,
    IngressProtocolError,
    MarkPlayed,
    PlaceMark,
    PlayAudio,
    StreamConnected,
    StreamStarted,
    StreamStopped,
    UnknownIngressEvent,
)
from rutster.trunk.twilio.codec import (
    MAX_EVENT_NAME_CHARS,
    MAX_MEDIA_PAYLOAD_BYTES,
    MAX_MESSAGE_CHARS,
    PARAM_DIRECTION,
    PARAM_FROM,
    PARAM_TO,
    PARAM_TOKEN,
    TwilioStreamCodec,
)

STREAM_SID = "MZ" + "1" * 32
CALL_SID = "CA" + "2" * 32
SECRET_AUDIO = bytes(range(256)) * 2  # recognisable, to check it never reaches error text

CONNECTED = {"event": "connected", "protocol": "Call", "version": "1.0.0"}


def start_message(**overrides: Any) -> dict[str, Any]:
    """The §1.3 ``start`` message, with ``start`` fields replaced by ``overrides``."""
    start: dict[str, Any] = {
        "accountSid": "AC" + "3" * 32,
        "streamSid": STREAM_SID,
        "callSid": CALL_SID,
        "tracks": ["inbound"],
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
        "customParameters": {
            PARAM_TOKEN: "tok",
            PARAM_FROM: "+15551230000",
            PARAM_TO: "+15559870000",
            PARAM_DIRECTION: "inbound",
        },
    }
    start.update(overrides)
    return {"event": "start", "sequenceNumber": "1", "streamSid": STREAM_SID, "start": start}


def media_message(payload: bytes = b"\xff" * 160, **overrides: Any) -> dict[str, Any]:
    media: dict[str, Any] = {
        "track": "inbound",
        "chunk": "2",
        "timestamp": "5",
        "payload": base64.b64encode(payload).decode("ascii"),
    }
    media.update(overrides)
    return {"event": "media", "sequenceNumber": "3", "streamSid": STREAM_SID, "media": media}


def send(codec: TwilioStreamCodec, message: object) -> object:
    return codec.receive(json.dumps(message))


def started_codec() -> TwilioStreamCodec:
    codec = TwilioStreamCodec()
    send(codec, CONNECTED)
    send(codec, start_message())
    return codec


def protocol_error(codec: TwilioStreamCodec, text: str) -> IngressProtocolError:
    with pytest.raises(IngressProtocolError) as info:
        codec.receive(text)
    return info.value


# ---- §1.3 message shapes -----------------------------------------------------------------


def test_connected() -> None:
    codec = TwilioStreamCodec()
    assert send(codec, CONNECTED) == StreamConnected(protocol="Call")
    assert not codec.started and codec.stream_sid is None and codec.call_sid is None


def test_start() -> None:
    codec = TwilioStreamCodec()
    event = send(codec, start_message())
    assert event == StreamStarted(
        call=CallContext(
            provider="twilio",
            call_id=CALL_SID,
            stream_id=STREAM_SID,
            direction=CallDirection.INBOUND,
            from_="+15551230000",
            to="+15559870000",
        ),
        media_format=TWILIO_MULAW_8K,
        custom_parameters={
            PARAM_TOKEN: "tok",
            PARAM_FROM: "+15551230000",
            PARAM_TO: "+15559870000",
            PARAM_DIRECTION: "inbound",
        },
    )
    assert codec.started and not codec.stopped
    assert codec.stream_sid == STREAM_SID and codec.call_sid == CALL_SID


@pytest.mark.parametrize(
    ("direction", "expected"),
    [
        ("inbound", CallDirection.INBOUND),
        ("outbound-api", CallDirection.OUTBOUND),
        ("outbound-dial", CallDirection.OUTBOUND),
        ("", CallDirection.INBOUND),
        ("sideways", CallDirection.INBOUND),
    ],
)
def test_start_direction(direction: str, expected: CallDirection) -> None:
    event = send(TwilioStreamCodec(), start_message(customParameters={PARAM_DIRECTION: direction}))
    assert isinstance(event, StreamStarted)
    assert event.call.direction is expected


def test_start_without_custom_parameters() -> None:
    start = start_message()
    del start["start"]["customParameters"]
    event = send(TwilioStreamCodec(), start)
    assert isinstance(event, StreamStarted)
    assert event.custom_parameters == {}
    assert event.call.from_ == "" and event.call.to == ""
    assert event.call.direction is CallDirection.INBOUND


def test_start_stream_sid_from_top_level_only() -> None:
    message = start_message()
    del message["start"]["streamSid"]
    event = send(TwilioStreamCodec(), message)
    assert isinstance(event, StreamStarted)
    assert event.call.stream_id == STREAM_SID


def test_media() -> None:
    codec = started_codec()
    event = send(codec, media_message(SECRET_AUDIO[:160]))
    assert event == AudioReceived(payload=SECRET_AUDIO[:160], timestamp_ms=5)


@pytest.mark.parametrize("size", [0, 1, 3, 159, 161, 333])
def test_media_any_length_is_valid(size: int) -> None:
    """μ-law is one byte per sample: odd lengths are fine."""
    event = send(started_codec(), media_message(SECRET_AUDIO[:size]))
    assert isinstance(event, AudioReceived)
    assert event.payload == SECRET_AUDIO[:size]


def test_media_largest_payload() -> None:
    payload = b"\x7f" * MAX_MEDIA_PAYLOAD_BYTES
    text = json.dumps(media_message(payload))
    assert len(text) <= MAX_MESSAGE_CHARS
    event = started_codec().receive(text)
    assert isinstance(event, AudioReceived) and event.payload == payload


@pytest.mark.parametrize(("raw", "expected"), [("0", 0), ("123456789", 123456789), (42, 42)])
def test_media_timestamp(raw: object, expected: int) -> None:
    event = send(started_codec(), media_message(timestamp=raw))
    assert isinstance(event, AudioReceived) and event.timestamp_ms == expected


def test_media_without_track_or_timestamp() -> None:
    message = media_message()
    del message["media"]["track"], message["media"]["timestamp"]
    event = send(started_codec(), message)
    assert isinstance(event, AudioReceived) and event.timestamp_ms is None


@pytest.mark.parametrize("digit", list("0123456789*#ABCD"))
def test_dtmf(digit: str) -> None:
    message = {
        "event": "dtmf",
        "sequenceNumber": "5",
        "streamSid": STREAM_SID,
        "dtmf": {"track": "inbound_track", "digit": digit},
    }
    assert send(started_codec(), message) == DtmfReceived(digit=digit)


def test_mark() -> None:
    message = {
        "event": "mark",
        "sequenceNumber": "4",
        "streamSid": STREAM_SID,
        "mark": {"name": "my label"},
    }
    assert send(started_codec(), message) == MarkPlayed(name="my label")


def test_stop() -> None:
    codec = started_codec()
    message = {
        "event": "stop",
        "sequenceNumber": "5",
        "streamSid": STREAM_SID,
        "stop": {"accountSid": "AC1", "callSid": CALL_SID},
    }
    assert send(codec, message) == StreamStopped(reason="stop")
    assert codec.stopped and codec.started


def test_stop_before_start_is_accepted() -> None:
    codec = TwilioStreamCodec()
    assert send(codec, {"event": "stop", "stop": {}}) == StreamStopped(reason="stop")
    assert codec.stopped and not codec.started


def test_full_sequence() -> None:
    codec = TwilioStreamCodec()
    kinds = [
        type(send(codec, message)).__name__
        for message in [
            CONNECTED,
            start_message(),
            media_message(),
            {"event": "dtmf", "streamSid": STREAM_SID, "dtmf": {"digit": "1"}},
            {"event": "mark", "streamSid": STREAM_SID, "mark": {"name": "m"}},
            media_message(),
            {"event": "stop", "streamSid": STREAM_SID, "stop": {}},
        ]
    ]
    assert kinds == [
        "StreamConnected",
        "StreamStarted",
        "AudioReceived",
        "DtmfReceived",
        "MarkPlayed",
        "AudioReceived",
        "StreamStopped",
    ]


# ---- errors -------------------------------------------------------------------------------


def test_too_large_is_checked_before_parsing() -> None:
    error = protocol_error(started_codec(), "x" * (MAX_MESSAGE_CHARS + 1))
    assert (error.reason, error.fatal) == ("too_large", False)


@pytest.mark.parametrize(
    "text", ["", "{", "nope", '{"event": "media",}', "[" * 50_000, "1" * 5000, "\ud800"]
)
def test_malformed_json(text: str) -> None:
    error = protocol_error(started_codec(), text)
    assert (error.reason, error.fatal) == ("malformed_json", False)


@pytest.mark.parametrize("text", ["[]", '"media"', "1", "null", "true", '[{"event":"media"}]'])
def test_not_an_object(text: str) -> None:
    assert protocol_error(started_codec(), text).reason == "not_an_object"


def test_missing_event() -> None:
    assert protocol_error(started_codec(), '{"streamSid": "MZ1"}').reason == "missing_event"
    assert protocol_error(started_codec(), '{"event": null}').reason == "missing_event"


@pytest.mark.parametrize(
    "message",
    [
        {"event": 1},
        {"event": ["media"]},
        {"event": "connected"},
        {"event": "connected", "protocol": 1},
        {"event": "media", "streamSid": STREAM_SID},
        {"event": "media", "media": "payload"},
        {"event": "media", "media": {"track": "inbound"}},
        {"event": "media", "media": {"payload": 123}},
        media_message(timestamp="-5"),
        media_message(timestamp="5.0"),
        media_message(timestamp=" 5"),
        media_message(timestamp="٣"),
        media_message(timestamp="9" * 5000),
        media_message(timestamp=True),
        media_message(timestamp=-1),
        media_message(timestamp=5.5),
        {"event": "dtmf", "dtmf": {"digit": "E"}},
        {"event": "dtmf", "dtmf": {"digit": "12"}},
        {"event": "dtmf", "dtmf": {"digit": 1}},
        {"event": "dtmf", "dtmf": {}},
        {"event": "dtmf"},
        {"event": "mark", "mark": {"name": None}},
        {"event": "mark", "mark": []},
        {"event": "mark"},
    ],
)
def test_bad_field(message: dict[str, Any]) -> None:
    error = protocol_error(started_codec(), json.dumps(message))
    assert (error.reason, error.fatal) == ("bad_field", False)


@pytest.mark.parametrize(
    "payload",
    ["not base64!", "AAA", "A", "AA=A", "AAAA\n", " AAAA", "/w-_", "ÿÿÿÿ", "=AAA", "AAAA\u0000"],
)
def test_bad_base64(payload: str) -> None:
    message = media_message()
    message["media"]["payload"] = payload
    error = protocol_error(started_codec(), json.dumps(message))
    assert (error.reason, error.fatal) == ("bad_base64", False)


def test_surplus_padding_is_tolerated() -> None:
    """b64decode(validate=True) accepts padding after a full quantum; harmless, so it stays."""
    message = media_message()
    message["media"]["payload"] = "AAAA=="
    event = send(started_codec(), message)
    assert isinstance(event, AudioReceived) and event.payload == b"\x00\x00\x00"


def test_payload_too_large() -> None:
    message = media_message(b"\x00" * (MAX_MEDIA_PAYLOAD_BYTES + 3))
    error = protocol_error(started_codec(), json.dumps(message))
    assert (error.reason, error.fatal) == ("payload_too_large", False)


@pytest.mark.parametrize("track", ["outbound", "inbound_track", "both", "", None, 1])
def test_unexpected_track(track: object) -> None:
    error = protocol_error(started_codec(), json.dumps(media_message(track=track)))
    assert (error.reason, error.fatal) == ("unexpected_track", False)


@pytest.mark.parametrize(
    "message",
    [
        media_message(),
        {"event": "dtmf", "dtmf": {"digit": "1"}},
        {"event": "mark", "mark": {"name": "m"}},
    ],
)
def test_stream_messages_before_start(message: dict[str, Any]) -> None:
    codec = TwilioStreamCodec()
    send(codec, CONNECTED)
    error = protocol_error(codec, json.dumps(message))
    assert (error.reason, error.fatal) == ("media_before_start", False)
    # The stream can still start afterwards: the message was only dropped.
    assert isinstance(send(codec, start_message()), StreamStarted)


@pytest.mark.parametrize(
    "message",
    [
        media_message(),
        CONNECTED,
        start_message(),
        {"event": "stop", "stop": {}},
        {"event": "mark", "mark": {"name": "m"}},
        {"event": "brand-new"},
    ],
)
def test_message_after_stop(message: dict[str, Any]) -> None:
    codec = started_codec()
    send(codec, {"event": "stop", "stop": {}})
    error = protocol_error(codec, json.dumps(message))
    assert (error.reason, error.fatal) == ("message_after_stop", False)


def test_duplicate_start_is_fatal() -> None:
    codec = started_codec()
    error = protocol_error(codec, json.dumps(start_message(callSid="CA" + "9" * 32)))
    assert (error.reason, error.fatal) == ("duplicate_start", True)
    assert codec.call_sid == CALL_SID  # the first start still stands


@pytest.mark.parametrize(
    "media_format",
    [
        {"encoding": "audio/x-alaw", "sampleRate": 8000, "channels": 1},
        {"encoding": "audio/l16", "sampleRate": 16000, "channels": 1},
        {"encoding": "audio/x-mulaw", "sampleRate": 16000, "channels": 1},
        {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 2},
        {"encoding": "audio/x-mulaw", "sampleRate": "8000", "channels": 1},
        {"encoding": "audio/x-mulaw", "sampleRate": 8000.0, "channels": 1},
        {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": True},
        {"encoding": "audio/x-mulaw", "sampleRate": 8000},
        {},
    ],
)
def test_unsupported_media_format_is_fatal(media_format: dict[str, Any]) -> None:
    codec = TwilioStreamCodec()
    error = protocol_error(codec, json.dumps(start_message(mediaFormat=media_format)))
    assert (error.reason, error.fatal) == ("unsupported_media_format", True)
    assert not codec.started


def _without(key: str) -> dict[str, Any]:
    message = start_message()
    del message["start"][key]
    return message


@pytest.mark.parametrize(
    "message",
    [
        {"event": "start"},
        {"event": "start", "start": "x"},
        _without("callSid"),
        _without("mediaFormat"),
        start_message(callSid=7),
        start_message(callSid=""),
        start_message(streamSid=None),
        start_message(streamSid="MZ-other"),  # disagrees with the top-level streamSid
        start_message(mediaFormat="audio/x-mulaw"),
        start_message(customParameters=[]),
        start_message(customParameters="a=b"),
        start_message(customParameters={"from": 15551230000}),
        start_message(customParameters={"x": None}),
        start_message(customParameters={"x": {"nested": "y"}}),
    ],
)
def test_bad_start_is_fatal(message: dict[str, Any]) -> None:
    codec = TwilioStreamCodec()
    error = protocol_error(codec, json.dumps(message))
    assert (error.reason, error.fatal) == ("bad_start", True)
    assert not codec.started and codec.stream_sid is None


def test_start_without_any_stream_sid_is_fatal() -> None:
    message = start_message()
    del message["start"]["streamSid"], message["streamSid"]
    assert protocol_error(TwilioStreamCodec(), json.dumps(message)).reason == "bad_start"


def test_unknown_event() -> None:
    codec = started_codec()
    with pytest.raises(UnknownIngressEvent) as info:
        send(codec, {"event": "transcription", "streamSid": STREAM_SID})
    assert info.value.event_type == "transcription"
    with pytest.raises(UnknownIngressEvent) as info:
        send(codec, {"event": "x" * 10_000})
    assert len(info.value.event_type) == MAX_EVENT_NAME_CHARS
    # Forward compatibility: the stream carries on.
    assert isinstance(send(codec, media_message()), AudioReceived)


def test_errors_never_contain_payload() -> None:
    encoded = base64.b64encode(SECRET_AUDIO).decode("ascii")
    tail = encoded[-40:]
    codec = started_codec()
    cases = [
        json.dumps(media_message(SECRET_AUDIO, track="outbound")),
        json.dumps(media_message(SECRET_AUDIO, timestamp="x")),
        json.dumps(media_message(SECRET_AUDIO))[:-3],  # truncated JSON
        json.dumps({"event": "media", "media": {"payload": encoded + "!"}}),
        json.dumps({"event": "media", "media": {"payload": encoded * 200}}),
        "x" * 10 + encoded * 300,
    ]
    for text in cases:
        with pytest.raises(IngressProtocolError) as info:
            codec.receive(text)
        assert tail not in str(info.value) and len(str(info.value)) < 200


# ---- §1.4 outbound ------------------------------------------------------------------------


def test_encode_media() -> None:
    codec = started_codec()
    text = codec.encode(PlayAudio(SECRET_AUDIO[:161]))
    assert json.loads(text) == {
        "event": "media",
        "streamSid": STREAM_SID,
        "media": {"payload": base64.b64encode(SECRET_AUDIO[:161]).decode("ascii")},
    }


def test_encode_mark_and_clear() -> None:
    codec = started_codec()
    assert json.loads(codec.encode(PlaceMark("resp-17-part-3"))) == {
        "event": "mark",
        "streamSid": STREAM_SID,
        "mark": {"name": "resp-17-part-3"},
    }
    assert json.loads(codec.encode(ClearPlayback())) == {"event": "clear", "streamSid": STREAM_SID}


def test_encode_escapes_names() -> None:
    codec = TwilioStreamCodec()
    odd_sid = 'MZ"\\\n</'
    send(codec, start_message(streamSid=odd_sid) | {"streamSid": odd_sid})
    name = 'a"b\\c\nü'
    for command in (PlayAudio(b"\x01\x02"), PlaceMark(name), ClearPlayback()):
        decoded = json.loads(codec.encode(command))
        assert decoded["streamSid"] == odd_sid
    assert json.loads(codec.encode(PlaceMark(name)))["mark"]["name"] == name


def test_encode_round_trips_through_receive_shape() -> None:
    """What we send as media is exactly what a Twilio media frame's payload decodes to."""
    codec = started_codec()
    payload = SECRET_AUDIO[:7]
    outbound = json.loads(codec.encode(PlayAudio(payload)))
    inbound = media_message() | {"media": outbound["media"]}
    event = send(codec, inbound)
    assert isinstance(event, AudioReceived) and event.payload == payload


@pytest.mark.parametrize("command", [PlayAudio(b"\x00"), PlaceMark("m"), ClearPlayback()])
def test_encode_before_start_is_a_programming_error(
    command: PlayAudio | PlaceMark | ClearPlayback,
) -> None:
    codec = TwilioStreamCodec()
    send(codec, CONNECTED)
    with pytest.raises(RuntimeError):
        codec.encode(command)


def test_encode_after_stop_still_works() -> None:
    codec = started_codec()
    send(codec, {"event": "stop", "stop": {}})
    assert json.loads(codec.encode(ClearPlayback()))["event"] == "clear"
