"""The provider-neutral ingress contract between call adapters and the core.

A trunk codec (Twilio today; Telnyx, Vonage, Plivo and the SIP worker later)
parses its provider's media-stream messages into these events and renders
these commands back into provider messages. The core's ``Call`` only ever sees
this module's types. Audio payloads here are still in the leg's wire format
(``MediaFormat`` from the ``StreamStarted`` event); the core's media transform
converts them to canonical PCM.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from rutster.media.formats import MediaFormat


class CallDirection(StrEnum):
    """Who placed the call, seen from the gateway."""

    INBOUND = "in"
    OUTBOUND = "out"


@dataclass(frozen=True, slots=True)
class CallContext:
    """What the core knows about a call when its media stream starts."""

    provider: str  # "twilio", later "telnyx", "vonage", "plivo", "sip"
    call_id: str  # provider call id (Twilio CallSid)
    stream_id: str  # provider stream id (Twilio streamSid)
    direction: CallDirection
    from_: str
    to: str


# ---- events: provider -> core -------------------------------------------------


@dataclass(frozen=True, slots=True)
class StreamConnected:
    """The provider opened the media socket (Twilio ``connected``)."""

    protocol: str


@dataclass(frozen=True, slots=True)
class StreamStarted:
    """Stream metadata arrived (Twilio ``start``): the call can be set up."""

    call: CallContext
    media_format: MediaFormat
    custom_parameters: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AudioReceived:
    """A chunk of caller audio in the leg's wire format (any length)."""

    payload: bytes
    timestamp_ms: int | None  # provider's stream clock, when it sends one


#: Keypad events a call can carry: 0-9, *, # and A-D (RFC 4733 §3.2 events 0-15),
#: whichever way they arrive (a provider's socket, a SIP leg, the tap protocol).
DTMF_DIGITS = frozenset("0123456789*#ABCD")


@dataclass(frozen=True, slots=True)
class DtmfReceived:
    """A keypad digit from the caller (one of :data:`DTMF_DIGITS`)."""

    digit: str


@dataclass(frozen=True, slots=True)
class MarkPlayed:
    """The provider has played all audio queued before the mark ``name``."""

    name: str


@dataclass(frozen=True, slots=True)
class StreamStopped:
    """The provider ended the stream (caller hung up or the call was ended)."""

    reason: str


IngressEvent = (
    StreamConnected | StreamStarted | AudioReceived | DtmfReceived | MarkPlayed | StreamStopped
)


# ---- commands: core -> provider ----------------------------------------------


@dataclass(frozen=True, slots=True)
class PlayAudio:
    """Queue audio (leg wire format) for the caller."""

    payload: bytes


@dataclass(frozen=True, slots=True)
class PlaceMark:
    """Ask the provider to report when the audio queued so far has played."""

    name: str


@dataclass(frozen=True, slots=True)
class ClearPlayback:
    """Drop everything the provider has queued for the caller (barge-in)."""


IngressCommand = PlayAudio | PlaceMark | ClearPlayback


class IngressProtocolError(Exception):
    """A provider message that breaks the media-stream protocol.

    ``reason`` is a short, stable, low-cardinality label used for metrics
    (``malformed_json``, ``bad_base64``, ``media_before_start``...);
    ``fatal`` says whether the connection must be closed rather than the
    message dropped. The message text is for logs and never contains audio.
    """

    def __init__(self, reason: str, message: str, *, fatal: bool = False) -> None:
        super().__init__(message)
        self.reason = reason
        self.fatal = fatal


class UnknownIngressEvent(Exception):
    """A well-formed provider message of an event type this codec does not know.

    Forward compatibility: logged, counted and dropped, never fatal.
    """

    def __init__(self, event_type: str) -> None:
        super().__init__(f"unknown event type {event_type!r}")
        self.event_type = event_type
