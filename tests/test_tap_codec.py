"""The tap protocol codec against its golden fixtures and its error contract."""

from __future__ import annotations

import base64
import json
import math
import struct
from dataclasses import fields as dataclass_fields
from typing import Any

import numpy as np
import pytest

from rutster.protocols.ingress import CallDirection
from rutster.protocols.tap import (
    AUDIO_IN_BYTES,
    AUDIO_IN_SAMPLES,
    BRAIN_DECLARATIONS,
    DEFAULT_INTERRUPTIBLE,
    DEFAULT_TURNS,
    MAX_AUDIO_OUT_SAMPLES,
    MAX_ID_CHARS,
    MAX_MESSAGE_BYTES,
    TAP_VERSION,
    AdvisorySpeechStarted,
    AdvisorySpeechStopped,
    AudioClear,
    AudioIn,
    AudioOut,
    AudioSpec,
    BrainError,
    BrainHello,
    Bye,
    CallInfo,
    Direction,
    Dtmf,
    FunctionCall,
    FunctionCallOutput,
    Hello,
    SessionEnd,
    SessionEndReason,
    SpeechStarted,
    SpeechStopped,
    TapDecoder,
    TapEncoder,
    TapErrorReason,
    TapEvent,
    TapProtocolError,
    ToolSpec,
    ToolStatus,
    ToolsUpdate,
    TurnOwner,
    UnknownTapEvent,
    Usage,
    event_direction,
    wire_type,
)
from tests.tap_fixtures import (
    InvalidCase,
    LenientCase,
    fixture_names,
    load_fixture,
    load_fixture_json,
    load_invalid_cases,
    load_lenient_cases,
)

C2B = Direction.CORE_TO_BRAIN
B2C = Direction.BRAIN_TO_CORE


def tone(freq_hz: float, samples: int, amplitude: float) -> bytes:
    """The s16le sine the fixtures carry (24 kHz), rebuilt independently."""
    t = np.arange(samples)
    wave = np.round(amplitude * np.sin(2 * np.pi * freq_hz * t / 24_000))
    return wave.astype("<i2").tobytes()


CALL = CallInfo(
    id="CA5d0f6c2b9e8a4f1e3c7b2a9d8e6f4c1a",
    direction="in",
    from_="+15551230001",
    to="+15559870002",
    provider="twilio",
)

EXPECTED: dict[tuple[Direction, str], TapEvent] = {
    (C2B, "hello"): Hello(session_id="sess_7f3a9c2e", resume=False, call=CALL),
    (C2B, "hello_resume"): Hello(session_id="sess_7f3a9c2e", resume=True, call=CALL),
    (C2B, "audio_in"): AudioIn(tone(440, 480, 8000)),
    (C2B, "speech_started"): SpeechStarted(),
    (C2B, "speech_started_interrupted"): SpeechStarted(
        interrupted=True, item="item_CbA7xQ2", played_ms=1840
    ),
    (C2B, "speech_stopped"): SpeechStopped(),
    (C2B, "dtmf"): Dtmf("#"),
    (C2B, "function_call_output"): FunctionCallOutput(
        id="call_8Hq2ZtL",
        status=ToolStatus.OK,
        result={"order_id": "A-1042", "status": "shipped", "eta_days": 2},
    ),
    (C2B, "function_call_output_not_implemented"): FunctionCallOutput(
        id="call_9Jr3", status=ToolStatus.NOT_IMPLEMENTED, result=None
    ),
    (C2B, "session_end"): SessionEnd(SessionEndReason.CALLER_HANGUP),
    (B2C, "hello"): BrainHello(name="echo", version="0.1.0", interruptible=False),
    (B2C, "hello_turns_brain"): BrainHello(
        name="duplex-s2s", version="2.3.1", interruptible=True, turns=TurnOwner.BRAIN
    ),
    (B2C, "tools_update"): ToolsUpdate(
        (
            ToolSpec(
                name="hangup",
                description="End the call politely.",
                parameters={"type": "object", "properties": {}},
            ),
            ToolSpec(
                name="lookup_order",
                description="Look up an order by its id.",
                parameters={
                    "type": "object",
                    "properties": {"order_id": {"type": "string", "description": "e.g. A-1042"}},
                    "required": ["order_id"],
                    "additionalProperties": False,
                },
            ),
        )
    ),
    (B2C, "audio_out"): AudioOut(tone(880, 120, 6000)),
    (B2C, "audio_out_with_item"): AudioOut(tone(880, 480, 6000), item="item_CbA7xQ2"),
    (B2C, "audio_clear"): AudioClear(),
    (B2C, "function_call"): FunctionCall(
        id="call_8Hq2ZtL", name="lookup_order", args={"order_id": "A-1042"}
    ),
    (B2C, "speech_started"): AdvisorySpeechStarted(),
    (B2C, "speech_stopped"): AdvisorySpeechStopped(),
    (B2C, "usage"): Usage(
        model="gpt-realtime",
        input_audio_tokens=412,
        output_audio_tokens=960,
        input_text_tokens=1180,
        output_text_tokens=85,
        cached_input_tokens=1024,
    ),
    (B2C, "usage_partial"): Usage(output_audio_tokens=120),
    (B2C, "error"): BrainError(
        code="brain_upstream_disconnect", message="upstream Realtime socket closed (1006)"
    ),
    (B2C, "bye"): Bye(reason="shutdown"),
}

FIXTURES = sorted(EXPECTED)
INVALID_CASES = load_invalid_cases()
LENIENT_CASES = load_lenient_cases()


def _id(key: tuple[Direction, str]) -> str:
    return f"{key[0].value}/{key[1]}"


def test_every_fixture_file_has_an_expected_event() -> None:
    on_disk = {(d, name) for d in Direction for name in fixture_names(d)}
    assert on_disk == set(EXPECTED)


def test_every_event_class_has_a_fixture() -> None:
    covered = {type(event) for event in EXPECTED.values()}
    assert covered == set(TapEvent.__args__)


@pytest.mark.parametrize("key", FIXTURES, ids=_id)
def test_fixture_decodes_to_expected_event(key: tuple[Direction, str]) -> None:
    direction, name = key
    event = TapDecoder(direction).decode(load_fixture(direction, name))
    assert event == EXPECTED[key]
    assert type(event) is type(EXPECTED[key])
    assert event_direction(event) is direction


@pytest.mark.parametrize("key", FIXTURES, ids=_id)
def test_expected_event_encodes_to_fixture(key: tuple[Direction, str]) -> None:
    direction, name = key
    fixture = load_fixture_json(direction, name)
    encoder = TapEncoder(start_ms=1_000.0)
    text = encoder.encode(EXPECTED[key], now_ms=1_000.0 + fixture["ts"] + 0.9)
    encoded = json.loads(text)
    assert encoded["seq"] == 0  # a fresh encoder; fixtures carry realistic seqs
    assert {**encoded, "seq": fixture["seq"]} == fixture
    assert wire_type(EXPECTED[key]) == fixture["type"]
    assert text.isascii()
    assert text == json.dumps(encoded, separators=(",", ":"))  # compact, one line


@pytest.mark.parametrize("case", INVALID_CASES, ids=[c.name for c in INVALID_CASES])
def test_invalid_case_is_refused_with_its_reason(case: InvalidCase) -> None:
    decoder = TapDecoder(case.direction)
    with pytest.raises(TapProtocolError) as info:
        decoder.decode(case.frame)
    assert info.value.reason == case.reason, str(info.value)
    assert isinstance(info.value, ValueError)
    message = str(info.value)
    assert len(message) < 200  # short, and so never a payload
    try:
        pcm = json.loads(case.frame).get("pcm")
    except (ValueError, AttributeError):
        pcm = None
    if isinstance(pcm, str) and len(pcm) > 8:
        assert pcm[:16] not in message


def test_invalid_manifest_is_well_formed() -> None:
    names = [case.name for case in INVALID_CASES]
    assert len(names) == len(set(names))
    assert {case.reason for case in INVALID_CASES} <= {r.value for r in TapErrorReason}
    # Every direction and most reasons are exercised.
    assert {case.direction for case in INVALID_CASES} == set(Direction)
    assert len({case.reason for case in INVALID_CASES}) >= 8


@pytest.mark.parametrize("case", LENIENT_CASES, ids=[c.name for c in LENIENT_CASES])
def test_lenient_case_decodes_to_its_fields(case: LenientCase) -> None:
    event = TapDecoder(case.direction).decode(case.frame)
    assert type(event).__name__ == case.event
    got = {f.name: getattr(event, f.name) for f in dataclass_fields(event)}
    assert json.loads(json.dumps(got)) == case.fields  # enums as values, tuples as arrays
    assert set(case.fields) == set(got)  # every attribute is pinned


def test_lenient_manifest_is_well_formed() -> None:
    names = [case.name for case in LENIENT_CASES]
    assert len(names) == len(set(names))
    assert not set(names) & {case.name for case in INVALID_CASES}
    # Both declarations are shown read as the default when their value is unknown.
    ignored = {field for case in LENIENT_CASES for field in case.fields.get("ignored", [])}
    assert ignored == set(BRAIN_DECLARATIONS)


# ---- brain declarations (hello.interruptible, hello.turns) ---------------------


def test_brain_declaration_defaults_are_todays_behaviour() -> None:
    assert DEFAULT_INTERRUPTIBLE is True
    assert DEFAULT_TURNS is TurnOwner.CORE
    assert {owner.value for owner in TurnOwner} == {"core", "brain"}
    assert BRAIN_DECLARATIONS == ("interruptible", "turns")
    hello = BrainHello("b", "1")
    assert (hello.interruptible, hello.turns, hello.ignored) == (True, TurnOwner.CORE, ())


@pytest.mark.parametrize("interruptible", [True, False])
@pytest.mark.parametrize("turns", list(TurnOwner))
def test_brain_declarations_round_trip(interruptible: bool, turns: TurnOwner) -> None:
    hello = BrainHello("b", "1", interruptible=interruptible, turns=turns)
    frame = json.loads(TapEncoder(0).encode(hello, 0))
    # Top-level, next to brain; always both, defaults included.
    assert frame["interruptible"] is interruptible and frame["turns"] == turns.value
    assert frame["brain"] == {"name": "b", "version": "1"}
    decoded = TapDecoder(B2C).decode(json.dumps(frame))
    assert decoded == hello
    assert isinstance(decoded, BrainHello) and type(decoded.turns) is TurnOwner


def test_encoder_accepts_a_plain_string_for_turns() -> None:
    frame = json.loads(TapEncoder(0).encode(BrainHello("b", "1", turns="brain"), 0))  # type: ignore[arg-type]
    assert frame["turns"] == "brain"


@pytest.mark.parametrize(
    "hello",
    [
        BrainHello("b", "1", turns="duplex"),  # type: ignore[arg-type]
        BrainHello("b", "1", turns=None),  # type: ignore[arg-type]
        BrainHello("b", "1", interruptible=0),  # type: ignore[arg-type]
        BrainHello("b", "1", interruptible="false"),  # type: ignore[arg-type]
    ],
    ids=["turns_unknown", "turns_none", "interruptible_int", "interruptible_str"],
)
def test_encoder_refuses_a_declaration_the_core_would_ignore(hello: BrainHello) -> None:
    encoder = TapEncoder(0)
    with pytest.raises(TapProtocolError) as info:
        encoder.encode(hello, 0)
    assert info.value.reason == "bad_field"
    assert encoder.next_seq == 0


def test_encoder_never_writes_ignored() -> None:
    hello = BrainHello("b", "1", ignored=("turns",))
    frame = json.loads(TapEncoder(0).encode(hello, 0))
    assert set(frame) == {"v", "type", "seq", "ts", "brain", "interruptible", "turns"}
    assert TapDecoder(B2C).decode(json.dumps(frame)) == BrainHello("b", "1")


def test_unknown_declaration_values_never_reject_the_hello() -> None:
    # Whatever the values, the hello decodes: the brain's identity is kept.
    values: list[Any] = ["", "Core", 0, 1.5, True, [], {}, None]
    for value in values:
        frame = _envelope("hello", brain={"name": "n", "version": "v"}, turns=value)
        event = TapDecoder(B2C).decode(frame)
        assert event == BrainHello("n", "v", ignored=("turns",)), value
    values = ["true", 1, 0.0, None, [], {}]
    for value in values:
        frame = _envelope("hello", brain={"name": "n", "version": "v"}, interruptible=value)
        event = TapDecoder(B2C).decode(frame)
        assert event == BrainHello("n", "v", ignored=("interruptible",)), value


# ---- limits and framing --------------------------------------------------------


def _envelope(msg_type: str, seq: int = 0, ts: float = 0, **fields: Any) -> str:
    return json.dumps({"v": TAP_VERSION, "type": msg_type, "seq": seq, "ts": ts, **fields})


def test_contract_constants() -> None:
    assert TAP_VERSION == 1
    assert AUDIO_IN_SAMPLES == 480
    assert AUDIO_IN_BYTES == 960
    assert MAX_AUDIO_OUT_SAMPLES == 24_000
    # The biggest legitimate frame fits with room to spare.
    biggest = TapEncoder(0).encode(AudioOut(bytes(2 * MAX_AUDIO_OUT_SAMPLES), item="i" * 200), 0)
    assert len(biggest) < MAX_MESSAGE_BYTES * 0.6


@pytest.mark.parametrize("as_bytes", [False, True])
def test_oversized_frame_is_too_large(as_bytes: bool) -> None:
    frame = _envelope("bye", reason="x" * MAX_MESSAGE_BYTES)
    data: str | bytes = frame.encode() if as_bytes else frame
    with pytest.raises(TapProtocolError) as info:
        TapDecoder(B2C).decode(data)
    assert info.value.reason == "too_large"


def test_size_limit_counts_utf8_bytes_not_characters() -> None:
    frame = _envelope("bye", reason="é" * (MAX_MESSAGE_BYTES // 2 + 10))
    frame = frame.replace("\\u00e9", "é")  # raw UTF-8 text, not \u escapes
    assert len(frame) < MAX_MESSAGE_BYTES < len(frame.encode())
    with pytest.raises(TapProtocolError) as info:
        TapDecoder(B2C).decode(frame)
    assert info.value.reason == "too_large"


def test_frame_at_the_limit_is_accepted() -> None:
    head = _envelope("bye", reason="")
    frame = head.replace(
        '"reason": ""', '"reason": "' + "x" * (MAX_MESSAGE_BYTES - len(head)) + '"'
    )
    assert len(frame) == MAX_MESSAGE_BYTES
    event = TapDecoder(B2C).decode(frame)
    assert isinstance(event, Bye)


def test_bytes_must_be_utf8() -> None:
    with pytest.raises(TapProtocolError) as info:
        TapDecoder(C2B).decode(b'{"v":1,"type":"dtmf","seq":0,"ts":0,"digit":"\xff"}')
    assert info.value.reason == "bad_utf8"


def test_bytes_decode_like_text() -> None:
    text = load_fixture(C2B, "audio_in")
    assert TapDecoder(C2B).decode(text.encode()) == TapDecoder(C2B).decode(text)


@pytest.mark.parametrize(
    "frame",
    [
        "[" * 100_000 + "]" * 100_000,  # deeper than the parser's recursion limit
        '{"v":1,"type":"bye","seq":0,"ts":' + "9" * 5_000 + ',"reason":"x"}',  # int digit limit
        "\ufeff" + _envelope("audio_clear"),  # a BOM is not JSON
    ],
    ids=["deep_nesting", "huge_integer", "bom"],
)
def test_parser_limits_are_malformed_json_not_crashes(frame: str) -> None:
    frame = frame[:MAX_MESSAGE_BYTES]
    with pytest.raises(TapProtocolError) as info:
        TapDecoder(B2C).decode(frame)
    assert info.value.reason == "malformed_json"


# ---- forward compatibility -----------------------------------------------------


def test_unknown_type_is_returned_not_raised() -> None:
    decoder = TapDecoder(C2B)
    event = decoder.decode(_envelope("telepathy", seq=0, payload={"x": 1}))
    assert event == UnknownTapEvent("telepathy")
    assert decoder.last_seq == 0  # still counted in the sequence


@pytest.mark.parametrize(
    ("direction", "msg_type"),
    [(C2B, "tools.update"), (C2B, "audio_out"), (C2B, "usage"), (B2C, "dtmf"), (B2C, "audio_in")],
)
def test_type_of_the_other_direction_is_unknown(direction: Direction, msg_type: str) -> None:
    assert TapDecoder(direction).decode(_envelope(msg_type)) == UnknownTapEvent(msg_type)


def test_unknown_fields_are_ignored_at_every_level() -> None:
    hello = load_fixture_json(C2B, "hello")
    hello["future"] = {"nested": [1, 2]}
    hello["call"]["sip_headers"] = {"X-Foo": "bar"}
    hello["audio"]["codec_hint"] = "opus"
    assert TapDecoder(C2B).decode(json.dumps(hello)) == EXPECTED[(C2B, "hello")]

    tools = load_fixture_json(B2C, "tools_update")
    tools["tools"][0]["strict"] = True
    tools["etag"] = "abc"
    assert TapDecoder(B2C).decode(json.dumps(tools)) == EXPECTED[(B2C, "tools_update")]

    audio = load_fixture_json(B2C, "audio_out_with_item")
    audio["content_index"] = 0
    assert TapDecoder(B2C).decode(json.dumps(audio)) == EXPECTED[(B2C, "audio_out_with_item")]


def test_nullable_fields_may_be_absent() -> None:
    assert TapDecoder(C2B).decode(_envelope("speech_started", interrupted=False)) == (
        SpeechStarted()
    )
    frame = _envelope("function_call_output", id="c1", status="error")
    assert TapDecoder(C2B).decode(frame) == FunctionCallOutput("c1", ToolStatus.ERROR, None)
    assert TapDecoder(B2C).decode(_envelope("usage")) == Usage()


def test_whitespace_and_key_order_do_not_matter() -> None:
    frame = '\n { "ts" : 5 , "seq" : 0 , "type" : "dtmf" , "digit" : "7" , "v" : 1 } \n'
    assert TapDecoder(C2B).decode(frame) == Dtmf("7")


def test_ts_may_be_fractional() -> None:
    decoder = TapDecoder(C2B)
    decoder.decode(_envelope("speech_stopped", ts=12.75))
    assert decoder.last_ts == 12.75


# ---- seq and ts ----------------------------------------------------------------


def _seq_state(decoder: TapDecoder) -> tuple[int | None, float | None, int]:
    return decoder.last_seq, decoder.last_ts, decoder.seq_gaps


def test_decoder_tracks_seq_and_counts_gaps_without_enforcing_order() -> None:
    decoder = TapDecoder(C2B)
    assert _seq_state(decoder) == (None, None, 0)
    for seq in (0, 1, 2):
        decoder.decode(_envelope("speech_stopped", seq=seq, ts=seq * 20))
    assert _seq_state(decoder) == (2, 40, 0)
    decoder.decode(_envelope("speech_stopped", seq=5, ts=100))  # 3 and 4 lost
    assert _seq_state(decoder) == (5, 100, 1)
    decoder.decode(_envelope("speech_stopped", seq=4, ts=80))  # late: accepted, counted
    assert _seq_state(decoder) == (4, 80, 2)
    decoder.decode(_envelope("speech_stopped", seq=5, ts=100))
    assert _seq_state(decoder) == (5, 100, 2)


def test_first_seq_other_than_zero_is_a_gap() -> None:
    decoder = TapDecoder(B2C)
    decoder.decode(_envelope("audio_clear", seq=7))
    assert (decoder.last_seq, decoder.seq_gaps) == (7, 1)


def test_seq_is_tracked_for_bad_fields_but_not_bad_envelopes() -> None:
    decoder = TapDecoder(C2B)
    with pytest.raises(TapProtocolError):
        decoder.decode(_envelope("dtmf", seq=0, digit="Z"))  # envelope fine, field bad
    assert decoder.last_seq == 0
    with pytest.raises(TapProtocolError):
        decoder.decode(_envelope("dtmf", seq=-1, digit="1"))
    assert decoder.last_seq == 0 and decoder.seq_gaps == 0


def test_encoder_seq_counts_from_zero_and_ts_is_ms_since_start() -> None:
    encoder = TapEncoder(start_ms=5_000.0)
    assert encoder.next_seq == 0
    frames = [
        json.loads(encoder.encode(AudioIn(bytes(AUDIO_IN_BYTES)), now_ms=5_000.0)),
        json.loads(encoder.encode(SpeechStopped(), now_ms=5_020.9)),
        json.loads(encoder.encode(AudioOut(b"\x01\x00"), now_ms=5_041.0)),
    ]
    assert [(f["v"], f["seq"], f["ts"]) for f in frames] == [(1, 0, 0), (1, 1, 20), (1, 2, 41)]
    assert all(type(f["ts"]) is int for f in frames)
    assert encoder.next_seq == 3
    # Two encoders are independent (one per connection).
    assert json.loads(TapEncoder(0).encode(SpeechStopped(), 0))["seq"] == 0


def test_failed_encode_does_not_consume_a_seq() -> None:
    encoder = TapEncoder(0)
    with pytest.raises(TapProtocolError):
        encoder.encode(AudioIn(b"\x00" * 10), 0)
    with pytest.raises(TapProtocolError):
        encoder.encode(Dtmf("x"), 0)
    assert encoder.next_seq == 0
    assert json.loads(encoder.encode(Dtmf("1"), 0))["seq"] == 0


# ---- PCM byte order -------------------------------------------------------------


def test_pcm_goes_on_the_wire_little_endian_and_unswapped() -> None:
    samples = [0x1234, -2, 32767, -32768] + [0] * (AUDIO_IN_SAMPLES - 4)
    pcm = struct.pack(f"<{AUDIO_IN_SAMPLES}h", *samples)
    assert pcm[:4] == b"\x34\x12\xfe\xff"
    frame = json.loads(TapEncoder(0).encode(AudioIn(pcm), 0))
    assert frame["samples"] == AUDIO_IN_SAMPLES
    wire = base64.b64decode(frame["pcm"], validate=True)
    assert wire == pcm
    assert struct.unpack_from("<4h", wire) == (0x1234, -2, 32767, -32768)
    assert TapDecoder(C2B).decode(json.dumps(frame)) == AudioIn(pcm)


def test_audio_in_fixture_is_a_440_hz_tone_in_s16le() -> None:
    pcm = base64.b64decode(load_fixture_json(C2B, "audio_in")["pcm"], validate=True)
    values = np.frombuffer(pcm, dtype="<i2")
    assert len(values) == AUDIO_IN_SAMPLES
    # Sample 14 is near the first crest: 8000 * sin(2π·440·14/24000) ≈ 7993.
    expected = round(8000 * math.sin(2 * math.pi * 440 * 14 / 24_000))
    assert expected == 7993
    assert pcm[28:30] == struct.pack("<h", expected) == b"\x39\x1f"
    assert values.max() <= 8000 and values.min() >= -8000


def test_audio_out_accepts_every_length_in_range() -> None:
    decoder = TapDecoder(B2C)
    encoder = TapEncoder(0)
    for samples in (1, 2, 3, 479, 481, MAX_AUDIO_OUT_SAMPLES):
        pcm = bytes(range(256)) * (samples * 2 // 256) + bytes(samples * 2 % 256)
        event = decoder.decode(encoder.encode(AudioOut(pcm, item="r1"), 0))
        assert event == AudioOut(pcm, item="r1")


# ---- encoder refuses what the peer would refuse ---------------------------------


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        (AudioIn(bytes(AUDIO_IN_BYTES - 2)), "bad_audio_length"),
        (AudioIn(bytes(AUDIO_IN_BYTES + 2)), "bad_audio_length"),
        (AudioOut(b""), "bad_audio_length"),
        (AudioOut(b"\x00\x00\x00"), "bad_audio_length"),
        (AudioOut(bytes(2 * MAX_AUDIO_OUT_SAMPLES + 2)), "bad_audio_length"),
        (AudioOut(b"\x00\x00", item=""), "bad_field"),
        (AudioOut(b"\x00\x00", item="x" * (MAX_ID_CHARS + 1)), "bad_field"),
        (Dtmf("x"), "bad_field"),
        (SpeechStarted(interrupted=True, item="i", played_ms=-1), "bad_field"),
        (Hello("", False, CALL), "bad_field"),
        (Hello("s", False, CALL, AudioSpec(sample_rate=16_000)), "unsupported_audio"),
        (Hello("s", False, CallInfo("c", "sideways", "a", "b", "twilio")), "bad_field"),
        (FunctionCallOutput("c1", ToolStatus.OK, {"x": math.nan}), "bad_field"),
        (FunctionCallOutput("c1", ToolStatus.OK, {"raw": b"bytes"}), "bad_field"),
        (FunctionCallOutput("c1", ToolStatus.OK, "x" * MAX_MESSAGE_BYTES), "too_large"),
        (FunctionCallOutput("", ToolStatus.OK, None), "bad_field"),
        (
            ToolsUpdate((ToolSpec("a b", "", {"type": "object"}),)),
            "bad_field",
        ),
        (FunctionCall("c1", "hangup", []), "bad_field"),  # type: ignore[arg-type]
        (Usage(input_audio_tokens=-1), "bad_field"),
        (BrainError("", "m"), "bad_field"),
    ],
    ids=lambda value: type(value).__name__ if not isinstance(value, str) else value,
)
def test_encoder_refuses_what_the_peer_would_refuse(event: TapEvent, reason: str) -> None:
    with pytest.raises(TapProtocolError) as info:
        TapEncoder(0).encode(event, 0)
    assert info.value.reason == reason


def test_encoding_a_non_event_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        TapEncoder(0).encode(UnknownTapEvent("x"), 0)  # type: ignore[arg-type]


def test_str_enums_go_on_the_wire_as_their_values() -> None:
    call = CallInfo("c", CallDirection.OUTBOUND, "a", "b", "twilio")
    frame = json.loads(TapEncoder(0).encode(Hello("s", True, call), 0))
    assert frame["call"]["direction"] == "out"
    decoded = TapDecoder(C2B).decode(json.dumps(frame))
    assert isinstance(decoded, Hello) and decoded.call.direction == "out"
    end = json.loads(TapEncoder(0).encode(SessionEnd(SessionEndReason.BUDGET_EXHAUSTED), 0))
    assert end["reason"] == "budget_exhausted"


def test_output_is_ascii_and_non_ascii_text_round_trips() -> None:
    text = TapEncoder(0).encode(BrainError("brain_auth_failed", "clé refusée \u2603 \ud83d"), 0)
    assert text.isascii()
    assert TapDecoder(B2C).decode(text) == BrainError(
        "brain_auth_failed", "clé refusée \u2603 \ud83d"
    )


def test_usage_omits_absent_fields_and_speech_started_sends_nulls() -> None:
    usage = json.loads(TapEncoder(0).encode(Usage(model="m"), 0))
    assert set(usage) == {"v", "type", "seq", "ts", "model"}
    started = json.loads(TapEncoder(0).encode(SpeechStarted(), 0))
    assert started["interrupted"] is False
    assert "item" in started and started["item"] is None
    assert "played_ms" in started and started["played_ms"] is None


def test_function_call_name_is_not_policed_by_the_codec() -> None:
    # The core must see an unknown name to answer not_implemented for its id.
    frame = _envelope("function_call", id="c9", name="no such tool!", args={})
    assert TapDecoder(B2C).decode(frame) == FunctionCall("c9", "no such tool!", {})


def test_error_reason_labels_are_stable() -> None:
    assert {r.value for r in TapErrorReason} == {
        "too_large",
        "bad_utf8",
        "malformed_json",
        "not_an_object",
        "bad_envelope",
        "bad_version",
        "bad_field",
        "bad_base64",
        "bad_audio_length",
        "unsupported_audio",
    }


# ---- ids (issue 14, finding 9) --------------------------------------------------------


def _raw(msg_type: str, **fields: Any) -> str:
    """An envelope as raw UTF-8 text (a peer need not \\u-escape)."""
    return json.dumps(
        {"v": TAP_VERSION, "type": msg_type, "seq": 0, "ts": 0, **fields}, ensure_ascii=False
    )


@pytest.mark.parametrize(
    ("direction", "msg_type", "fields", "key"),
    [
        (B2C, "function_call", {"name": "hangup", "args": {}}, "id"),
        (B2C, "audio_out", {"samples": 480, "pcm": base64.b64encode(bytes(960)).decode()}, "item"),
        (C2B, "function_call_output", {"status": "ok", "result": None}, "id"),
        (C2B, "speech_started", {"interrupted": True, "played_ms": 0}, "item"),
    ],
)
def test_ids_are_bounded_where_they_arrive(
    direction: Direction, msg_type: str, fields: dict[str, Any], key: str
) -> None:
    ok = TapDecoder(direction).decode(_raw(msg_type, **fields, **{key: "é" * MAX_ID_CHARS}))
    assert getattr(ok, key) == "é" * MAX_ID_CHARS
    # 30,000 "é" fit a frame as UTF-8 (60 KB) but not once \u-escaped in the reply.
    with pytest.raises(TapProtocolError) as info:
        TapDecoder(direction).decode(_raw(msg_type, **fields, **{key: "é" * 30_000}))
    assert info.value.reason == "bad_field"
    with pytest.raises(TapProtocolError):
        TapDecoder(direction).decode(_raw(msg_type, **fields, **{key: "x" * (MAX_ID_CHARS + 1)}))


def test_the_reply_to_the_longest_id_fits_a_frame() -> None:
    worst = "\u0001" * MAX_ID_CHARS  # the widest JSON escape: 6 bytes a character
    reply = TapEncoder(0).encode(FunctionCallOutput(worst, ToolStatus.OK, {"a": "b"}), 0)
    started = TapEncoder(0).encode(SpeechStarted(True, worst, 10), 0)
    assert max(len(reply), len(started)) < MAX_MESSAGE_BYTES // 50
