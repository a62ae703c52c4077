"""Sans-I/O codec for Vonage Voice API WebSockets (NCCO ``connect`` to a websocket).

Vonage's socket (docs/PROVIDERS.md §3.3) opens with one **text** frame,
``websocket:connected``, carrying the ``content-type`` and the NCCO's ``headers``
flattened to the top level; then the caller's audio comes in **binary** frames of
16-bit little-endian PCM, 20 ms each, with text events between them
(``websocket:dtmf``, ``websocket:cleared``, ``websocket:notify``). We send audio as
binary frames of exactly 20 ms, ``{"action":"clear"}`` and
``{"action":"notify","payload":{...}}``, which comes back as ``websocket:notify``
with the same payload once the audio queued before it has played: rutster's marks.

There is no ``start`` as such: ``websocket:connected`` is turned into the core's
``StreamStarted``, with the call's id from our ``headers`` (``call_uuid``) and the
stream's parameters from the socket URL's query, which our NCCO fills (Vonage's
``headers`` hold 512 bytes, §3.2, too few for a stream token and spend context).

Errors are :class:`~protocols.ingress.IngressProtocolError` with the reasons of
``trunk/json_stream.py`` plus ``media_before_start``, ``bad_audio`` (a binary
frame of odd length or over :data:`MAX_FRAME_BYTES`), and the fatal
``bad_start``, ``unsupported_media_format`` and ``duplicate_start``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, assert_never

from rutster.media.formats import Encoding, MediaFormat
from rutster.protocols.ingress import (
    DTMF_DIGITS,
    AudioReceived,
    CallContext,
    CallDirection,
    ClearPlayback,
    DtmfReceived,
    IngressCommand,
    IngressEvent,
    IngressProtocolError,
    MarkPlayed,
    PlaceMark,
    PlayAudio,
    StreamStarted,
    UnknownIngressEvent,
)
from rutster.trunk.json_stream import bad_start, label, object_field, parse_frame

__all__ = [
    "CONTENT_TYPE",
    "HEADER_CALL_UUID",
    "MAX_FRAME_BYTES",
    "PARAM_DIRECTION",
    "PROVIDER",
    "VONAGE_L16_16K",
    "VonageCleared",
    "VonageStreamCodec",
    "sniff_vonage_stream",
]

#: ``CallContext.provider`` for Vonage calls, its registry name and price key.
PROVIDER = "vonage"
#: The audio our NCCO asks for (§3.2): L16 at 16 kHz, which the core resamples to and
#: from 24 kHz (``media/transform.py``).
CONTENT_TYPE = "audio/l16;rate=16000"
VONAGE_L16_16K = MediaFormat(Encoding.L16, 16_000)
#: One 20 ms frame of that format: Vonage wants outbound audio in exactly these (§3.3).
FRAME_BYTES = VONAGE_L16_16K.sample_rate // 50 * 2
#: Largest binary frame accepted: Vonage sends 20 ms ones (640 B here); 16 KiB leaves
#: room for a provider that batches, and bounds what one frame can cost.
MAX_FRAME_BYTES = 16 * 1024
#: Largest text frame accepted: events are a few hundred bytes, ``connected`` carries
#: the NCCO's headers (512 B at most, §3.2).
MAX_MESSAGE_CHARS = 8 * 1024
#: Our NCCO header naming the call (Vonage's ``uuid`` of the answer webhook).
HEADER_CALL_UUID = "call_uuid"
#: Stream parameter saying who placed the call.
PARAM_DIRECTION = "direction"
_JSON_SEPARATORS = (",", ":")


@dataclass(frozen=True, slots=True)
class VonageCleared:
    """``websocket:cleared``: the ``clear`` we sent has emptied Vonage's queue."""


class VonageStreamCodec:
    """Parses one Vonage socket's frames (text and binary) and renders commands for it."""

    def __init__(self, url_parameters: Mapping[str, str] | None = None) -> None:
        self._url_parameters = dict(url_parameters or {})
        self._started = False

    def receive(self, frame: str | bytes) -> IngressEvent | VonageCleared:
        """Parse one frame: binary audio, or a text event (raises as the module says)."""
        if isinstance(frame, bytes):
            if not self._started:
                raise IngressProtocolError("media_before_start", "audio before connected")
            if len(frame) % 2 or len(frame) > MAX_FRAME_BYTES:
                raise IngressProtocolError(
                    "bad_audio", f"binary frame of {len(frame)} bytes is not 16-bit PCM we take"
                )
            return AudioReceived(payload=frame, timestamp_ms=None)
        message, event = parse_frame(frame, MAX_MESSAGE_CHARS)
        if event == "websocket:connected":
            return self._connected(message)
        if not self._started:
            raise IngressProtocolError("media_before_start", f"{label(event)!r} before connected")
        if event == "websocket:dtmf":
            digit = message.get("digit")
            if digit is None and isinstance(message.get("dtmf"), dict):
                digit = message["dtmf"].get("digit")  # the nested variant (§3.3)
            if not isinstance(digit, str) or digit not in DTMF_DIGITS:
                raise IngressProtocolError("bad_field", f"dtmf digit {label(digit)!r} is no key")
            return DtmfReceived(digit=digit)
        if event == "websocket:notify":
            name = object_field(message, "payload").get("name")
            if not isinstance(name, str):
                raise IngressProtocolError("bad_field", "websocket:notify payload has no name")
            return MarkPlayed(name=name)
        if event == "websocket:cleared":
            return VonageCleared()
        raise UnknownIngressEvent(label(event))

    def _connected(self, message: dict[str, Any]) -> StreamStarted:
        if self._started:
            raise IngressProtocolError("duplicate_start", "second websocket:connected", fatal=True)
        content_type = message.get("content-type")
        if content_type != CONTENT_TYPE:
            raise IngressProtocolError(
                "unsupported_media_format",
                f"content-type {label(content_type)!r} is not {CONTENT_TYPE}, which the NCCO "
                "asks for",
                fatal=True,
            )
        call_uuid = message.get(HEADER_CALL_UUID)
        if not isinstance(call_uuid, str) or not call_uuid:
            raise bad_start(f"websocket:connected has no {HEADER_CALL_UUID} header")
        parameters = {k: v for k, v in message.items() if isinstance(v, str)}
        parameters.update(self._url_parameters)
        direction = (
            CallDirection.OUTBOUND
            if parameters.get(PARAM_DIRECTION, "").startswith("outbound")
            else CallDirection.INBOUND
        )
        call = CallContext(
            provider=PROVIDER,
            call_id=call_uuid,
            stream_id=call_uuid,  # one socket, one leg: Vonage names no stream
            direction=direction,
            from_=parameters.get("from", ""),
            to=parameters.get("to", ""),
        )
        self._started = True
        return StreamStarted(call=call, media_format=VONAGE_L16_16K, custom_parameters=parameters)

    def encode(self, command: IngressCommand) -> str | bytes:
        """Audio as binary frames of exactly 20 ms (a short one padded with silence);
        marks as ``notify``, clears as ``clear`` (docs/PROVIDERS.md §3.3)."""
        if isinstance(command, PlayAudio):
            audio = command.payload
            if len(audio) % FRAME_BYTES:
                audio += bytes(FRAME_BYTES - len(audio) % FRAME_BYTES)
            return audio
        if isinstance(command, PlaceMark):
            body: dict[str, object] = {"action": "notify", "payload": {"name": command.name}}
        elif isinstance(command, ClearPlayback):
            body = {"action": "clear"}
        else:
            assert_never(command)
        return json.dumps(body, separators=_JSON_SEPARATORS)


def sniff_vonage_stream(first_message: str | bytes) -> bool:
    """True when a media socket's first frame is Vonage's ``websocket:connected``."""
    if not isinstance(first_message, str) or len(first_message) > MAX_MESSAGE_CHARS:
        return False
    try:
        message = json.loads(first_message)
    except (ValueError, RecursionError):
        return False
    return isinstance(message, dict) and message.get("event") == "websocket:connected"
