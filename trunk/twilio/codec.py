"""Sans-I/O codec for Twilio Media Streams (bidirectional ``<Connect><Stream>``).

Parses the JSON text frames Twilio sends (docs/PROVIDERS.md §1.3) into the
provider-neutral events of :mod:`protocols.ingress` and renders the core's commands
back into Twilio messages (§1.4). One codec per WebSocket; it holds the stream
state (``connected`` → ``start`` → ``media``/``dtmf``/``mark``… → ``stop``) and
does no I/O.

Errors are :class:`~protocols.ingress.IngressProtocolError` with a stable ``reason``:
``too_large``, ``malformed_json``, ``not_an_object``, ``missing_event``,
``bad_field``, ``bad_base64``, ``payload_too_large``, ``unexpected_track``,
``media_before_start``, ``message_after_stop`` (the message is dropped), and the
fatal ``bad_start``, ``unsupported_media_format``, ``duplicate_start`` (close the
socket: the call cannot be set up, or the peer is not behaving like Twilio).
Error messages never include audio payloads or raw frames.
"""

from __future__ import annotations

import base64
import json
from typing import Any, assert_never

from rutster.base.stream_token import PARAM_TOKEN
from rutster.media.formats import TWILIO_MULAW_8K
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
    StreamConnected,
    StreamStarted,
    StreamStopped,
    UnknownIngressEvent,
)
from rutster.trunk.json_stream import (
    MAX_LABEL_CHARS,
    bad_start,
    label,
    number,
    object_field,
    parse_frame,
    payload,
    string_field,
)

__all__ = [
    "MAX_EVENT_NAME_CHARS",
    "MAX_MEDIA_PAYLOAD_BYTES",
    "MAX_MESSAGE_CHARS",
    "PARAM_DIRECTION",
    "PARAM_FROM",
    "PARAM_TO",
    "PARAM_TOKEN",
    "PROVIDER",
    "TwilioStreamCodec",
    "sniff_twilio_stream",
]

#: Largest decoded ``media`` payload accepted: the limit set in the project issue.
MAX_MEDIA_PAYLOAD_BYTES = 64 * 1024
#: Largest text frame accepted: a 64 KiB payload in base64 is 87,384 chars; the rest
#: is headroom for the JSON envelope (ids, sequence numbers). Checked before parsing.
MAX_MESSAGE_CHARS = 96 * 1024
#: Longest event name passed on in ``UnknownIngressEvent``; it ends up in logs and metrics.
MAX_EVENT_NAME_CHARS = MAX_LABEL_CHARS

#: ``CallContext.provider`` for Twilio calls.
PROVIDER = "twilio"
#: ``<Parameter>`` names the voice webhook sets (rutster's own convention).
PARAM_FROM = "from"
PARAM_TO = "to"
#: Carries the webhook's ``Direction``: ``inbound``, ``outbound-api`` or ``outbound-dial``.
PARAM_DIRECTION = "direction"
_OUTBOUND_PREFIX = "outbound"

#: The only ``mediaFormat`` Twilio Media Streams send (docs/PROVIDERS.md §1.3).
_TWILIO_ENCODING = "audio/x-mulaw"
#: Track name of caller audio in ``media`` messages (§1.3); absent means inbound too.
_INBOUND_TRACK = "inbound"

#: Compact separators: smaller frames, and the hand-built media frame below uses the same style.
_JSON_SEPARATORS = (",", ":")


class TwilioStreamCodec:
    """Parses one Twilio media socket's frames and renders commands for it.

    Hot path, measured with timeit on the development machine (CPython 3.11,
    160-byte/20 ms frames): ``receive`` of a ``media`` frame ≈ 3.1 µs, half of it
    ``json.loads``; ``encode(PlayAudio)`` ≈ 0.3 µs.
    """

    def __init__(self, provider: str = PROVIDER) -> None:
        #: ``CallContext.provider`` of the calls it starts: Twilio's, or a provider that
        #: speaks Twilio's wire (the browser softphone, gateway/providers/phone.py).
        self._provider = provider
        self._started = False
        self._stopped = False
        self._stream_sid: str | None = None
        self._call_sid: str | None = None
        # Fixed head of every outbound media frame, so encode(PlayAudio) is one concatenation.
        self._media_prefix = ""

    @property
    def started(self) -> bool:
        """True once a valid ``start`` has been received."""
        return self._started

    @property
    def stopped(self) -> bool:
        """True once ``stop`` has been received; later messages are errors."""
        return self._stopped

    @property
    def stream_sid(self) -> str | None:
        """Twilio's ``streamSid`` (``MZ…``), known after ``start``."""
        return self._stream_sid

    @property
    def call_sid(self) -> str | None:
        """Twilio's ``callSid`` (``CA…``), known after ``start``."""
        return self._call_sid

    # ---- Twilio -> core ------------------------------------------------------

    def receive(self, text: str) -> IngressEvent:
        """Parse one text frame into an ingress event.

        Raises :class:`IngressProtocolError` for a frame that breaks the protocol
        and :class:`UnknownIngressEvent` for a well-formed frame of an unknown type.
        """
        message, event = parse_frame(text, MAX_MESSAGE_CHARS)
        if self._stopped:
            raise IngressProtocolError("message_after_stop", f"{label(event)!r} after stop")

        # Ordered by frequency: ~50 media frames a second, everything else is rare.
        if event == "media":
            return self._media(message)
        if event == "mark":
            self._require_started(event)
            return MarkPlayed(name=string_field(object_field(message, "mark"), "name", "mark"))
        if event == "dtmf":
            self._require_started(event)
            return self._dtmf(message)
        if event == "start":
            return self._start(message)
        if event == "stop":
            self._stopped = True
            return StreamStopped(reason="stop")
        if event == "connected":
            return StreamConnected(protocol=string_field(message, "protocol", "connected"))
        raise UnknownIngressEvent(label(event))

    def _media(self, message: dict[str, Any]) -> AudioReceived:
        if not self._started:
            raise IngressProtocolError("media_before_start", "media before start")
        media = object_field(message, "media")
        track = media.get("track", _INBOUND_TRACK)
        if track != _INBOUND_TRACK:
            # Only caller audio is expected on a <Connect> stream (inbound_track only, error 31941).
            raise IngressProtocolError("unexpected_track", f"media on track {label(track)!r}")
        audio = payload(media, MAX_MEDIA_PAYLOAD_BYTES)
        return AudioReceived(
            payload=audio, timestamp_ms=number(media.get("timestamp"), "media.timestamp")
        )

    def _dtmf(self, message: dict[str, Any]) -> DtmfReceived:
        digit = string_field(object_field(message, "dtmf"), "digit", "dtmf")
        if digit not in DTMF_DIGITS:
            raise IngressProtocolError("bad_field", f"dtmf.digit {label(digit)!r} is not a key")
        return DtmfReceived(digit=digit)

    def _start(self, message: dict[str, Any]) -> StreamStarted:
        if self._started:
            raise IngressProtocolError("duplicate_start", "second start message", fatal=True)
        start = message.get("start")
        if not isinstance(start, dict):
            raise bad_start("'start' is missing or not an object")
        call_sid = start.get("callSid")
        if not isinstance(call_sid, str) or not call_sid:
            raise bad_start("start.callSid is missing or not a string")
        stream_sid = start.get("streamSid", message.get("streamSid"))
        if not isinstance(stream_sid, str) or not stream_sid:
            raise bad_start("start.streamSid is missing or not a string")
        outer_sid = message.get("streamSid", stream_sid)
        if outer_sid != stream_sid:
            raise bad_start("streamSid differs from start.streamSid")
        _check_media_format(start.get("mediaFormat"))
        parameters = start.get("customParameters", {})
        if not isinstance(parameters, dict):
            raise bad_start("start.customParameters is not an object")
        if not all(isinstance(value, str) for value in parameters.values()):
            raise bad_start("start.customParameters has a non-string value")

        direction = (
            CallDirection.OUTBOUND
            if parameters.get(PARAM_DIRECTION, "").startswith(_OUTBOUND_PREFIX)
            else CallDirection.INBOUND
        )
        call = CallContext(
            provider=self._provider,
            call_id=call_sid,
            stream_id=stream_sid,
            direction=direction,
            from_=parameters.get(PARAM_FROM, ""),
            to=parameters.get(PARAM_TO, ""),
        )
        self._started = True
        self._call_sid = call_sid
        self._stream_sid = stream_sid
        self._media_prefix = (
            '{"event":"media","streamSid":' + json.dumps(stream_sid) + ',"media":{"payload":"'
        )
        return StreamStarted(
            call=call, media_format=TWILIO_MULAW_8K, custom_parameters=dict(parameters)
        )

    def _require_started(self, event: str) -> None:
        # dtmf and mark refer to a stream: without start there is no call to give them to.
        if not self._started:
            raise IngressProtocolError("media_before_start", f"{event} before start")

    # ---- core -> Twilio ------------------------------------------------------

    def encode(self, command: IngressCommand) -> str:
        """Render ``command`` as a Twilio text frame (docs/PROVIDERS.md §1.4).

        Raises ``RuntimeError`` before ``start``: there is no ``streamSid`` to
        address yet, so calling this is a bug in the caller. After ``stop`` it
        still encodes (the core may race the hang-up; the send simply fails).
        """
        if self._stream_sid is None:
            raise RuntimeError("encode() before the stream started")
        if isinstance(command, PlayAudio):
            # Base64 output has no characters JSON needs to escape.
            return self._media_prefix + base64.b64encode(command.payload).decode("ascii") + '"}}'
        if isinstance(command, PlaceMark):
            body: dict[str, object] = {
                "event": "mark",
                "streamSid": self._stream_sid,
                "mark": {"name": command.name},
            }
        elif isinstance(command, ClearPlayback):
            body = {"event": "clear", "streamSid": self._stream_sid}
        else:
            assert_never(command)
        return json.dumps(body, separators=_JSON_SEPARATORS, ensure_ascii=False)


def sniff_twilio_stream(first_message: str | bytes) -> bool:
    """True when a media socket's first frame is Twilio's: the ``connected`` message
    (``"protocol": "Call"``) or, if that was lost, a ``start`` with its ``streamSid``
    and ``start`` object (docs/PROVIDERS.md §1.3). Never raises."""
    if not isinstance(first_message, str) or len(first_message) > MAX_MESSAGE_CHARS:
        return False
    try:
        message = json.loads(first_message)
    except (ValueError, RecursionError):
        return False
    if not isinstance(message, dict):
        return False
    event = message.get("event")
    if event == "connected":
        return message.get("protocol") == "Call"
    return (
        event == "start"
        and isinstance(message.get("streamSid"), str)
        and isinstance(message.get("start"), dict)
    )


def _check_media_format(media_format: object) -> None:
    if not isinstance(media_format, dict):
        raise bad_start("start.mediaFormat is missing or not an object")
    encoding = media_format.get("encoding")
    rate = media_format.get("sampleRate")
    channels = media_format.get("channels")
    if (
        encoding != _TWILIO_ENCODING
        or type(rate) is not int
        or rate != TWILIO_MULAW_8K.sample_rate
        or type(channels) is not int
        or channels != TWILIO_MULAW_8K.channels
    ):
        raise IngressProtocolError(
            "unsupported_media_format",
            f"media format {label(encoding)!r}/{label(rate)!r}/{label(channels)!r} "
            f"is not {_TWILIO_ENCODING}/{TWILIO_MULAW_8K.sample_rate}/{TWILIO_MULAW_8K.channels}",
            fatal=True,
        )
