"""Sans-I/O codec for Telnyx media streaming (bidirectional, ``bidirectionalMode="rtp"``).

Parses the JSON text frames Telnyx sends (docs/PROVIDERS.md §2.3) into the
provider-neutral events of :mod:`protocols.ingress` and renders the core's commands
back into Telnyx messages (§2.4). One codec per WebSocket; it holds the stream
state (``connected`` → ``start`` → ``media``/``dtmf``/``mark``… → ``stop``) and does
no I/O.

Telnyx differs from Twilio in ways this codec absorbs:

- snake_case fields, the stream id at the top level (``stream_id``), the call's
  id in ``start.call_control_id`` (what its Call Control API acts on);
- **media frames may arrive out of order** (§2.3): they are put back in order by
  ``media.chunk`` within :data:`REORDER_WINDOW_FRAMES`; a frame that arrives ahead
  of a gap is held (:class:`FrameHeld`), the frames the gap held back go out
  together once it fills, and a gap that does not fill within the window is
  skipped (the lost audio is not waited for);
- where custom parameters arrive is not documented (§7 item 4): the codec takes
  ``start.custom_parameters`` (an object, or a list of ``{"name","value"}``) or
  ``start.customParameters``, under the parameters of the stream URL's query
  string, which the adapter passes in (our TeXML puts them in both places);
- ``error`` messages (§2.3: ``invalid_media``, ``rate_limit_reached``…) are Telnyx
  telling us what *we* sent was wrong: :class:`TelnyxStreamError`, for the adapter
  to count and log.

Errors are :class:`~protocols.ingress.IngressProtocolError` with a stable ``reason``:
``too_large``, ``malformed_json``, ``not_an_object``, ``missing_event``,
``bad_field``, ``bad_base64``, ``payload_too_large``, ``unexpected_track``,
``media_before_start``, ``message_after_stop``, ``late_frame`` (the message is
dropped), and the fatal ``bad_start``, ``unsupported_media_format``,
``duplicate_start``. Error messages never include audio payloads or raw frames.
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
    "MAX_MEDIA_PAYLOAD_BYTES",
    "MAX_MESSAGE_CHARS",
    "PARAM_DIRECTION",
    "PROVIDER",
    "REORDER_WINDOW_FRAMES",
    "TELNYX_PCMU_8K",
    "FrameHeld",
    "TelnyxStreamCodec",
    "TelnyxStreamError",
    "sniff_telnyx_stream",
]

#: ``CallContext.provider`` for Telnyx calls, its registry name and price key.
PROVIDER = "telnyx"
#: Largest decoded ``media`` payload accepted (the same bound as Twilio's codec: the
#: project's limit on one media message).
MAX_MEDIA_PAYLOAD_BYTES = 64 * 1024
#: Largest text frame accepted: a 64 KiB payload in base64 is 87,384 chars, plus the
#: envelope. Checked before parsing.
MAX_MESSAGE_CHARS = 96 * 1024
#: Media frames held while a gap in ``media.chunk`` waits to fill: 5 frames, 100 ms of
#: 20 ms frames. Seed decision: reordering on the path is a few frames deep; waiting
#: longer would delay every frame behind a lost one by as much.
REORDER_WINDOW_FRAMES = 5
#: Custom parameter saying who placed the call (our TeXML sets it from the webhook's
#: ``Direction``): ``inbound`` or ``outbound-api``.
PARAM_DIRECTION = "direction"
_OUTBOUND_PREFIX = "outbound"
#: The stream format our TeXML asks for, both ways: PCMU at 8 kHz (``codec`` and
#: ``bidirectionalCodec`` "PCMU", ``bidirectionalSamplingRate`` 8000; §2.1).
TELNYX_PCMU_8K: MediaFormat = TWILIO_MULAW_8K
#: Names ``start.media_format.encoding`` gives PCMU: the codec name in current docs, the
#: MIME type in older ones (§2.3: "accept both").
_PCMU_NAMES = frozenset({"PCMU", "audio/x-mulaw"})
#: Track of caller audio in ``media`` (§2.3); absent means inbound too.
_INBOUND_TRACK = "inbound"
_JSON_SEPARATORS = (",", ":")


@dataclass(frozen=True, slots=True)
class FrameHeld:
    """A media frame arrived ahead of a gap and is held until the gap fills (or is skipped)."""


@dataclass(frozen=True, slots=True)
class TelnyxStreamError:
    """Telnyx's ``error`` message: something we sent was refused (§2.3 error codes)."""

    code: str
    title: str


class TelnyxStreamCodec:
    """Parses one Telnyx media socket's frames and renders commands for it.

    ``url_parameters``: the stream URL's query parameters (the adapter reads them
    off the socket), taken as custom parameters that ``start`` may override.
    """

    def __init__(self, url_parameters: Mapping[str, str] | None = None) -> None:
        self._url_parameters = dict(url_parameters or {})
        self._started = False
        self._stopped = False
        self._stream_id: str | None = None
        self._call_control_id: str | None = None
        # Reordering: the next chunk number due, and frames held ahead of it.
        self._next_chunk: int | None = None
        self._held: dict[int, tuple[bytes, int | None]] = {}
        #: Frames given up on: gaps that did not fill within the window.
        self.frames_skipped = 0
        #: Frames that arrived out of order and were put back in order.
        self.frames_reordered = 0

    @property
    def started(self) -> bool:
        """True once a valid ``start`` has been received."""
        return self._started

    @property
    def stream_id(self) -> str | None:
        """Telnyx's ``stream_id``, known after ``start``."""
        return self._stream_id

    @property
    def call_control_id(self) -> str | None:
        """The call's ``call_control_id`` (what Call Control commands address)."""
        return self._call_control_id

    # ---- Telnyx -> core ------------------------------------------------------

    def receive(self, text: str) -> IngressEvent | FrameHeld | TelnyxStreamError:
        """Parse one text frame.

        Raises :class:`IngressProtocolError` for a frame that breaks the protocol
        and :class:`UnknownIngressEvent` for a well-formed frame of an unknown type.
        """
        message, event = parse_frame(text, MAX_MESSAGE_CHARS)
        if self._stopped:
            raise IngressProtocolError("message_after_stop", f"{label(event)!r} after stop")
        if event == "media":
            return self._media(message)
        if event == "mark":
            self._require_started(event)
            return MarkPlayed(name=string_field(object_field(message, "mark"), "name", "mark"))
        if event == "dtmf":
            self._require_started(event)
            digit = string_field(object_field(message, "dtmf"), "digit", "dtmf")
            if digit not in DTMF_DIGITS:
                raise IngressProtocolError("bad_field", f"dtmf.digit {label(digit)!r} is no key")
            return DtmfReceived(digit=digit)
        if event == "start":
            return self._start(message)
        if event == "stop":
            self._stopped = True
            return StreamStopped(reason="stop")
        if event == "connected":
            version = message.get("version", "")
            return StreamConnected(protocol=f"telnyx/{label(version)}")
        if event == "error":
            payload = message.get("payload")
            details = payload if isinstance(payload, dict) else {}
            return TelnyxStreamError(
                code=label(details.get("code", "")), title=label(details.get("title", ""))
            )
        raise UnknownIngressEvent(label(event))

    def _media(self, message: dict[str, Any]) -> AudioReceived | FrameHeld:
        if not self._started:
            raise IngressProtocolError("media_before_start", "media before start")
        media = object_field(message, "media")
        track = media.get("track", _INBOUND_TRACK)
        if track != _INBOUND_TRACK:
            raise IngressProtocolError("unexpected_track", f"media on track {label(track)!r}")
        audio = payload(media, MAX_MEDIA_PAYLOAD_BYTES)
        timestamp = number(media.get("timestamp"), "media.timestamp")
        chunk = number(media.get("chunk"), "media.chunk")
        if chunk is None:
            return AudioReceived(payload=audio, timestamp_ms=timestamp)  # nothing to order by
        return self._in_order(chunk, audio, timestamp)

    def _in_order(
        self, chunk: int, audio: bytes, timestamp: int | None
    ) -> AudioReceived | FrameHeld:
        due = self._next_chunk
        if due is None or chunk == due:
            self._next_chunk = chunk + 1
            return self._with_held(audio, timestamp)
        if chunk < due or chunk in self._held:
            raise IngressProtocolError("late_frame", f"media chunk {chunk} after {due - 1}")
        self._held[chunk] = (audio, timestamp)
        self.frames_reordered += 1
        if len(self._held) <= REORDER_WINDOW_FRAMES:
            return FrameHeld()
        # The gap did not fill in time: give up on it and go on from the oldest held frame.
        first = min(self._held)
        self.frames_skipped += first - due
        self._next_chunk = first + 1
        held_audio, held_timestamp = self._held.pop(first)
        return self._with_held(held_audio, held_timestamp)

    def _with_held(self, audio: bytes, timestamp: int | None) -> AudioReceived:
        """``audio``, then every held frame that now follows on without a gap."""
        held = self._held
        if not held:
            return AudioReceived(payload=audio, timestamp_ms=timestamp)
        parts = [audio]
        due = self._next_chunk
        assert due is not None
        while due in held:
            parts.append(held.pop(due)[0])
            due += 1
        self._next_chunk = due
        return AudioReceived(payload=b"".join(parts), timestamp_ms=timestamp)

    def _start(self, message: dict[str, Any]) -> StreamStarted:
        if self._started:
            raise IngressProtocolError("duplicate_start", "second start message", fatal=True)
        start = message.get("start")
        if not isinstance(start, dict):
            raise bad_start("'start' is missing or not an object")
        stream_id = message.get("stream_id")
        if not isinstance(stream_id, str) or not stream_id:
            raise bad_start("stream_id is missing or not a string")
        call_control_id = start.get("call_control_id")
        if not isinstance(call_control_id, str) or not call_control_id:
            raise bad_start("start.call_control_id is missing or not a string")
        _check_media_format(start.get("media_format"))
        parameters = dict(self._url_parameters)
        parameters.update(_custom_parameters(start))
        direction = (
            CallDirection.OUTBOUND
            if parameters.get(PARAM_DIRECTION, "").startswith(_OUTBOUND_PREFIX)
            else CallDirection.INBOUND
        )
        call = CallContext(
            provider=PROVIDER,
            call_id=call_control_id,
            stream_id=stream_id,
            direction=direction,
            from_=_optional_text(start.get("from")),
            to=_optional_text(start.get("to")),
        )
        self._started = True
        self._stream_id = stream_id
        self._call_control_id = call_control_id
        return StreamStarted(call=call, media_format=TELNYX_PCMU_8K, custom_parameters=parameters)

    def _require_started(self, event: str) -> None:
        if not self._started:
            raise IngressProtocolError("media_before_start", f"{event} before start")

    # ---- core -> Telnyx ------------------------------------------------------

    def encode(self, command: IngressCommand) -> str:
        """Render ``command`` as a Telnyx text frame (docs/PROVIDERS.md §2.4).

        No stream id is needed on outbound frames (one socket, one stream). Raises
        ``RuntimeError`` before ``start``: there is no call to play to yet.
        """
        if not self._started:
            raise RuntimeError("encode() before the stream started")
        if isinstance(command, PlayAudio):
            # Base64 output has no characters JSON needs to escape.
            return (
                '{"event":"media","media":{"payload":"'
                + base64.b64encode(command.payload).decode("ascii")
                + '"}}'
            )
        if isinstance(command, PlaceMark):
            body: dict[str, object] = {"event": "mark", "mark": {"name": command.name}}
        elif isinstance(command, ClearPlayback):
            body = {"event": "clear"}
        else:
            assert_never(command)
        return json.dumps(body, separators=_JSON_SEPARATORS, ensure_ascii=False)


def sniff_telnyx_stream(first_message: str | bytes) -> bool:
    """True when a media socket's first frame is Telnyx's (docs/PROVIDERS.md §0, §2.3):
    ``connected`` with a ``version`` and no ``protocol`` (Twilio's names its protocol),
    or a ``start`` with a top-level ``stream_id`` and ``start.call_control_id``. Never
    raises."""
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
        return "protocol" not in message and isinstance(message.get("version"), str)
    start = message.get("start")
    return (
        event == "start"
        and isinstance(message.get("stream_id"), str)
        and isinstance(start, dict)
        and isinstance(start.get("call_control_id"), str)
    )


def _custom_parameters(start: dict[str, Any]) -> dict[str, str]:
    """``start.custom_parameters`` (object or ``[{"name","value"}]``) or ``customParameters``."""
    raw = start.get("custom_parameters", start.get("customParameters", {}))
    if isinstance(raw, dict):
        pairs = list(raw.items())
    elif isinstance(raw, list):
        pairs = []
        for entry in raw:
            if not isinstance(entry, dict):
                raise bad_start("a custom parameter is not an object")
            pairs.append((entry.get("name"), entry.get("value")))
    else:
        raise bad_start("start.custom_parameters is neither an object nor a list")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in pairs):
        raise bad_start("a custom parameter's name or value is not a string")
    return dict(pairs)


def _check_media_format(media_format: object) -> None:
    if not isinstance(media_format, dict):
        raise bad_start("start.media_format is missing or not an object")
    encoding = media_format.get("encoding")
    rate = media_format.get("sample_rate")
    channels = media_format.get("channels", 1)
    if (
        encoding not in _PCMU_NAMES
        or type(rate) is not int
        or rate != TELNYX_PCMU_8K.sample_rate
        or type(channels) is not int
        or channels != TELNYX_PCMU_8K.channels
    ):
        raise IngressProtocolError(
            "unsupported_media_format",
            f"media format {label(encoding)!r}/{label(rate)!r}/{label(channels)!r} is not "
            f"PCMU/{TELNYX_PCMU_8K.sample_rate}/{TELNYX_PCMU_8K.channels}, which the "
            "<Stream> asks for (codec and bidirectionalCodec PCMU)",
            fatal=True,
        )


def _optional_text(value: object) -> str:
    return value[:MAX_LABEL_CHARS] if isinstance(value, str) else ""
