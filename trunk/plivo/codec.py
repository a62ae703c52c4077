"""Sans-I/O codec for Plivo audio streams (``<Stream bidirectional="true">``).

Parses the JSON text frames Plivo sends (docs/PROVIDERS.md §4.3) into the
provider-neutral events of :mod:`protocols.ingress` and renders the core's
commands back into Plivo messages (§4.4). One codec per WebSocket, no I/O.

Plivo's dialect, absorbed here: camelCase fields; no ``connected`` frame, the
socket opens with ``start`` (``start.callId``, ``start.streamId``); numbers as
numbers or strings; playback markers are ``checkpoint`` out and ``playedStream``
back (with the checkpoint's ``name`` at the top level); ``clearAudio`` is answered
by ``clearedAudio`` (a :class:`PlivoCleared`, nothing for the core); the end of a
stream is the socket closing, or a ``stop`` frame, which some Plivo material
shows (§4.3). The stream's parameters (brain URL, call context, stream token)
come from the stream URL's query string, which the adapter passes in; Plivo's
``extra_headers`` (``k=v,k2=v2``), if present on ``start``, fill in under them.

Errors are :class:`~protocols.ingress.IngressProtocolError` with the reasons of
``trunk/json_stream.py`` plus ``unexpected_track``, ``media_before_start``,
``message_after_stop`` (the message is dropped), and the fatal ``bad_start``,
``unsupported_media_format`` and ``duplicate_start``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, assert_never

from rutster.media.formats import TWILIO_MULAW_8K, MediaFormat
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
    StreamStopped,
    UnknownIngressEvent,
)
from rutster.trunk.json_stream import (
    bad_start,
    label,
    number,
    object_field,
    parse_frame,
    payload,
    string_field,
)

__all__ = [
    "MAX_MEDIA_PAYLOAD_BYTES",
    "MAX_MESSAGE_CHARS",
    "PARAM_DIRECTION",
    "PARAM_FROM",
    "PARAM_TO",
    "PLIVO_MULAW_8K",
    "PROVIDER",
    "PlivoCleared",
    "PlivoStreamCodec",
    "sniff_plivo_stream",
]

#: ``CallContext.provider`` for Plivo calls, its registry name and price key.
PROVIDER = "plivo"
#: Largest decoded ``media`` payload and text frame accepted (Twilio's codec's bounds:
#: the project's limit on one media message, and its base64 plus an envelope).
MAX_MEDIA_PAYLOAD_BYTES = 64 * 1024
MAX_MESSAGE_CHARS = 96 * 1024
#: Stream parameters our answer puts on the stream URL (rutster's own convention).
PARAM_FROM = "from"
PARAM_TO = "to"
#: Who placed the call: Plivo's ``Direction`` (``inbound`` or ``outbound``).
PARAM_DIRECTION = "direction"
#: The stream format our ``<Stream>`` asks for (``contentType="audio/x-mulaw;rate=8000"``,
#: §4.2), both ways.
PLIVO_MULAW_8K: MediaFormat = TWILIO_MULAW_8K
_MULAW = "audio/x-mulaw"
#: Track of caller audio in ``media`` (§4.3); absent means inbound too.
_INBOUND_TRACK = "inbound"
_JSON_SEPARATORS = (",", ":")


@dataclass(frozen=True, slots=True)
class PlivoCleared:
    """Plivo's ``clearedAudio``: the ``clearAudio`` we sent has emptied its queue."""


class PlivoStreamCodec:
    """Parses one Plivo media socket's frames and renders commands for it.

    ``url_parameters``: the stream URL's query parameters (the adapter reads them
    off the socket): the stream's parameters.
    """

    def __init__(self, url_parameters: Mapping[str, str] | None = None) -> None:
        self._url_parameters = dict(url_parameters or {})
        self._started = False
        self._stopped = False
        self._stream_id: str | None = None
        self._prefix = ""

    @property
    def stream_id(self) -> str | None:
        """Plivo's ``streamId``, known after ``start``."""
        return self._stream_id

    def receive(self, text: str) -> IngressEvent | PlivoCleared:
        """Parse one text frame (raises as the module docstring says)."""
        message, event = parse_frame(text, MAX_MESSAGE_CHARS)
        if self._stopped:
            raise IngressProtocolError("message_after_stop", f"{label(event)!r} after stop")
        if event == "media":
            return self._media(message)
        if event == "playedStream":
            self._require_started(event)
            return MarkPlayed(name=string_field(message, "name", "playedStream"))
        if event == "dtmf":
            self._require_started(event)
            digit = string_field(object_field(message, "dtmf"), "digit", "dtmf")
            if digit not in DTMF_DIGITS:
                raise IngressProtocolError("bad_field", f"dtmf.digit {label(digit)!r} is no key")
            return DtmfReceived(digit=digit)
        if event == "clearedAudio":
            return PlivoCleared()
        if event == "start":
            return self._start(message)
        if event == "stop":
            self._stopped = True
            return StreamStopped(reason="stop")
        raise UnknownIngressEvent(label(event))

    def _media(self, message: dict[str, Any]) -> AudioReceived:
        if not self._started:
            raise IngressProtocolError("media_before_start", "media before start")
        media = object_field(message, "media")
        track = media.get("track", _INBOUND_TRACK)
        if track != _INBOUND_TRACK:
            raise IngressProtocolError("unexpected_track", f"media on track {label(track)!r}")
        audio = payload(media, MAX_MEDIA_PAYLOAD_BYTES)
        return AudioReceived(audio, number(media.get("timestamp"), "media.timestamp"))

    def _start(self, message: dict[str, Any]) -> StreamStarted:
        if self._started:
            raise IngressProtocolError("duplicate_start", "second start message", fatal=True)
        start = message.get("start")
        if not isinstance(start, dict):
            raise bad_start("'start' is missing or not an object")
        call_id, stream_id = start.get("callId"), start.get("streamId")
        if not isinstance(call_id, str) or not call_id:
            raise bad_start("start.callId is missing or not a string")
        if not isinstance(stream_id, str) or not stream_id:
            raise bad_start("start.streamId is missing or not a string")
        _check_media_format(start.get("mediaFormat"))
        parameters = _extra_headers(message.get("extra_headers", start.get("extra_headers")))
        parameters.update(self._url_parameters)
        direction = (
            CallDirection.OUTBOUND
            if parameters.get(PARAM_DIRECTION, "").startswith("outbound")
            else CallDirection.INBOUND
        )
        call = CallContext(
            provider=PROVIDER,
            call_id=call_id,
            stream_id=stream_id,
            direction=direction,
            from_=parameters.get(PARAM_FROM, ""),
            to=parameters.get(PARAM_TO, ""),
        )
        self._started = True
        self._stream_id = stream_id
        return StreamStarted(call=call, media_format=PLIVO_MULAW_8K, custom_parameters=parameters)

    def _require_started(self, event: str) -> None:
        if not self._started:
            raise IngressProtocolError("media_before_start", f"{event} before start")

    def encode(self, command: IngressCommand) -> str:
        """Render ``command`` as a Plivo text frame (docs/PROVIDERS.md §4.4).

        Raises ``RuntimeError`` before ``start``: there is no stream to address yet.
        """
        if self._stream_id is None:
            raise RuntimeError("encode() before the stream started")
        if isinstance(command, PlayAudio):
            # Base64 output has no characters JSON needs to escape.
            return (
                '{"event":"playAudio","media":{"contentType":"'
                + _MULAW
                + '","sampleRate":8000,"payload":"'
                + base64.b64encode(command.payload).decode("ascii")
                + '"}}'
            )
        if isinstance(command, PlaceMark):
            body: dict[str, object] = {
                "event": "checkpoint",
                "streamId": self._stream_id,
                "name": command.name,
            }
        elif isinstance(command, ClearPlayback):
            body = {"event": "clearAudio", "streamId": self._stream_id}
        else:
            assert_never(command)
        return json.dumps(body, separators=_JSON_SEPARATORS, ensure_ascii=False)


def sniff_plivo_stream(first_message: str | bytes) -> bool:
    """True when a media socket's first frame is Plivo's ``start`` (``start.callId`` and
    ``start.streamId``; Plivo sends no ``connected``, §4.3). Never raises."""
    if not isinstance(first_message, str) or len(first_message) > MAX_MESSAGE_CHARS:
        return False
    try:
        message = json.loads(first_message)
    except (ValueError, RecursionError):
        return False
    start = message.get("start") if isinstance(message, dict) else None
    return (
        isinstance(start, dict)
        and message.get("event") == "start"
        and isinstance(start.get("callId"), str)
        and isinstance(start.get("streamId"), str)
    )


def _extra_headers(value: object) -> dict[str, str]:
    """Plivo's ``extra_headers``, ``k=v,k2=v2`` (§4.2), as a dict; anything else: empty."""
    if not isinstance(value, str):
        return {}
    pairs = (item.partition("=") for item in value.split(",") if "=" in item)
    return {k.strip(): v.strip() for k, _, v in pairs if k.strip()}


def _check_media_format(media_format: object) -> None:
    if not isinstance(media_format, dict):
        raise bad_start("start.mediaFormat is missing or not an object")
    encoding = media_format.get("encoding")
    rate = media_format.get("sampleRate")
    channels = media_format.get("channels", 1)
    rate_value = (
        rate
        if type(rate) is int
        else (int(rate) if isinstance(rate, str) and rate.isdigit() and len(rate) < 7 else None)
    )
    if encoding != _MULAW or rate_value != PLIVO_MULAW_8K.sample_rate or channels not in (1, "1"):
        raise IngressProtocolError(
            "unsupported_media_format",
            f"media format {label(encoding)!r}/{label(rate)!r} is not {_MULAW}/8000, which "
            "the <Stream> asks for (contentType audio/x-mulaw;rate=8000)",
            fatal=True,
        )
