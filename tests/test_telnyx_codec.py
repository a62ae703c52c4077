"""The Telnyx stream codec (trunk/telnyx/codec.py): parsing, reordering, bad input, encoding."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from rutster.protocols.ingress import (
    AudioReceived,
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
from rutster.trunk.telnyx.codec import (
    MAX_MEDIA_PAYLOAD_BYTES,
    REORDER_WINDOW_FRAMES,
    FrameHeld,
    TelnyxStreamCodec,
    TelnyxStreamError,
    sniff_telnyx_stream,
)

CALL_CONTROL_ID = "v3:abcDEF123_-xyz"
STREAM_ID = "32DE0DEA-53CB-4B21-89A4-9E1819C043BC"


def start(**overrides: Any) -> str:
    body: dict[str, Any] = {
        "call_control_id": CALL_CONTROL_ID,
        "call_session_id": "s1",
        "from": "+13125550001",
        "to": "+13125550002",
        "media_format": {"encoding": "PCMU", "sample_rate": 8000, "channels": 1},
        "custom_parameters": [
            {"name": "token", "value": "t1"},
            {"name": "direction", "value": "inbound"},
        ],
    }
    body.update(overrides)
    return json.dumps(
        {"event": "start", "sequence_number": "1", "stream_id": STREAM_ID, "start": body}
    )


def media(number: int | None, payload: bytes = b"\xff" * 160, **extra: Any) -> str:
    m: dict[str, Any] = {
        "track": "inbound",
        "timestamp": "0",
        "payload": base64.b64encode(payload).decode(),
    }
    if number is not None:
        m["chunk"] = str(number)
    m.update(extra)
    return json.dumps(
        {"event": "media", "sequence_number": "9", "stream_id": STREAM_ID, "media": m}
    )


def started(url_parameters: dict[str, str] | None = None) -> TelnyxStreamCodec:
    codec = TelnyxStreamCodec(url_parameters)
    assert isinstance(codec.receive(start()), StreamStarted)
    return codec


def test_start_gives_the_call_and_its_parameters() -> None:
    codec = TelnyxStreamCodec({"token": "from-url", "tap_url": "ws://b"})
    event = codec.receive(start())
    assert isinstance(event, StreamStarted)
    assert event.call.provider == "telnyx"
    assert event.call.call_id == CALL_CONTROL_ID and event.call.stream_id == STREAM_ID
    assert (event.call.from_, event.call.to) == ("+13125550001", "+13125550002")
    assert event.call.direction is CallDirection.INBOUND
    # start's parameters win over the URL's; the URL's fill in the rest.
    assert event.custom_parameters == {"token": "t1", "direction": "inbound", "tap_url": "ws://b"}
    assert codec.call_control_id == CALL_CONTROL_ID


@pytest.mark.parametrize(
    "params",
    [
        {"token": "t1", "direction": "outbound-api"},
        [{"name": "direction", "value": "outbound-api"}],
    ],
)
def test_custom_parameters_as_an_object_or_a_list(params: object) -> None:
    event = TelnyxStreamCodec().receive(start(custom_parameters=params))
    assert isinstance(event, StreamStarted)
    assert event.call.direction is CallDirection.OUTBOUND


def test_the_older_mime_name_of_pcmu_is_taken() -> None:
    fmt = {"encoding": "audio/x-mulaw", "sample_rate": 8000, "channels": 1}
    assert isinstance(TelnyxStreamCodec().receive(start(media_format=fmt)), StreamStarted)


@pytest.mark.parametrize(
    "fmt",
    [
        {"encoding": "PCMA", "sample_rate": 8000, "channels": 1},
        {"encoding": "L16", "sample_rate": 16000, "channels": 1},
        {"encoding": "PCMU", "sample_rate": "8000", "channels": 1},
        {"encoding": "PCMU", "sample_rate": 8000, "channels": 2},
        None,
    ],
)
def test_a_format_other_than_the_one_asked_for_is_fatal(fmt: object) -> None:
    with pytest.raises(IngressProtocolError) as err:
        TelnyxStreamCodec().receive(start(media_format=fmt))
    assert err.value.fatal
    assert err.value.reason in {"unsupported_media_format", "bad_start"}


@pytest.mark.parametrize(
    "overrides",
    [
        {"call_control_id": ""},
        {"call_control_id": 5},
        {"custom_parameters": "token=t"},
        {"custom_parameters": [{"name": "token", "value": 5}]},
        {"custom_parameters": ["token"]},
    ],
)
def test_a_start_that_cannot_set_up_a_call_is_fatal(overrides: dict[str, Any]) -> None:
    with pytest.raises(IngressProtocolError) as err:
        TelnyxStreamCodec().receive(start(**overrides))
    assert (err.value.reason, err.value.fatal) == ("bad_start", True)


def test_a_second_start_is_fatal() -> None:
    codec = started()
    with pytest.raises(IngressProtocolError) as err:
        codec.receive(start())
    assert (err.value.reason, err.value.fatal) == ("duplicate_start", True)


def test_events_after_start() -> None:
    codec = started()
    assert codec.receive(json.dumps({"event": "connected", "version": "1.0.0"})) == StreamConnected(
        "telnyx/1.0.0"
    )
    assert codec.receive(json.dumps({"event": "dtmf", "dtmf": {"digit": "7"}})) == DtmfReceived("7")
    assert codec.receive(json.dumps({"event": "mark", "mark": {"name": "42"}})) == MarkPlayed("42")
    error = codec.receive(
        json.dumps({"event": "error", "payload": {"code": 100005, "title": "rate_limit_reached"}})
    )
    assert error == TelnyxStreamError(code="100005", title="rate_limit_reached")
    assert codec.receive(json.dumps({"event": "stop", "stop": {}})) == StreamStopped("stop")
    with pytest.raises(IngressProtocolError) as err:
        codec.receive(media(1))
    assert err.value.reason == "message_after_stop"


def test_frames_in_order_pass_straight_through() -> None:
    codec = started()
    for chunk in range(1, 6):
        event = codec.receive(media(chunk, bytes([chunk]) * 160))
        assert event == AudioReceived(bytes([chunk]) * 160, 0)
    assert (codec.frames_reordered, codec.frames_skipped) == (0, 0)


def test_a_swapped_pair_is_put_back_in_order() -> None:
    codec = started()
    assert isinstance(codec.receive(media(1, b"\x01" * 160)), AudioReceived)
    assert codec.receive(media(3, b"\x03" * 160)) == FrameHeld()
    both = codec.receive(media(2, b"\x02" * 160))
    assert isinstance(both, AudioReceived)
    assert both.payload == b"\x02" * 160 + b"\x03" * 160
    assert codec.receive(media(4, b"\x04" * 160)) == AudioReceived(b"\x04" * 160, 0)
    assert codec.frames_reordered == 1


def test_a_gap_that_never_fills_is_skipped_after_the_window() -> None:
    codec = started()
    codec.receive(media(1))
    held = [codec.receive(media(c, bytes([c]) * 160)) for c in range(3, 3 + REORDER_WINDOW_FRAMES)]
    assert held == [FrameHeld()] * REORDER_WINDOW_FRAMES
    # One more frame than the window holds: chunk 2 is given up, and everything after it goes.
    last = 3 + REORDER_WINDOW_FRAMES
    out = codec.receive(media(last, bytes([last]) * 160))
    assert isinstance(out, AudioReceived)
    assert out.payload == b"".join(bytes([c]) * 160 for c in range(3, last + 1))
    assert codec.frames_skipped == 1
    # The lost frame arriving at last is late: dropped, not played out of place.
    with pytest.raises(IngressProtocolError) as err:
        codec.receive(media(2))
    assert (err.value.reason, err.value.fatal) == ("late_frame", False)


def test_a_duplicate_frame_is_dropped() -> None:
    codec = started()
    codec.receive(media(1))
    with pytest.raises(IngressProtocolError) as err:
        codec.receive(media(1))
    assert err.value.reason == "late_frame"


def test_frames_without_a_chunk_are_taken_as_they_come() -> None:
    codec = started()
    assert codec.receive(media(None, b"\x01" * 160)) == AudioReceived(b"\x01" * 160, 0)


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        ("{", "malformed_json"),
        ("[1]", "not_an_object"),
        ("{}", "missing_event"),
        (json.dumps({"event": 5}), "bad_field"),
        (media(2, track="outbound"), "unexpected_track"),
        (json.dumps({"event": "media", "media": {"payload": "!!"}}), "bad_base64"),
        (json.dumps({"event": "media", "media": {}}), "bad_field"),
        (media(None, b"\xff" * 160, chunk="-1"), "bad_field"),
        (media(2, b"\x00" * (MAX_MEDIA_PAYLOAD_BYTES + 1)), "payload_too_large"),
        ("x" * 200_000, "too_large"),
        (json.dumps({"event": "dtmf", "dtmf": {"digit": "Z"}}), "bad_field"),
        (json.dumps({"event": "mark", "mark": {}}), "bad_field"),
    ],
)
def test_bad_frames_are_dropped_with_a_reason(frame: str, reason: str) -> None:
    codec = started()
    with pytest.raises(IngressProtocolError) as err:
        codec.receive(frame)
    assert (err.value.reason, err.value.fatal) == (reason, False)
    assert isinstance(codec.receive(media(1)), AudioReceived)  # the stream goes on


def test_media_before_start_and_unknown_events() -> None:
    codec = TelnyxStreamCodec()
    with pytest.raises(IngressProtocolError) as err:
        codec.receive(media(1))
    assert err.value.reason == "media_before_start"
    with pytest.raises(UnknownIngressEvent):
        codec.receive(json.dumps({"event": "something_new"}))


def test_encode_speaks_telnyx() -> None:
    codec = started()
    assert json.loads(codec.encode(PlayAudio(b"\xff\x7f"))) == {
        "event": "media",
        "media": {"payload": base64.b64encode(b"\xff\x7f").decode()},
    }
    assert json.loads(codec.encode(PlaceMark("7"))) == {"event": "mark", "mark": {"name": "7"}}
    assert json.loads(codec.encode(ClearPlayback())) == {"event": "clear"}
    with pytest.raises(RuntimeError):
        TelnyxStreamCodec().encode(ClearPlayback())


@pytest.mark.parametrize(
    ("first", "telnyx"),
    [
        (json.dumps({"event": "connected", "version": "1.0.0"}), True),
        (start(), True),
        (json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}), False),
        (json.dumps({"event": "start", "stream_id": "x", "start": {}}), False),
        (json.dumps({"event": "start", "streamSid": "MZ", "start": {"callSid": "CA"}}), False),
        ("nope", False),
        (b"\x00" * 10, False),
        ("[" * 100_000, False),
    ],
)
def test_sniff(first: str | bytes, telnyx: bool) -> None:
    assert sniff_telnyx_stream(first) is telnyx
