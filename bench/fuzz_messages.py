"""Seeded, structure-aware hostile messages for the media socket, the webhook and the tap.

Sans-I/O: every generator takes a :class:`random.Random` and returns the
frames or requests to send; ``bench/hostile_campaign.py`` sends them. The
same seed gives the same messages, so a failure found by the campaign is
replayed by its seed.

*Structure-aware* means each message starts as a valid one of its protocol
(a Twilio Media Streams event, a signed voice webhook, a tap v1 event) and
is then mutated a little (a field dropped, a value of the wrong type, a
value at or past a documented limit, control characters, an unknown event
name, a message out of order), so most of them get past the parser's first
check and reach the code behind it. A share is corrupted at the byte level
(truncated, invalid UTF-8, binary frames, deep nesting) for the parsers
themselves.
"""

from __future__ import annotations

import base64
import copy
import json
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from rutster.gateway.webhook_forms import MAX_WEBHOOK_BODY_BYTES
from rutster.protocols.tap import MAX_AUDIO_OUT_SAMPLES, MAX_ID_CHARS, MAX_MESSAGE_BYTES
from rutster.tools.twilio_simulator import signed_headers, start_message
from rutster.trunk.twilio.codec import MAX_MEDIA_PAYLOAD_BYTES, MAX_MESSAGE_CHARS

__all__ = [
    "Frame",
    "Mutator",
    "WebhookRequest",
    "raw_http_bytes",
    "tap_session",
    "twilio_session",
    "unauthenticated_stream_url",
    "webhook_request",
]

#: A WebSocket message: text (``str``) or binary (``bytes``).
Frame = str | bytes

#: Probability that a generated structured message is mutated at all (the rest
#: are valid, so a session also exercises the states a valid message reaches).
MUTATE_PROBABILITY = 0.6
#: Probability that a serialised message is then corrupted at the byte level.
CORRUPT_PROBABILITY = 0.12
#: Longest string value the mutator makes: past every per-field limit, below
#: the WebSocket frame limits so that the field checks (not the frame size
#: check) are what refuses it most of the time.
LONG_STRING_CHARS = 40_000
#: Nesting depth of the deep-nesting corruption: past Python's json recursion
#: limit (about 1,000), below the frame limit.
DEEP_NESTING = 20_000

#: ``media`` payload sizes besides Twilio's 160 bytes: empty, odd, at and past the limit.
_ODD_PAYLOAD_BYTES = (0, 1, 161, 4096, MAX_MEDIA_PAYLOAD_BYTES, MAX_MEDIA_PAYLOAD_BYTES + 1)

_CONTROL = "\x00\x01\x0b\x1b\r\n\u2028\u202e"


@dataclass
class Sequence:
    """A session's next sequence number, shared by the message makers of one session."""

    n: int


#: A message maker's weight and the maker (a fresh message each call).
Kind = tuple[float, Callable[[], dict[str, Any]]]


class Mutator:
    """Hostile variations of JSON values, objects and serialised frames."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def text(self) -> str:
        """A string a parser may not expect: empty, control characters, long, odd Unicode."""
        r = self.rng
        choice = r.randrange(9)
        if choice == 0:
            return ""
        if choice == 1:
            return "".join(r.choice(_CONTROL) for _ in range(r.randrange(1, 8)))
        if choice == 2:
            return "x" * r.choice((MAX_ID_CHARS, MAX_ID_CHARS + 1, 4096, LONG_STRING_CHARS))
        if choice == 3:
            return "é" * r.choice((100, MAX_ID_CHARS + 1, 5_000))
        if choice == 4:
            return "\ud800"  # a lone surrogate: valid JSON escape, not valid Unicode
        if choice == 5:
            return "line one\nFAKE LOG LINE level=error"
        if choice == 6:
            return "<Say>&amp;</Say>]]>"
        if choice == 7:
            return "%00%0d%0a../../etc/passwd"
        return "".join(chr(r.randrange(0x20, 0x3000)) for _ in range(r.randrange(1, 40)))

    def value(self, depth: int = 0) -> Any:
        """Any JSON value, often of a type the receiving field does not take."""
        r = self.rng
        choice = r.randrange(12)
        if choice == 0:
            return None
        if choice == 1:
            return r.choice((True, False))
        if choice == 2:
            return r.choice((0, -1, 1, 2**31, 2**63, -(2**63) - 1, 10**30))
        if choice == 3:
            return r.choice((0.5, -0.0, 1e308, 1e-320))
        if choice in (4, 5, 6):
            return self.text()
        if choice == 7 and depth < 3:
            return [self.value(depth + 1) for _ in range(r.randrange(0, 4))]
        if choice == 8 and depth < 3:
            return {self.text()[:20]: self.value(depth + 1) for _ in range(r.randrange(0, 4))}
        if choice == 9:
            return base64.b64encode(r.randbytes(r.choice((1, 3, 160, 4096)))).decode()
        if choice == 10:
            return "@@not base64@@"
        return str(r.randrange(-5, 10**6))

    def mutate(self, obj: dict[str, Any]) -> dict[str, Any]:
        """A copy of ``obj`` with one to three mutations, nested objects included."""
        out = copy.deepcopy(obj)
        for _ in range(self.rng.randrange(1, 4)):
            self._mutate_once(out)
        return out

    def _mutate_once(self, obj: dict[str, Any]) -> None:
        r = self.rng
        # Walk into a nested object now and then, so inner fields are hit too.
        target = obj
        for _ in range(3):
            nested = [v for v in target.values() if isinstance(v, dict)]
            if not nested or r.random() < 0.5:
                break
            target = r.choice(nested)
        keys = list(target)
        op = r.randrange(5)
        if op == 0 and keys:
            del target[r.choice(keys)]
        elif op in (1, 2) and keys:
            target[r.choice(keys)] = self.value()
        elif op == 3:
            target[self.text()[:30] or "extra"] = self.value()
        elif keys:
            # Swap two fields' values: each keeps a plausible type for some other field.
            a, b = r.choice(keys), r.choice(keys)
            target[a], target[b] = target[b], target[a]

    def draw(self, kinds: list[Kind], messages: int, seq: Sequence) -> list[Frame]:
        """``messages`` frames, each made by a kind drawn by weight, some mutated."""
        weights = [w for w, _ in kinds]
        makers = [k for _, k in kinds]
        frames: list[Frame] = []
        for _ in range(messages):
            (make,) = self.rng.choices(makers, weights)
            message = make()
            if self.rng.random() < MUTATE_PROBABILITY:
                message = self.mutate(message)
            frames.append(self.serialise(message))
            seq.n += 1
        return frames

    def serialise(self, obj: Any) -> Frame:
        """``obj`` as JSON text, sometimes corrupted at the byte level."""
        text = json.dumps(obj, separators=(",", ":"))
        if self.rng.random() >= CORRUPT_PROBABILITY:
            return text
        return self.corrupt(text)

    def corrupt(self, text: str) -> Frame:
        """Byte-level damage to one frame."""
        r = self.rng
        choice = r.randrange(8)
        if choice == 0:
            return text[: r.randrange(len(text) + 1)]
        if choice == 1:
            return text.encode() + b"\xff\xfe\x80"  # invalid UTF-8, sent as binary
        if choice == 2:
            raw = bytearray(text.encode())
            if raw:
                raw[r.randrange(len(raw))] = r.choice(b'\x00\xc3\xff{}[]",:')
            return bytes(raw)
        if choice == 3:
            return "[" * DEEP_NESTING + "]" * DEEP_NESTING
        if choice == 4:
            return text.replace("}", ',"x":NaN}', 1)
        if choice == 5:
            return text.replace("}", ',"x":1e400}', 1)
        if choice == 6:
            return text + text  # two objects in one frame
        return r.randbytes(r.randrange(1, 512))


# ---- Twilio Media Streams ---------------------------------------------------


def _media(stream_sid: str, seq: int, payload: bytes) -> dict[str, Any]:
    return {
        "event": "media",
        "sequenceNumber": str(seq),
        "streamSid": stream_sid,
        "media": {
            "track": "inbound",
            "chunk": str(seq),
            "timestamp": str(seq * 20),
            "payload": base64.b64encode(payload).decode(),
        },
    }


def twilio_session(
    rng: random.Random,
    *,
    stream_sid: str,
    call_sid: str,
    account_sid: str,
    parameters: Mapping[str, str],
    messages: int,
) -> list[Frame]:
    """One hostile Media Streams session: ``connected``, ``start``, then ``messages`` more.

    The ``start`` carries the real stream parameters (the token) most of the
    time, so the session is authenticated and reaches the call; some sessions
    mutate it, repeat it, or send media before it.
    """
    mut = Mutator(rng)
    frames: list[Frame] = [json.dumps({"event": "connected", "protocol": "Call", "version": "1"})]
    start: dict[str, Any] = json.loads(start_message(stream_sid, call_sid, account_sid, parameters))
    if rng.random() < 0.1:
        frames.append(mut.serialise(_media(stream_sid, 1, rng.randbytes(160))))
    frames.append(mut.serialise(mut.mutate(start) if rng.random() < 0.25 else start))
    seq = Sequence(2)
    kinds: list[Kind] = [
        (0.45, lambda: _media(stream_sid, seq.n, rng.randbytes(160))),
        (
            0.08,
            lambda: _media(
                stream_sid,
                seq.n,
                rng.randbytes(rng.choice(_ODD_PAYLOAD_BYTES)),
            ),
        ),
        (
            0.1,
            lambda: {
                "event": "mark",
                "sequenceNumber": str(seq.n),
                "streamSid": stream_sid,
                "mark": {"name": rng.choice(("m1", "0", str(rng.randrange(10**9)), mut.text()))},
            },
        ),
        (
            0.1,
            lambda: {
                "event": "dtmf",
                "sequenceNumber": str(seq.n),
                "streamSid": stream_sid,
                "dtmf": {"track": "inbound_track", "digit": rng.choice("0123456789*#ABCDx")},
            },
        ),
        (0.05, lambda: {"event": "stop", "sequenceNumber": str(seq.n), "streamSid": stream_sid}),
        (0.05, lambda: dict(start)),
        (0.07, lambda: {"event": mut.text()[:80], "sequenceNumber": str(seq.n)}),
        (0.1, lambda: {"event": rng.choice(("media", "mark", "dtmf", "stop", "start"))}),
    ]
    frames += mut.draw(kinds, messages, seq)
    if rng.random() < 0.05:
        frames.append("x" * (MAX_MESSAGE_CHARS + 1))
    return frames


def unauthenticated_stream_url(rng: random.Random, base_ws_url: str, token: str) -> str:
    """A media socket URL with the stream token missing, tampered with, or replaced."""
    mut = Mutator(rng)
    choice = rng.randrange(5)
    if choice == 0:
        return base_ws_url
    if choice == 1 and token:
        i = rng.randrange(len(token))
        flipped = "A" if token[i] != "A" else "B"
        return f"{base_ws_url}?token={token[:i]}{flipped}{token[i + 1 :]}"
    if choice == 2:
        return f"{base_ws_url}?{urlencode({'token': _utf8(mut.text()[:2000])})}"
    if choice == 3:
        return base_ws_url.replace("/twilio/stream", rng.choice(("/sip/stream", "/sip/workers")))
    return base_ws_url + "/" + "a" * rng.randrange(1, 3000)


# ---- the voice and status webhooks ------------------------------------------


def _utf8(text: str) -> str:
    return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


@dataclass(frozen=True)
class WebhookRequest:
    """One HTTP request for the webhook fuzzer to send."""

    method: str
    url: str
    headers: dict[str, str]
    body: bytes


def webhook_request(
    rng: random.Random,
    public_url: str,
    *,
    auth_token: str,
    account_sid: str,
    call_sid: str,
    from_: str,
    to: str,
) -> WebhookRequest:
    """A voice or status webhook: usually validly signed over hostile values.

    Signed requests reach the code behind the signature check (TwiML
    rendering, admission, status handling); the rest test the check.
    """
    mut = Mutator(rng)
    path = rng.choice(("/twilio/voice", "/twilio/voice", "/twilio/status"))
    url = public_url.rstrip("/") + path
    if rng.random() < 0.2:
        url += "?" + urlencode({rng.choice(("brain", "tenant", "x")): _utf8(mut.text()[:500])})
    params: dict[str, Any] = {
        "AccountSid": account_sid,
        "ApiVersion": "2010-04-01",
        "CallSid": call_sid,
        "CallStatus": rng.choice(("ringing", "in-progress", "completed", "busy", "failed")),
        "Direction": rng.choice(("inbound", "outbound-api")),
        "From": from_,
        "To": to,
    }
    if path.endswith("status"):
        params["CallDuration"] = str(rng.randrange(0, 100))
    if rng.random() < 0.8:
        params = mut.mutate(params)
    # Forms carry strings: stringify what the mutator made (lists, None, numbers).
    # A lone surrogate cannot be form-encoded: send the bytes it would have been.
    form = {
        _utf8(str(k)): _utf8(v if isinstance(v, str) else json.dumps(v)) for k, v in params.items()
    }
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    choice = rng.randrange(10)
    if choice < 7:
        headers.update(signed_headers(auth_token, url, form))
    elif choice == 7:
        headers["X-Twilio-Signature"] = base64.b64encode(rng.randbytes(20)).decode()
    body = urlencode(form).encode()
    method = "POST"
    shape = rng.randrange(12)
    if shape == 0:
        body = rng.randbytes(rng.randrange(0, 2048))
    elif shape == 1:
        headers["Content-Type"] = "application/json"
        body = json.dumps(form).encode()
    elif shape == 2:
        body = b"a=" + b"b" * (MAX_WEBHOOK_BODY_BYTES + rng.randrange(1, 10_000))
    elif shape == 3:
        method = rng.choice(("GET", "PUT", "DELETE"))
    elif shape == 4:
        body = body + b"&" + b"&".join(b"k%d=v" % i for i in range(rng.randrange(100, 3000)))
    elif shape == 5:
        headers["Content-Type"] = "multipart/form-data; boundary=" + "x" * rng.randrange(1, 200)
    return WebhookRequest(method=method, url=url, headers=headers, body=body)


# ---- raw TCP on the HTTP port -------------------------------------------------


def raw_http_bytes(rng: random.Random, host: str, path: str) -> bytes:
    """Bytes for a raw TCP connection: broken requests and broken WebSocket upgrades."""
    choice = rng.randrange(9)
    if choice == 0:
        return rng.randbytes(rng.randrange(1, 4096))
    if choice == 1:
        return b"GET " + path.encode() + b" HTTP/1.1\r\nHost: " + host.encode()  # never ends
    if choice == 2:
        return b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X-Long: " + b"a" * 100_000 + b"\r\n\r\n"
    if choice == 3:
        return (
            f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Version: 7\r\n\r\n"
        ).encode()
    if choice == 4:
        return (
            f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Key: not-base64!\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    if choice == 5:
        return b"POST /twilio/voice HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\nFrom=1"
    if choice == 6:
        return b"POST /twilio/voice HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
    if choice == 7:
        return b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + rng.randbytes(64)  # a TLS hello
    return b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X: y\r\n" * 2000 + b"\r\n"


# ---- the tap, from a hostile brain ---------------------------------------------


def _pcm_b64(rng: random.Random, samples: int) -> str:
    return base64.b64encode(rng.randbytes(samples * 2)).decode()


def tap_session(rng: random.Random, messages: int) -> list[Frame]:
    """What a hostile brain sends after the core's ``hello``: mostly mutated v1 events."""
    mut = Mutator(rng)
    seq = Sequence(0)

    def env(msg_type: str, **body: Any) -> dict[str, Any]:
        return {"v": 1, "type": msg_type, "seq": seq.n, "ts": seq.n * 20, **body}

    def audio() -> dict[str, Any]:
        samples = rng.choice((1, 2, 480, 480, 480, 4800, MAX_AUDIO_OUT_SAMPLES))
        item = rng.choice((None, "r1", "r2", str(rng.randrange(100))))
        return env("audio_out", pcm=_pcm_b64(rng, samples), samples=samples, item=item)

    def tool() -> dict[str, Any]:
        return {
            "name": rng.choice(("lookup", "transfer_call", "end_call", mut.text()[:64])),
            "description": "d",
            "parameters": rng.choice(
                (
                    {"type": "object", "properties": {"q": {"type": "string"}}},
                    {"type": "object", "properties": {"q": {"$ref": "#/x"}}},
                    {"type": "array"},
                    {"type": "object", "properties": {"q": {"pattern": "(a+)+$"}}},
                )
            ),
        }

    kinds: list[Kind] = [
        (0.45, audio),
        (0.07, lambda: env("audio_clear")),
        (
            0.08,
            lambda: env(
                "function_call",
                id=rng.choice(("c1", str(rng.randrange(10**6)), "é" * 300)),
                name=rng.choice(("lookup", "transfer_call", "end_call", "nope")),
                args=rng.choice(({}, {"q": "x"}, {"to": "+15550001111"}, {"reason": "x"})),
            ),
        ),
        (0.05, lambda: env("tools.update", tools=[tool() for _ in range(rng.randrange(0, 6))])),
        (
            0.08,
            lambda: env(
                "usage",
                model=rng.choice(("gpt-realtime", "unknown-model", None)),
                input_audio_tokens=rng.randrange(0, 5000),
                output_audio_tokens=rng.randrange(0, 5000),
            ),
        ),
        (0.05, lambda: env(rng.choice(("speech_started", "speech_stopped")))),
        (0.04, lambda: env("error", code=mut.text()[:40], message=mut.text())),
        (
            0.04,
            lambda: env(
                "hello",
                brain={"name": mut.text()[:100], "version": "1"},
                interruptible=rng.choice((True, False, "maybe")),
                turns=rng.choice(("core", "brain", "nobody")),
            ),
        ),
        (0.02, lambda: env("bye", reason=mut.text())),
        (0.07, lambda: env(mut.text()[:60])),
        (0.05, lambda: env(rng.choice(("audio_out", "function_call", "usage")))),
    ]
    frames: list[Frame] = []
    if rng.random() < 0.85:
        frames.append(
            json.dumps(
                env(
                    "hello",
                    brain={"name": "fuzz", "version": "1"},
                    interruptible=rng.choice((True, False)),
                    turns=rng.choice(("core", "brain")),
                )
            )
        )
        seq.n += 1
    frames += mut.draw(kinds, messages, seq)
    if rng.random() < 0.05:
        frames.append("y" * (MAX_MESSAGE_BYTES + 1))
    return frames
