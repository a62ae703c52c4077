"""SIP worker <-> gateway wire protocol: round trips, limits and every error path."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rutster.protocols.ingress import (
    DTMF_DIGITS,
    AudioReceived,
    CallContext,
    CallDirection,
    ClearPlayback,
    DtmfReceived,
    IngressProtocolError,
    MarkPlayed,
    PlaceMark,
    PlayAudio,
    StreamStarted,
    StreamStopped,
    UnknownIngressEvent,
)
from rutster.trunk.sip.wire import (
    CONTROL_SCHEMAS,
    MAX_AUDIO_FRAME_BYTES,
    MAX_CONTROL_BYTES,
    MAX_HEADER_NAME_CHARS,
    MAX_HEADER_VALUE_CHARS,
    MAX_HEADERS,
    MAX_ID_CHARS,
    MAX_OPAQUE_CHARS,
    MAX_RING_TIMEOUT_S,
    MAX_SIP_CALL_ID_CHARS,
    MAX_TEXT_FRAME_BYTES,
    MAX_URI_CHARS,
    MAX_WORKER_CAPACITY,
    PROTOCOL_VERSION,
    SIP_L16_16K,
    Admit,
    CancelDial,
    ControlMessage,
    ControlResult,
    Dial,
    DialResult,
    HangUpLeg,
    Hello,
    InviteRequest,
    LoadReport,
    Refuse,
    SipMediaCodec,
    TransferLeg,
    WireError,
    WorkerMediaCodec,
    bound_headers,
    encode_control,
    parse_control,
)

CALL_ID = "call_0123abcd"
TOKEN = "SECRET-TOKEN-v1.abcdef"
TAP = "ws://127.0.0.1:9000/tap"
SPEND = "v1|call_0123abcd|acme|inbound|3600|5000000|600000|0"

MESSAGES: list[ControlMessage] = [
    Hello(worker="w-1", sip_uri="sip:127.0.0.1:5070", capacity=4),
    InviteRequest(
        ref="r:1",
        sip_call_id="a84b4c76e66710@pc33.example.com",
        from_='"Alice" <sip:alice@example.com>',
        to="sip:+15559870000@127.0.0.1",
        source="[::1]:5060",
        transport="tcp",
        headers={"x-tenant": "acme", "User-Agent": "Zoiper", "Subject": ""},
    ),
    InviteRequest("r2", "id@h", "sip:a@b", "sip:c@d", "127.0.0.1:5060", "udp"),
    DialResult(call_id=CALL_ID, outcome="answered", sip_code=200, reason="answered"),
    DialResult(call_id=CALL_ID, outcome="failed", sip_code=486, reason="busy"),
    LoadReport(active=0),
    Admit(ref="r:1", call_id=CALL_ID, tap_url=TAP, spend=SPEND, token=TOKEN),
    Refuse(ref="r:1", sip_code=503, reason="over_capacity"),
    Dial(CALL_ID, "sip:bob@10.0.0.1:5060", "+15551230000", "wss://brain/x", SPEND, TOKEN, 30),
    Dial(CALL_ID, "sips:bob@example.com", "sip:rutster@example.com", TAP, SPEND, TOKEN),
    CancelDial(CALL_ID),
]


def control(kind: str, **overrides: Any) -> str:
    """A valid control frame of ``kind`` with fields replaced (None removes one)."""
    body = next(json.loads(encode_control(m)) for m in MESSAGES if kind == m.TYPE)
    body.update(overrides)
    return json.dumps({k: v for k, v in body.items() if v is not None})


def reason_of(text: str) -> str:
    with pytest.raises(WireError) as info:
        parse_control(text)
    return info.value.reason


# ---- control channel -------------------------------------------------------------


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: m.TYPE)
def test_control_round_trip(message: ControlMessage) -> None:
    text = encode_control(message)
    assert json.loads(text)["type"] == message.TYPE
    assert parse_control(text) == message
    assert type(parse_control(text)) is type(message)


def test_control_uses_from_on_the_wire_and_compact_json() -> None:
    text = encode_control(MESSAGES[1])
    assert '"from":"\\"Alice\\" <sip:alice@example.com>"' in text
    assert ", " not in text.split('"headers"')[0]
    assert json.loads(encode_control(MESSAGES[0]))["protocol"] == PROTOCOL_VERSION


def test_every_control_type_has_a_schema_with_no_unknown_fields() -> None:
    assert set(CONTROL_SCHEMAS) == {m.TYPE for m in MESSAGES}
    for schema in CONTROL_SCHEMAS.values():
        assert schema["additionalProperties"] is False


def test_secrets_stay_out_of_repr_and_errors() -> None:
    assert TOKEN not in repr(MESSAGES[6]) and TOKEN not in repr(MESSAGES[8])
    too_long = TOKEN * 100
    with pytest.raises(WireError) as info:
        parse_control(control("admit", token=too_long))
    assert info.value.reason == "schema"
    assert TOKEN not in str(info.value)
    assert "token" in str(info.value)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{", "malformed_json"),
        ('{"type": 1e999999}', "missing_type"),  # inf is not a string
        ("1" * 5000, "malformed_json"),  # over the int-string digit limit
        ("[" * 5000 + "]" * 5000, "too_large"),
        ("[" * 3000 + "]" * 3000, "malformed_json"),  # deeper than the parser's stack
        ('["hello"]', "not_an_object"),
        ('"hello"', "not_an_object"),
        ("{}", "missing_type"),
        ('{"type": ["hello"]}', "missing_type"),
        ('{"type": "goodbye"}', "unknown_type"),
        ('{"type": "HELLO"}', "unknown_type"),
        (" " * (MAX_CONTROL_BYTES + 1), "too_large"),
        ('{"type":"load","active":1,"x":"' + "é" * (MAX_CONTROL_BYTES // 2) + '"}', "too_large"),
    ],
)
def test_control_frame_errors(text: str, reason: str) -> None:
    assert reason_of(text) == reason


def test_unknown_type_error_names_the_type_safely() -> None:
    with pytest.raises(WireError) as info:
        parse_control(json.dumps({"type": "x\n" * 100}))
    assert info.value.reason == "unknown_type"
    assert "\n" not in str(info.value) and len(str(info.value)) < 200


def test_hello_protocol_mismatch_is_its_own_reason() -> None:
    assert reason_of(control("hello", protocol=2)) == "unsupported_protocol"
    assert reason_of(control("hello", protocol=2, extra=1)) == "unsupported_protocol"
    assert reason_of(control("hello", protocol="1")) == "schema"
    assert reason_of(control("hello", protocol=True)) == "schema"


@pytest.mark.parametrize(
    ("kind", "overrides", "ok"),
    [
        # call ids: call_[A-Za-z0-9_-]{1,64}
        ("admit", {"call_id": "call_" + "a" * 64}, True),
        ("admit", {"call_id": "call_A-b_9"}, True),
        ("admit", {"call_id": "call_" + "a" * 65}, False),
        ("admit", {"call_id": "call_"}, False),
        ("admit", {"call_id": "call_abc\n"}, False),  # "$" must not match before a newline
        ("admit", {"call_id": "CALL_abc"}, False),
        ("admit", {"call_id": "call_a b"}, False),
        # SIP codes: refuse/failed 400..699, answered 2xx
        ("refuse", {"sip_code": 400}, True),
        ("refuse", {"sip_code": 699}, True),
        ("refuse", {"sip_code": 399}, False),
        ("refuse", {"sip_code": 700}, False),
        ("refuse", {"sip_code": 486.0}, False),
        ("refuse", {"sip_code": True}, False),
        ("refuse", {"sip_code": "486"}, False),
        ("dial_result", {"outcome": "failed", "sip_code": 200}, False),
        ("dial_result", {"outcome": "answered", "sip_code": 486}, False),
        ("dial_result", {"outcome": "answered", "sip_code": 299}, True),
        ("dial_result", {"outcome": "failed", "sip_code": 603}, True),
        ("dial_result", {"outcome": "maybe"}, False),
        # labels
        ("refuse", {"reason": "Busy Here"}, False),
        ("refuse", {"reason": "a" * 65}, False),
        ("refuse", {"reason": ""}, True),  # nothing to add
        ("refuse", {"reason": "_x"}, False),
        ("cancel_dial", {"call_id": "CA123"}, False),
        # refs and worker ids
        ("refuse", {"ref": "x" * MAX_ID_CHARS}, True),
        ("refuse", {"ref": "x" * (MAX_ID_CHARS + 1)}, False),
        ("hello", {"worker": "w/1"}, False),
        # capacity and load
        ("hello", {"capacity": MAX_WORKER_CAPACITY}, True),
        ("hello", {"capacity": 0}, False),
        ("hello", {"capacity": MAX_WORKER_CAPACITY + 1}, False),
        ("hello", {"sip_uri": "http://x"}, False),
        ("load", {"active": -1}, False),
        ("load", {"active": MAX_WORKER_CAPACITY}, True),
        # URIs are bounded strings
        ("invite", {"from": "x" * MAX_URI_CHARS}, True),
        ("invite", {"from": "x" * (MAX_URI_CHARS + 1)}, False),
        ("invite", {"from": ""}, False),
        ("invite", {"to": "sip:a\r\nVia: evil"}, False),
        ("invite", {"to": "sip:\ud800"}, False),  # cannot be re-encoded as UTF-8
        ("invite", {"sip_call_id": "x" * MAX_SIP_CALL_ID_CHARS}, True),
        ("invite", {"sip_call_id": "x" * (MAX_SIP_CALL_ID_CHARS + 1)}, False),
        ("invite", {"sip_call_id": "has space"}, False),
        ("invite", {"source": "10.0.0.1:5060 "}, False),
        ("invite", {"transport": "tls"}, False),
        # headers: <= 16, names are SIP tokens, values <= 256 printable chars
        ("invite", {"headers": {f"X-H{i}": "v" for i in range(MAX_HEADERS)}}, True),
        ("invite", {"headers": {f"X-H{i}": "v" for i in range(MAX_HEADERS + 1)}}, False),
        ("invite", {"headers": {"X-A": "v" * MAX_HEADER_VALUE_CHARS}}, True),
        ("invite", {"headers": {"X-A": "v" * (MAX_HEADER_VALUE_CHARS + 1)}}, False),
        ("invite", {"headers": {"X A": "v"}}, False),
        ("invite", {"headers": {"": "v"}}, False),
        ("invite", {"headers": {"x" * (MAX_HEADER_NAME_CHARS + 1): "v"}}, False),
        ("invite", {"headers": {"X-A": 1}}, False),
        ("invite", {"headers": {"X-A": "a\nb"}}, False),
        ("invite", {"headers": {"X-A": "a\tb"}}, True),  # HTAB is SIP whitespace
        ("invite", {"headers": []}, False),
        # dial
        ("dial", {"to": "+15551230000"}, True),
        ("dial", {"to": "15551230000"}, False),
        ("dial", {"from": "+15551230000"}, True),
        ("dial", {"from": "15551230000"}, False),
        ("dial", {"from": "alice"}, False),
        ("dial", {"tap_url": "http://brain/x"}, False),
        ("dial", {"ring_timeout_s": 0}, False),
        ("dial", {"ring_timeout_s": MAX_RING_TIMEOUT_S}, True),
        ("dial", {"ring_timeout_s": MAX_RING_TIMEOUT_S + 1}, False),
        ("dial", {"token": "t" * MAX_OPAQUE_CHARS}, True),
        ("dial", {"token": "t" * (MAX_OPAQUE_CHARS + 1)}, False),
        ("dial", {"spend": ""}, False),
        # shape
        ("load", {"extra": 1}, False),
        ("load", {"active": None}, False),
        ("admit", {"token": None}, False),
    ],
)
def test_control_limits(kind: str, overrides: dict[str, Any], ok: bool) -> None:
    text = control(kind, **overrides)
    if ok:
        message = parse_control(text)
        assert parse_control(encode_control(message)) == message
    else:
        assert reason_of(text) == "schema"


def test_encode_control_refuses_what_the_peer_would_refuse() -> None:
    with pytest.raises(WireError) as info:
        encode_control(Refuse(ref="r", sip_code=200, reason="ok"))
    assert info.value.reason == "schema"
    with pytest.raises(WireError):
        encode_control(Hello(worker="w", sip_uri="sip:x", capacity=4, protocol=2))
    with pytest.raises(WireError):
        encode_control(LoadReport(active=True))
    # Within every character limit but over 8 KiB of UTF-8: 16 values of 256 four-byte chars.
    heavy = {f"X-{i}": "😀" * MAX_HEADER_VALUE_CHARS for i in range(MAX_HEADERS)}
    with pytest.raises(WireError) as info:
        encode_control(InviteRequest("r", "i@h", "sip:a", "sip:b", "1.2.3.4:5", "udp", heavy))
    assert info.value.reason == "too_large"


def test_largest_printable_ascii_messages_fit_the_frame_limit() -> None:
    uri = "sip:" + "u" * (MAX_URI_CHARS - 4)
    invite = InviteRequest(
        ref="r" * MAX_ID_CHARS,
        sip_call_id="c" * MAX_SIP_CALL_ID_CHARS,
        from_=uri,
        to=uri,
        source="s" * MAX_ID_CHARS,
        transport="udp",
        headers={
            f"{i:02d}" + "n" * (MAX_HEADER_NAME_CHARS - 2): "v" * MAX_HEADER_VALUE_CHARS
            for i in range(MAX_HEADERS)
        },
    )
    opaque = "o" * MAX_OPAQUE_CHARS
    tap = "wss://" + "t" * (MAX_URI_CHARS - 6)
    dial = Dial("call_" + "a" * 64, uri, uri, tap, opaque, opaque, MAX_RING_TIMEOUT_S)
    for message in (invite, dial):
        assert parse_control(encode_control(message)) == message
    start = WorkerMediaCodec().start(
        "call_" + "a" * 64, "c" * 256, CallDirection.OUTBOUND, uri, uri, tap, opaque, opaque
    )
    assert len(start.encode()) <= MAX_TEXT_FRAME_BYTES


def test_bound_headers_makes_any_header_set_forwardable() -> None:
    raw = {
        "Authorization": 'Digest username="alice", response="secret"',
        "proxy-authorization": "Digest x",
        "bad name": "dropped",
        "X-Long": "a" * 1000,
        "X-Ctl": "a\tb\x00c\r\nd",
        **{f"X-{i}": str(i) for i in range(40)},
    }
    bounded = bound_headers(raw)
    assert len(bounded) == MAX_HEADERS
    assert "Authorization" not in bounded and "proxy-authorization" not in bounded
    assert "bad name" not in bounded
    assert bounded["X-Long"] == "a" * MAX_HEADER_VALUE_CHARS
    assert bounded["X-Ctl"] == "a\tb c  d"
    assert list(bounded)[2:] == [f"X-{i}" for i in range(MAX_HEADERS - 2)]
    invite = InviteRequest("r", "i@h", "sip:a", "sip:b", "1.2.3.4:5", "udp", bounded)
    assert parse_control(encode_control(invite)) == invite


# ---- media channel ---------------------------------------------------------------

WORKER = WorkerMediaCodec()
START = WORKER.start(
    CALL_ID, "abc@h", CallDirection.INBOUND, "sip:a@x", "sip:b@y", TAP, SPEND, TOKEN
)
FRAME = bytes(range(256)) * 2 + bytes(128)  # 640 bytes = 20 ms at 16 kHz


def started() -> SipMediaCodec:
    codec = SipMediaCodec()
    codec.receive(START)
    return codec


def start_with(**overrides: Any) -> str:
    body = json.loads(START)
    body.update(overrides)
    return json.dumps({k: v for k, v in body.items() if v is not None})


def protocol_error(codec: SipMediaCodec, message: str | bytes) -> IngressProtocolError:
    with pytest.raises(IngressProtocolError) as info:
        codec.receive(message)
    assert TOKEN not in str(info.value)
    return info.value


def test_start_becomes_stream_started() -> None:
    codec = SipMediaCodec()
    assert not codec.started
    event = codec.receive(
        WORKER.start(
            CALL_ID, "abc@h", CallDirection.OUTBOUND, "+1555", "sip:b@y", TAP, SPEND, TOKEN
        )
    )
    assert event == StreamStarted(
        call=CallContext(
            provider="sip",
            call_id=CALL_ID,
            stream_id="abc@h",
            direction=CallDirection.OUTBOUND,
            from_="+1555",
            to="sip:b@y",
        ),
        media_format=SIP_L16_16K,
        custom_parameters={"tap_url": TAP, "spend": SPEND, "token": TOKEN, "sip_call_id": "abc@h"},
    )
    assert codec.started and not codec.stopped


def test_start_takes_the_direction_value_too() -> None:
    text = WORKER.start(CALL_ID, "i@h", "out", "sip:a", "sip:b", TAP, SPEND, TOKEN)
    assert text == WORKER.start(
        CALL_ID, "i@h", CallDirection.OUTBOUND, "sip:a", "sip:b", TAP, SPEND, TOKEN
    )
    assert json.loads(text)["direction"] == "out"


def test_audio_timestamps_come_from_the_sample_count() -> None:
    codec = started()
    assert codec.receive(FRAME) == AudioReceived(FRAME, 0)
    assert codec.receive(FRAME) == AudioReceived(FRAME, 20)
    assert codec.receive(b"\x01\x00" * 16) == AudioReceived(b"\x01\x00" * 16, 40)  # 1 ms
    assert codec.receive(b"") == AudioReceived(b"", 41)
    assert codec.receive(bytes(MAX_AUDIO_FRAME_BYTES)) == AudioReceived(
        bytes(MAX_AUDIO_FRAME_BYTES), 41
    )
    assert codec.receive(FRAME).timestamp_ms == 41 + MAX_AUDIO_FRAME_BYTES // 32  # type: ignore[union-attr]


def test_worker_events_round_trip() -> None:
    codec = started()
    for digit in sorted(DTMF_DIGITS):
        assert codec.receive(WORKER.dtmf(digit)) == DtmfReceived(digit)
    assert codec.receive(WORKER.mark_played("17")) == MarkPlayed("17")
    assert codec.receive(WORKER.control_result("transfer", True, 202, "accepted")) == (
        ControlResult("transfer", True, 202, "accepted")
    )
    assert codec.receive(WORKER.control_result("hangup", False, None, "no_leg")) == (
        ControlResult("hangup", False, None, "no_leg")
    )
    assert codec.receive(WORKER.stop("remote_bye")) == StreamStopped("remote_bye")
    assert codec.stopped


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (PlaceMark("42"), '{"event":"mark","name":"42"}'),
        (ClearPlayback(), '{"event":"clear"}'),
        (HangUpLeg(), '{"event":"hangup"}'),
        (
            TransferLeg("sip:desk@pbx.example.com"),
            '{"event":"transfer","to":"sip:desk@pbx.example.com"}',
        ),
    ],
)
def test_commands_round_trip(command: Any, expected: str) -> None:
    text = SipMediaCodec().encode(command)
    assert text == expected
    assert WorkerMediaCodec().receive(text) == command


def test_audio_commands_are_binary_frames() -> None:
    frame = SipMediaCodec().encode(PlayAudio(FRAME))
    assert frame == FRAME and isinstance(frame, bytes)
    assert WorkerMediaCodec().receive(frame) == PlayAudio(FRAME)


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        (PlayAudio(b"\x00" * 3), "odd_length"),
        (PlayAudio(bytes(MAX_AUDIO_FRAME_BYTES + 2)), "payload_too_large"),
        (PlaceMark(""), "schema"),
        (PlaceMark("a\nb"), "schema"),
        (TransferLeg("tel:+15551230000"), "schema"),
        (TransferLeg("sip:a b"), "schema"),
    ],
)
def test_encode_refuses_what_the_worker_would_refuse(command: Any, reason: str) -> None:
    with pytest.raises(WireError) as info:
        SipMediaCodec().encode(command)
    assert info.value.reason == reason


@pytest.mark.parametrize(
    ("message", "reason", "fatal"),
    [
        (FRAME, "media_before_start", False),
        ('{"event":"dtmf","digit":"1"}', "media_before_start", False),
        ('{"event":"mark","name":"1"}', "media_before_start", False),
        ("not json", "malformed_json", False),
        ("[]", "not_an_object", False),
        ('{"digit":"1"}', "missing_event", False),
        ('{"event":7}', "missing_event", False),
        ("x" * (MAX_TEXT_FRAME_BYTES + 1), "too_large", False),
        (start_with(encoding="pcmu"), "unsupported_media_format", True),
        (start_with(sample_rate=8000), "unsupported_media_format", True),
        (start_with(sample_rate="16000"), "unsupported_media_format", True),
        (start_with(sample_rate=16000.0), "unsupported_media_format", True),
        (start_with(call_id="CA123"), "bad_start", True),
        (start_with(direction="inbound"), "bad_start", True),
        (start_with(tap_url="http://x"), "bad_start", True),
        (start_with(token=None), "bad_start", True),
        (start_with(encoding=None), "bad_start", True),
        (start_with(extra="x"), "bad_start", True),
    ],
)
def test_errors_before_start(message: str | bytes, reason: str, fatal: bool) -> None:
    codec = SipMediaCodec()
    error = protocol_error(codec, message)
    assert (error.reason, error.fatal) == (reason, fatal)
    assert not codec.started


@pytest.mark.parametrize(
    ("message", "reason", "fatal"),
    [
        (START, "duplicate_start", True),
        (b"\x00" * 641, "odd_length", False),
        (bytes(MAX_AUDIO_FRAME_BYTES + 2), "payload_too_large", False),
        ('{"event":"dtmf","digit":"E"}', "bad_field", False),
        ('{"event":"dtmf","digit":"11"}', "bad_field", False),
        ('{"event":"dtmf"}', "bad_field", False),
        ('{"event":"mark","name":""}', "bad_field", False),
        ('{"event":"mark","name":"' + "m" * 129 + '"}', "bad_field", False),
        ('{"event":"stop","reason":"Remote BYE"}', "bad_field", False),
        (
            '{"event":"control_result","op":"mute","ok":true,"sip_code":200,"reason":"x"}',
            "bad_field",
            False,
        ),
        (
            '{"event":"control_result","op":"hangup","ok":1,"sip_code":200,"reason":"x"}',
            "bad_field",
            False,
        ),
        (
            '{"event":"control_result","op":"hangup","ok":true,"sip_code":99,"reason":"x"}',
            "bad_field",
            False,
        ),
    ],
)
def test_errors_after_start(message: str | bytes, reason: str, fatal: bool) -> None:
    codec = started()
    error = protocol_error(codec, message)
    assert (error.reason, error.fatal) == (reason, fatal)
    assert codec.receive(FRAME) == AudioReceived(FRAME, 0)  # the stream goes on; no audio counted


def test_stop_before_start_ends_the_stream() -> None:
    codec = SipMediaCodec()
    assert codec.receive(WORKER.stop("error")) == StreamStopped("error")
    assert protocol_error(codec, START).reason == "message_after_stop"


def test_everything_after_stop_is_dropped() -> None:
    codec = started()
    codec.receive(WORKER.stop("hangup"))
    for message in (FRAME, WORKER.dtmf("1"), START, '{"event":"future"}'):
        error = protocol_error(codec, message)
        assert (error.reason, error.fatal) == ("message_after_stop", False)


def test_unknown_events_are_forward_compatible() -> None:
    with pytest.raises(UnknownIngressEvent) as info:
        started().receive('{"event":"rtcp","jitter":3}')
    assert info.value.event_type == "rtcp"
    with pytest.raises(UnknownIngressEvent):
        SipMediaCodec().receive('{"event":"rtcp"}')
    with pytest.raises(UnknownIngressEvent) as info:
        WorkerMediaCodec().receive(json.dumps({"event": "mute\r\n" * 50}))
    assert "\n" not in info.value.event_type and len(info.value.event_type) < 200


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (b"\x00", "odd_length"),
        (bytes(MAX_AUDIO_FRAME_BYTES + 2), "payload_too_large"),
        ("{", "malformed_json"),
        ("[1]", "not_an_object"),
        ("{}", "missing_event"),
        ("x" * (MAX_TEXT_FRAME_BYTES + 1), "too_large"),
        ('{"event":"clear","now":true}', "schema"),
        ('{"event":"mark"}', "schema"),
        ('{"event":"transfer","to":"tel:+15551230000"}', "schema"),
    ],
)
def test_worker_receive_errors(message: str | bytes, reason: str) -> None:
    with pytest.raises(WireError) as info:
        WorkerMediaCodec().receive(message)
    assert info.value.reason == reason


@pytest.mark.parametrize(
    "render",
    [
        lambda w: w.dtmf("E"),
        lambda w: w.mark_played(""),
        lambda w: w.stop("Remote BYE"),
        lambda w: w.control_result("mute", True, 200, "ok"),
        lambda w: w.control_result("hangup", True, 200.0, "ok"),
        lambda w: w.start("CA1", "i@h", CallDirection.INBOUND, "a", "b", TAP, SPEND, TOKEN),
        lambda w: w.start(CALL_ID, "i h", CallDirection.INBOUND, "a", "b", TAP, SPEND, TOKEN),
        lambda w: w.start(CALL_ID, "i@h", CallDirection.INBOUND, "a", "b", TAP, SPEND, ""),
        lambda w: w.start(CALL_ID, "i@h", "inbound", "a", "b", TAP, SPEND, TOKEN),
    ],
)
def test_worker_refuses_to_render_what_the_gateway_would_refuse(render: Any) -> None:
    with pytest.raises(WireError) as info:
        render(WorkerMediaCodec())
    assert info.value.reason == "schema"
    assert TOKEN not in str(info.value)


# ---- fuzz --------------------------------------------------------------------------

_JSON_LEAF = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
_JSON = st.recursive(
    _JSON_LEAF,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_KEYS = sorted({key for schema in CONTROL_SCHEMAS.values() for key in schema["properties"]})


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300) | st.binary(max_size=300).map(lambda b: b.decode("latin-1")))
def test_fuzz_parse_control_raises_only_wire_errors(text: str) -> None:
    with contextlib.suppress(WireError):
        parse_control(text)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from([*sorted(CONTROL_SCHEMAS), "nope"]),
    st.dictionaries(st.sampled_from(_KEYS), _JSON, max_size=10),
)
def test_fuzz_control_objects_parse_to_valid_messages_or_wire_errors(
    kind: str, fields: dict[str, Any]
) -> None:
    try:
        message = parse_control(json.dumps({**fields, "type": kind}))
    except WireError:
        return
    assert parse_control(encode_control(message)) == message


_ID_TEXT = st.from_regex(r"\A[A-Za-z0-9_.:-]{1,64}\Z")
_PRINTABLE = st.text(
    st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=MAX_URI_CHARS
)


@settings(max_examples=150, deadline=None)
@given(
    ref=_ID_TEXT,
    from_=_PRINTABLE,
    to=_PRINTABLE,
    headers=st.dictionaries(
        st.from_regex(r"\A[A-Za-z0-9.!%*_+`'~-]{1,64}\Z"),
        st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=256),
        max_size=MAX_HEADERS,
    ),
)
def test_fuzz_valid_invites_round_trip(
    ref: str, from_: str, to: str, headers: dict[str, str]
) -> None:
    message = InviteRequest(ref, "id@host", from_, to, "127.0.0.1:5060", "udp", headers)
    try:
        text = encode_control(message)
    except WireError as exc:  # only a frame of many multi-byte characters may not fit
        assert exc.reason == "too_large"
        return
    assert parse_control(text) == message


_FRAME = (
    st.binary(max_size=400)
    | st.text(max_size=300)
    | st.sampled_from([START, WORKER.dtmf("5"), WORKER.stop("hangup"), '{"event":"start"}'])
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_FRAME, max_size=8), st.booleans())
def test_fuzz_sip_media_codec_raises_only_documented_errors(
    frames: list[str | bytes], start_first: bool
) -> None:
    codec = started() if start_first else SipMediaCodec()
    for frame in frames:
        with contextlib.suppress(IngressProtocolError, UnknownIngressEvent):
            codec.receive(frame)


@settings(max_examples=300, deadline=None)
@given(
    _FRAME
    | st.builds(
        lambda d: json.dumps({**d, "event": "transfer"}),
        st.dictionaries(st.sampled_from(["to", "name", "x"]), _JSON, max_size=3),
    )
)
def test_fuzz_worker_codec_raises_only_documented_errors(frame: str | bytes) -> None:
    try:
        command = WorkerMediaCodec().receive(frame)
    except (WireError, UnknownIngressEvent):
        return
    assert isinstance(command, PlayAudio | PlaceMark | ClearPlayback | HangUpLeg | TransferLeg)
