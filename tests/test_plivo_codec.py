"""The Plivo stream codec (trunk/plivo/codec.py) and signature V3 (trunk/plivo/signature.py)."""

from __future__ import annotations

import base64
import json
import random
from typing import Any

import pytest
from plivo.utils.signature_v3 import validate_v3_signature

from rutster.protocols.ingress import (
    AudioReceived,
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
from rutster.trunk.plivo.codec import PlivoCleared, PlivoStreamCodec, sniff_plivo_stream
from rutster.trunk.plivo.signature import PlivoSignatureV3, signed_string

CALL = "7f3a8a0e-5c1b-4f2e-9d7a-2b6c1e0f9a11"
STREAM = "b2c7d0e4-1a2b-4c3d-8e9f-0a1b2c3d4e5f"


def start(**overrides: Any) -> str:
    body: dict[str, Any] = {
        "callId": CALL,
        "streamId": STREAM,
        "accountId": "MA123",
        "tracks": ["inbound"],
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000},
    }
    body.update(overrides)
    return json.dumps({"event": "start", "sequenceNumber": 1, "start": body})


def media(chunk: int, data: bytes = b"\xff" * 160, **extra: Any) -> str:
    m: dict[str, Any] = {
        "track": "inbound",
        "chunk": chunk,
        "timestamp": "1712345678901",
        "payload": base64.b64encode(data).decode(),
    }
    m.update(extra)
    return json.dumps(
        {"event": "media", "sequenceNumber": chunk + 1, "streamId": STREAM, "media": m}
    )


def started() -> PlivoStreamCodec:
    codec = PlivoStreamCodec({"token": "t", "from": "+1555", "to": "+1666"})
    assert isinstance(codec.receive(start()), StreamStarted)
    return codec


def test_start_takes_the_url_parameters_over_extra_headers() -> None:
    codec = PlivoStreamCodec({"token": "from-url", "direction": "outbound"})
    frame = json.loads(start())
    frame["extra_headers"] = "token=from-headers,tenant=t1"
    event = codec.receive(json.dumps(frame))
    assert isinstance(event, StreamStarted)
    assert (event.call.provider, event.call.call_id, event.call.stream_id) == (
        "plivo",
        CALL,
        STREAM,
    )
    assert event.call.direction is CallDirection.OUTBOUND
    assert event.custom_parameters == {"token": "from-url", "direction": "outbound", "tenant": "t1"}


def test_numbers_may_come_as_strings() -> None:
    fmt = {"encoding": "audio/x-mulaw", "sampleRate": "8000"}
    assert isinstance(PlivoStreamCodec().receive(start(mediaFormat=fmt)), StreamStarted)
    codec = started()
    assert codec.receive(media(1, timestamp="5")) == AudioReceived(b"\xff" * 160, 5)


@pytest.mark.parametrize(
    "fmt",
    [
        {"encoding": "audio/x-l16", "sampleRate": 8000},
        {"encoding": "audio/x-mulaw", "sampleRate": 16000},
        {"encoding": "audio/x-mulaw", "sampleRate": "8k"},
        None,
    ],
)
def test_a_format_other_than_the_one_asked_for_is_fatal(fmt: object) -> None:
    with pytest.raises(IngressProtocolError) as err:
        PlivoStreamCodec().receive(start(mediaFormat=fmt))
    assert err.value.fatal


@pytest.mark.parametrize("overrides", [{"callId": ""}, {"streamId": 7}, {"callId": None}])
def test_a_start_without_its_ids_is_fatal(overrides: dict[str, Any]) -> None:
    with pytest.raises(IngressProtocolError) as err:
        PlivoStreamCodec().receive(start(**overrides))
    assert (err.value.reason, err.value.fatal) == ("bad_start", True)


def test_events() -> None:
    codec = started()
    assert isinstance(codec.receive(media(1)), AudioReceived)
    dtmf = {"event": "dtmf", "streamId": STREAM, "dtmf": {"track": "inbound", "digit": "5"}}
    assert codec.receive(json.dumps(dtmf)) == DtmfReceived("5")
    played = {"event": "playedStream", "streamId": STREAM, "name": "30"}
    assert codec.receive(json.dumps(played)) == MarkPlayed("30")
    assert (
        codec.receive(json.dumps({"event": "clearedAudio", "streamId": STREAM})) == PlivoCleared()
    )
    assert codec.receive(json.dumps({"event": "stop"})) == StreamStopped("stop")
    with pytest.raises(IngressProtocolError) as err:
        codec.receive(media(2))
    assert err.value.reason == "message_after_stop"


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        ("{", "malformed_json"),
        ("[]", "not_an_object"),
        (json.dumps({"event": "media", "media": {"payload": "%%"}}), "bad_base64"),
        (media(2, track="outbound"), "unexpected_track"),
        (json.dumps({"event": "playedStream"}), "bad_field"),
        (json.dumps({"event": "dtmf", "dtmf": {"digit": "55"}}), "bad_field"),
        (media(2, timestamp="-3"), "bad_field"),
    ],
)
def test_bad_frames_are_dropped_with_a_reason(frame: str, reason: str) -> None:
    codec = started()
    with pytest.raises(IngressProtocolError) as err:
        codec.receive(frame)
    assert (err.value.reason, err.value.fatal) == (reason, False)
    assert isinstance(codec.receive(media(3)), AudioReceived)


def test_before_start_and_unknown() -> None:
    with pytest.raises(IngressProtocolError):
        PlivoStreamCodec().receive(media(1))
    with pytest.raises(UnknownIngressEvent):
        started().receive(json.dumps({"event": "somethingNew"}))


def test_encode_speaks_plivo() -> None:
    codec = started()
    assert json.loads(codec.encode(PlayAudio(b"\x01\x02"))) == {
        "event": "playAudio",
        "media": {
            "contentType": "audio/x-mulaw",
            "sampleRate": 8000,
            "payload": base64.b64encode(b"\x01\x02").decode(),
        },
    }
    assert json.loads(codec.encode(PlaceMark("9"))) == {
        "event": "checkpoint",
        "streamId": STREAM,
        "name": "9",
    }
    assert json.loads(codec.encode(ClearPlayback())) == {"event": "clearAudio", "streamId": STREAM}
    with pytest.raises(RuntimeError):
        PlivoStreamCodec().encode(ClearPlayback())


@pytest.mark.parametrize(
    ("first", "plivo"),
    [
        (start(), True),
        (json.dumps({"event": "start", "start": {"callId": "c"}}), False),
        (json.dumps({"event": "start", "streamSid": "MZ", "start": {"callSid": "CA"}}), False),
        (json.dumps({"event": "connected", "version": "1.0.0"}), False),
        ("nope", False),
        (b"\x00", False),
    ],
)
def test_sniff(first: str | bytes, plivo: bool) -> None:
    assert sniff_plivo_stream(first) is plivo


# ---- signature V3 -------------------------------------------------------------------


def test_signed_strings_match_the_worked_examples() -> None:
    # docs/PROVIDERS.md §8, computed with plivo-python's own functions.
    url = "https://gw.example.com/answer"
    assert (
        signed_string("POST", url, {"CallUUID": "abc", "From": "+1555", "To": "+1666"})
        == "https://gw.example.com/answer?CallUUIDabcFrom+1555To+1666"
    )
    assert (
        signed_string("POST", url + "?z=1&a=2", {"CallUUID": "abc", "From": "+1555"})
        == "https://gw.example.com/answer?a=2&z=1.CallUUIDabcFrom+1555"
    )
    assert signed_string("GET", url + "?z=1", {"From": "+1555"}) == (
        "https://gw.example.com/answer?From=+1555&z=1"
    )
    signer = PlivoSignatureV3("token")
    signature = signer.compute("POST", url, {"CallUUID": "abc", "From": "+1555"}, "12345")
    assert signature == "L1wTiskGCIkwUvQ8GbynY42YpCSEcbEu9sv2bg6V9HY="


def test_the_plivo_sdk_accepts_what_we_sign_and_we_refuse_what_it_would() -> None:
    signer = PlivoSignatureV3("token")
    rng = random.Random(7)
    for _ in range(300):
        query = "&".join(
            f"{rng.choice('abz')}={rng.choice(['1', '2', 'x y', ''])}"
            for _ in range(rng.randrange(3))
        )
        url = "https://gw.example.com/plivo/answer" + (f"?{query}" if query else "")
        keys = ["CallUUID", "From", "To", "Direction", "A"]
        params = {rng.choice(keys): rng.choice(["1", "+1555", "a b", ""]) for _ in range(4)}
        method = rng.choice(["GET", "POST"])
        signature = signer.compute(method, url, params, "n1")
        assert validate_v3_signature(method, url, "n1", "token", signature, dict(params))
        assert signer.validate(method, url, params, "n1", f"other,{signature}")
        assert not signer.validate(method, url, {**params, "To": "+1999"}, "n1", signature)
        assert not signer.validate(method, url, params, "n2", signature)
    assert not signer.validate("POST", "https://gw/x", {}, None, "sig")
    assert not signer.validate("POST", "https://gw/x", {}, "n", None)
    with pytest.raises(ValueError):
        PlivoSignatureV3("")
