"""A MOCK OpenAI Realtime (GA) server for offline development and tests. It is not OpenAI.

It speaks the GA WebSocket event protocol (docs/PROVIDERS.md §5) closely enough
that the official ``openai`` SDK client (``AsyncOpenAI(websocket_base_url=...)
.realtime.connect(model=...)``) talks to it unchanged, and every event it sends
parses into the SDK's typed model. Nothing here understands speech:

- a reply is synthetic speech-like audio (:mod:`tools.realtime_mock_voice`)
  or a WAV, sent as ``response.output_audio.delta`` events faster than real time
  (the real service bursts too), with transcript ``"[mock reply]"``;
- a turn whose committed audio holds the marker tone (:mod:`tools.marker_tone`),
  or a call scripted with :meth:`MockRealtimeServer.script_tool_call`, turns the
  next response into a function call;
- ``usage`` figures are MOCK numbers derived from audio durations
  (:func:`mock_usage`), shaped exactly like the real ones (§5.5) so cost
  accounting code can be exercised, but they are not OpenAI's prices or counts;
- there is no voice activity detection: with the default ``server_vad`` turn
  detection nothing happens by itself; clients commit and ``response.create``.

Behaviour copied from the real service, with where it was observed:

- a bad key is **not** refused at the HTTP handshake: the upgrade succeeds, one
  ``error`` event (``invalid_api_key``) follows, then a close with code 3000 and
  reason ``invalid_request_error.invalid_api_key``; no ``Authorization`` header
  gives ``error`` with code null and close 3000 ``invalid_request_error``; no
  ``model`` gives ``missing_model`` and close 4000; an ``OpenAI-Beta`` header
  gives ``beta_api_shape_disabled`` and close 4000 (a live capture of
  wss://api.openai.com/v1/realtime dated 2026-09-18 found in public code;
  twilio-samples/speech-assistant-openai-realtime-api-python#4,
  openai/openai-realtime-api-beta#2). ``auth_rejection="handshake"`` instead
  answers HTTP 401 with an OpenAI-style JSON body, as a proxy in front of the
  service might;
- error codes and messages: ``conversation_already_has_active_response``
  (tleyden/arty#81), ``response_cancel_not_active`` "Cancellation failed: no
  active response found" (block/berd#318), ``input_audio_buffer_commit_empty``
  below 100 ms of audio (betalgo/openai#674), truncation past the audio
  "Audio content of N ms is already shorter than M ms" (twilio-samples
  speech-assistant#45), ``invalid_value`` for an unknown event type,
  ``invalid_json``, ``invalid_event`` for binary frames, ``unknown_parameter``,
  ``missing_required_parameter`` (the capture above; TanStack/ai#586);
- event order within a response follows the capture (``conversation.item.done``
  before ``response.output_item.done``, ``rate_limits.updated`` after
  ``response.done``).

The protocol logic is a sans-I/O state machine (:class:`_RealtimeProtocol`:
client text in, server events out, time passed in); :class:`MockRealtimeServer`
does the sockets and pacing. Every log line starts with ``MOCK realtime``.
Run it standalone with ``python -m rutster.tools.realtime_mock_server --port 0``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import contextlib
import copy
import json
import logging
import math
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from types import TracebackType
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

import pydantic
from openai.types.realtime import RealtimeSessionCreateRequest
from openai.types.realtime.realtime_response_create_params import RealtimeResponseCreateParams
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from rutster.brains.bind import ws_url
from rutster.media.formats import CANONICAL_SAMPLE_RATE
from rutster.media.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from rutster.media.resample import StreamResampler
from rutster.tools.marker_tone import MarkerToneDetector
from rutster.tools.realtime_mock_voice import MAX_REPLY_MS, load_reply_wav, synthesize_reply

__all__ = [
    "DEFAULT_MARKER_TOOL",
    "AuthRejection",
    "MockRealtimeServer",
    "MockResponse",
    "MockServerConfigError",
    "MockSession",
    "MockToolCall",
    "main",
    "mock_usage",
]

logger = logging.getLogger(__name__)

JsonObject = dict[str, Any]
AuthRejection = Literal["in_band", "handshake"]

# --- where it listens ----------------------------------------------------------------

#: The one path served: the SDK appends ``/realtime`` to ``websocket_base_url``
#: (openai resources/realtime/realtime.py ``_prepare_url``); every other path is 404.
REALTIME_PATH = "/v1/realtime"
#: What :attr:`MockRealtimeServer.websocket_base_url` ends with (the SDK adds ``/realtime``).
WEBSOCKET_BASE_PATH = "/v1"
#: Default host: loopback only, a test double never needs more (seed decision).
DEFAULT_HOST = "127.0.0.1"
#: ``Server`` header of the upgrade response, so captures show what answered.
SERVER_HEADER = "rutster-mock-openai-realtime (MOCK, not OpenAI)"

# --- replies -------------------------------------------------------------------------

#: Default reply length: over 2 s so barge-in and truncation can be exercised (spec).
DEFAULT_REPLY_MS = 2_500
#: Audio per ``response.output_audio.delta`` (seed decision; the real service's
#: deltas vary in size).
DELTA_MS = 100
#: Default send speed as a multiple of real time: the real service generates
#: audio faster than it plays and bursts it (docs/PROVIDERS.md §5.4 barge-in recipe;
#: openai-agents-python#4122). 4x keeps tests short while still paced.
DEFAULT_SPEED = 4.0
#: Transcript of every mock audio reply (spec): clearly not a model's words.
MOCK_TRANSCRIPT = "[mock reply]"
#: Characters per ``response.function_call_arguments.delta`` (seed decision:
#: short, so clients must accumulate several deltas).
ARGUMENT_DELTA_CHARS = 16
#: Seed of the synthetic reply voice.
DEFAULT_VOICE_SEED = 0

# --- mock usage figures (not OpenAI's) ----------------------------------------------

#: MOCK input audio tokens per second of committed caller audio (spec seed figure).
MOCK_INPUT_AUDIO_TOKENS_PER_S = 10
#: MOCK output audio tokens per second of reply audio actually sent (spec seed figure).
MOCK_OUTPUT_AUDIO_TOKENS_PER_S = 20
#: MOCK characters per text token (the common rule of thumb for English, ~4).
MOCK_CHARS_PER_TEXT_TOKEN = 4
#: ``rate_limits.updated`` token limit: the figure a live capture showed (seed decision).
MOCK_RATE_LIMIT_TOKENS = 15_000_000

# --- limits --------------------------------------------------------------------------

#: Largest ``audio`` string in one ``input_audio_buffer.append``: 15 MiB (docs/PROVIDERS.md §5.3).
MAX_AUDIO_EVENT_CHARS = 15 * 1024 * 1024
#: Largest WebSocket message accepted: one maximal append plus JSON envelope slack.
MAX_MESSAGE_BYTES = MAX_AUDIO_EVENT_CHARS + 64 * 1024
#: Least audio a commit accepts: the real service's "Expected at least 100ms of
#: audio" (betalgo/openai#674).
MIN_COMMIT_MS = 100
#: Uncommitted input kept per session; older audio is dropped and counted (seed
#: decision: bounds memory at ~14 MB of 24 kHz PCM).
MAX_BUFFERED_INPUT_MS = 300_000
#: Committed turns whose audio a :class:`MockSession` keeps for inspection (seed decision).
MAX_KEPT_TURNS = 16
#: ... and at most this much audio across them (seed decision).
MAX_KEPT_TURN_MS = 120_000
#: Conversation items remembered per session, oldest forgotten first (seed decision).
MAX_CONVERSATION_ITEMS = 1_000
#: Session records kept on :attr:`MockRealtimeServer.sessions` (seed decision).
MAX_SESSIONS_KEPT = 1_000
#: ``expires_at`` of a session: 60 minutes after creation, as a live capture showed.
SESSION_LIFETIME_S = 3_600

# --- close codes the real service uses (live capture) ---------------------------------

#: Close code after an authentication failure.
CLOSE_AUTH_FAILED = 3000
#: Close code after a request-shape failure (model, beta header).
CLOSE_BAD_REQUEST = 4000
#: Close code for ``session.close`` (RFC 6455 normal closure).
CLOSE_NORMAL = 1000

# --- test helpers --------------------------------------------------------------------

#: :meth:`MockRealtimeServer.wait_for` default timeout.
DEFAULT_WAIT_TIMEOUT_S = 5.0
#: :meth:`MockRealtimeServer.wait_for` polling interval.
WAIT_POLL_S = 0.005
#: Log format when :func:`main` configures logging.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: The real service's default session (live capture, 2026-09-18), ids added per session.
_DEFAULT_SESSION: JsonObject = {
    "type": "realtime",
    "object": "realtime.session",
    "output_modalities": ["audio"],
    "instructions": "",
    "tools": [],
    "tool_choice": "auto",
    "max_output_tokens": "inf",
    "tracing": None,
    "truncation": "auto",
    "prompt": None,
    "include": None,
    "audio": {
        "input": {
            "format": {"type": "audio/pcm", "rate": CANONICAL_SAMPLE_RATE},
            "transcription": None,
            "noise_reduction": None,
            "turn_detection": {
                "type": "server_vad",
                "threshold": 0.5,
                "prefix_padding_ms": 300,
                "silence_duration_ms": 200,
                "idle_timeout_ms": None,
                "create_response": True,
                "interrupt_response": True,
            },
        },
        "output": {
            "format": {"type": "audio/pcm", "rate": CANONICAL_SAMPLE_RATE},
            "voice": "alloy",
            "speed": 1.0,
        },
    },
}
#: Client event types the real service lists as supported, in its order (live capture).
_SUPPORTED_CLIENT_EVENTS = (
    "session.update",
    "session.close",
    "input_audio_buffer.append",
    "session.input_audio_buffer.append",
    "input_audio_buffer.commit",
    "input_audio_buffer.clear",
    "conversation.item.create",
    "conversation.item.truncate",
    "conversation.item.delete",
    "conversation.item.retrieve",
    "response.create",
    "response.cancel",
)
#: ``session`` keys a ``session.update`` may carry (the SDK's request model).
_SESSION_FIELDS = frozenset(RealtimeSessionCreateRequest.model_fields)
#: Nested objects a ``session.update`` merges into rather than replaces.
_MERGED_SESSION_PATHS = frozenset({("audio",), ("audio", "input"), ("audio", "output")})
#: pydantic location parts that name a union member rather than a field.
_PYDANTIC_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "dict", "list", "none"})
_API_KEYS_URL = "https://platform.openai.com/account/api-keys"


class MockServerConfigError(ValueError):
    """A bad :class:`MockRealtimeServer` setting. ``reason`` is a short, stable label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class MockToolCall:
    """A function call the mock makes instead of speaking: tool name and arguments."""

    name: str
    arguments: dict[str, Any]


#: Call made after a marker-tone turn (spec): the caller asked to hang up.
DEFAULT_MARKER_TOOL = MockToolCall("hangup", {"reason": "caller asked to end the call"})


@dataclass(slots=True)
class MockResponse:
    """What one response did: ``kind`` audio/text/function_call, final ``status``
    (``completed``, ``cancelled``, or ``abandoned`` when the socket went first),
    reply audio actually sent, and the usage reported."""

    response_id: str
    kind: str
    status: str
    audio_ms: int
    usage: JsonObject | None


@dataclass(slots=True)
class MockSession:
    """Everything the mock saw on one WebSocket connection (read it in tests).

    ``session_config`` merges every accepted ``session.update``'s ``session``;
    ``effective_session`` is what the mock reports (defaults plus updates).
    ``committed_turns`` holds the last committed turns' audio as received (in the
    session's input format), bounded by :data:`MAX_KEPT_TURNS` /
    :data:`MAX_KEPT_TURN_MS`. ``errors`` lists the ``error`` events sent
    (``code`` and ``message``). ``rejected`` is the error code of a connection
    refused before ``session.created``.
    """

    session_id: str
    model: str | None
    auth_header_present: bool
    rejected: str | None = None
    session_config: JsonObject = field(default_factory=dict)
    effective_session: JsonObject = field(default_factory=dict)
    session_updates: list[JsonObject] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    malformed_messages: int = 0
    appended_bytes: int = 0
    dropped_input_bytes: int = 0
    committed_turns: list[bytes] = field(default_factory=list)
    committed_ms_total: int = 0
    commits: int = 0
    responses_created: int = 0
    responses: list[MockResponse] = field(default_factory=list)
    cancels: int = 0
    truncations: list[JsonObject] = field(default_factory=list)
    function_call_outputs: list[JsonObject] = field(default_factory=list)
    errors: list[JsonObject] = field(default_factory=list)
    closed: bool = False
    close_code: int | None = None


def mock_usage(
    *,
    input_audio_ms: int,
    input_text_chars: int,
    cached_audio_tokens: int,
    cached_text_tokens: int,
    output_audio_ms: int,
    output_text_chars: int,
) -> JsonObject:
    """MOCK ``response.usage`` in the real shape (docs/PROVIDERS.md §5.5), from durations.

    The figures are the mock's own (:data:`MOCK_INPUT_AUDIO_TOKENS_PER_S`,
    :data:`MOCK_OUTPUT_AUDIO_TOKENS_PER_S`, :data:`MOCK_CHARS_PER_TEXT_TOKEN`),
    not OpenAI's. Cached tokens are a subset of input tokens, as in the real API.
    """
    in_audio = round(input_audio_ms * MOCK_INPUT_AUDIO_TOKENS_PER_S / 1000)
    in_text = math.ceil(input_text_chars / MOCK_CHARS_PER_TEXT_TOKEN)
    cached_audio = min(cached_audio_tokens, in_audio)
    cached_text = min(cached_text_tokens, in_text)
    out_audio = round(output_audio_ms * MOCK_OUTPUT_AUDIO_TOKENS_PER_S / 1000)
    out_text = math.ceil(output_text_chars / MOCK_CHARS_PER_TEXT_TOKEN)
    return {
        "total_tokens": in_audio + in_text + out_audio + out_text,
        "input_tokens": in_audio + in_text,
        "output_tokens": out_audio + out_text,
        "input_token_details": {
            "text_tokens": in_text,
            "audio_tokens": in_audio,
            "image_tokens": 0,
            "cached_tokens": cached_audio + cached_text,
            "cached_tokens_details": {
                "text_tokens": cached_text,
                "audio_tokens": cached_audio,
                "image_tokens": 0,
            },
        },
        "output_token_details": {"text_tokens": out_text, "audio_tokens": out_audio},
    }


# --- audio formats -------------------------------------------------------------------


def _format_type(fmt: object) -> str:
    """The ``type`` of a session audio format object (``audio/pcm`` if unset)."""
    if isinstance(fmt, dict) and isinstance(fmt.get("type"), str):
        return str(fmt["type"])
    return "audio/pcm"


def _bytes_per_ms(format_type: str) -> int:
    """Wire bytes per millisecond: PCM16 at 24 kHz, or G.711 at 8 kHz (§5.2)."""
    return 48 if format_type == "audio/pcm" else 8


def _sample_rate(format_type: str) -> int:
    return CANONICAL_SAMPLE_RATE if format_type == "audio/pcm" else 8_000


def _to_pcm16(data: bytes, format_type: str) -> bytes:
    """Wire audio to PCM16 at its own rate (for the marker-tone detector)."""
    if format_type == "audio/pcmu":
        return ulaw_decode(data)
    if format_type == "audio/pcma":
        return alaw_decode(data)
    return data  # an odd byte waits in the detector's pending buffer, keeping alignment


def _encode_reply(pcm24: bytes, format_type: str) -> bytes:
    """The 24 kHz PCM reply in a session's output format."""
    if format_type == "audio/pcm":
        return pcm24
    resampler = StreamResampler(CANONICAL_SAMPLE_RATE, 8_000, steady=False)
    pcm8 = resampler.process(pcm24) + resampler.flush()
    return ulaw_encode(pcm8) if format_type == "audio/pcmu" else alaw_encode(pcm8)


# --- the protocol state machine (sans-I/O) -------------------------------------------


class _Ids:
    """Mock ids: ``<prefix>_mock_<n>``, unique per server, recognisably fake."""

    def __init__(self) -> None:
        self._next = 0

    def new(self, prefix: str) -> str:
        self._next += 1
        return f"{prefix}_mock_{self._next:06d}"


@dataclass(slots=True)
class _Item:
    """A conversation item as the mock shows it, plus what truncation needs."""

    body: JsonObject
    audio_ms: int = 0
    truncatable: bool = False


@dataclass(slots=True)
class _ResponsePlan:
    """One response in flight: what it will send and how far it got."""

    response_id: str
    kind: Literal["audio", "text", "function_call"]
    item_id: str
    format: JsonObject
    voice: object
    modalities: list[str]
    max_output_tokens: object
    metadata: object
    instructions: str
    chunks: list[bytes] = field(default_factory=list)
    chunk_ms: list[int] = field(default_factory=list)
    sent: int = 0
    call: MockToolCall | None = None
    call_id: str = ""


@dataclass(slots=True)
class _Step:
    """What the I/O layer must do after one input: send ``events``, then maybe
    cancel the active response first, start streaming ``response``, or close."""

    events: list[JsonObject] = field(default_factory=list)
    cancel_response: bool = False
    response: _ResponsePlan | None = None
    close: tuple[int, str] | None = None


@dataclass(frozen=True, slots=True)
class _Settings:
    """Server settings a connection sees, snapshotted when it opens."""

    reject_auth: bool
    marker_tool: MockToolCall
    encoded_reply: Callable[[str], bytes]
    take_scripted_call: Callable[[], MockToolCall | None]


def _mask_key(key: str) -> str:
    """A key as the real error shows it: a prefix, stars, the last four characters."""
    return f"{key[:3]}***{key[-4:]}" if len(key) > 8 else "***"


def _error_body(code: str | None, message: str, param: str | None = None) -> JsonObject:
    return {
        "type": "invalid_request_error",
        "code": code,
        "message": message,
        "param": param,
        "event_id": None,
    }


def _pydantic_param(loc: Sequence[int | str]) -> str:
    """A pydantic error location as the API names a parameter (union tags dropped)."""
    parts: list[str] = []
    for part in loc:
        if isinstance(part, int):
            parts[-1:] = [f"{parts[-1]}[{part}]"] if parts else [f"[{part}]"]
        elif part[:1].isupper() or "[" in part or "-" in part or part in _PYDANTIC_TYPE_TAGS:
            continue
        else:
            parts.append(part)
    return ".".join(parts)


def _dig(obj: object, *keys: str) -> Any:
    """``obj[k1][k2]...``, or None where a level is missing or not an object
    (a client may legally set ``audio`` or ``audio.input`` to null)."""
    for key in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _merge(target: JsonObject, update: JsonObject, path: tuple[str, ...] = ()) -> None:
    """Merge ``update`` into ``target``: nested at :data:`_MERGED_SESSION_PATHS`,
    replacing elsewhere (a new ``turn_detection`` replaces the old one whole)."""
    for key, value in update.items():
        here = (*path, key)
        current = target.get(key)
        if here in _MERGED_SESSION_PATHS and isinstance(value, dict) and isinstance(current, dict):
            _merge(current, value, here)
        else:
            target[key] = copy.deepcopy(value)


def _merge_all(target: JsonObject, update: JsonObject) -> None:
    """Deep-merge every nested object (for the record of what clients sent)."""
    for key, value in update.items():
        current = target.get(key)
        if isinstance(value, dict) and isinstance(current, dict):
            _merge_all(current, value)
        else:
            target[key] = copy.deepcopy(value)


class _RealtimeProtocol:
    """One connection's Realtime session: client text in, server events out.

    Sans-I/O: no sockets, no clock; the time comes in as an argument and the
    pacing of audio deltas is the caller's job (:meth:`next_delta`).
    """

    def __init__(self, record: MockSession, ids: _Ids, settings: _Settings) -> None:
        self.record = record
        self._ids = ids
        self._settings = settings
        self._session: JsonObject = {}
        self._conversation_id = ids.new("conv")
        self._buffer = bytearray()
        self._detector = MarkerToneDetector(CANONICAL_SAMPLE_RATE)
        self._tool_turn_pending = False
        self._items: dict[str, _Item] = {}
        self._call_ids: dict[str, str] = {}
        self._active: _ResponsePlan | None = None
        self._function_output_chars = 0
        self._last_input_tokens = (0, 0)  # (text, audio) of the previous response
        self._turn_ms: deque[int] = deque()
        self._handlers: dict[str, Callable[[JsonObject, str | None], _Step]] = {
            "session.update": self._on_session_update,
            "session.close": self._on_session_close,
            "input_audio_buffer.append": self._on_append,
            "session.input_audio_buffer.append": self._on_append,
            "input_audio_buffer.commit": self._on_commit,
            "input_audio_buffer.clear": self._on_clear,
            "conversation.item.create": self._on_item_create,
            "conversation.item.truncate": self._on_truncate,
            "conversation.item.delete": self._on_item_delete,
            "conversation.item.retrieve": self._on_item_retrieve,
            "response.create": self._on_response_create,
            "response.cancel": self._on_response_cancel,
        }

    # -- events ---------------------------------------------------------------------

    def _event(self, event_type: str, **fields: Any) -> JsonObject:
        return {"type": event_type, "event_id": self._ids.new("event"), **fields}

    def _error(
        self,
        code: str | None,
        message: str,
        param: str | None = None,
        client_event_id: str | None = None,
    ) -> JsonObject:
        self.record.errors.append({"code": code, "message": message})
        body = _error_body(code, message, param)
        body["event_id"] = client_event_id
        return self._event("error", error=body)

    def _error_step(
        self,
        code: str | None,
        message: str,
        param: str | None = None,
        client_event_id: str | None = None,
    ) -> _Step:
        return _Step(events=[self._error(code, message, param, client_event_id)])

    def _refuse(self, code: str | None, message: str, close_code: int) -> _Step:
        """Refuse the connection the way the real service does: error event, then close."""
        self.record.rejected = code or "invalid_request_error"
        reason = f"invalid_request_error.{code}" if code else "invalid_request_error"
        return _Step(events=[self._error(code, message)], close=(close_code, reason))

    # -- connection -----------------------------------------------------------------

    def open(self, now_s: float, headers: dict[str, str]) -> _Step:
        """The connection was accepted: refuse it or send ``session.created``."""
        if "openai-beta" in headers:
            return self._refuse(
                "beta_api_shape_disabled",
                "The Realtime Beta API is no longer supported. "
                "Please use /v1/realtime for the GA API.",
                CLOSE_BAD_REQUEST,
            )
        scheme, _, key = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            return self._refuse(
                None, "Missing bearer or basic authentication in header", CLOSE_AUTH_FAILED
            )
        if self._settings.reject_auth:
            return self._refuse(
                "invalid_api_key",
                f"Incorrect API key provided: {_mask_key(key.strip())}. "
                f"You can find your API key at {_API_KEYS_URL}.",
                CLOSE_AUTH_FAILED,
            )
        if not self.record.model:
            return self._refuse(
                "missing_model",
                "You must provide a model parameter, for example "
                "wss://api.openai.com/v1/realtime?model=gpt-realtime",
                CLOSE_BAD_REQUEST,
            )
        self._session = copy.deepcopy(_DEFAULT_SESSION)
        self._session["id"] = self.record.session_id
        self._session["model"] = self.record.model
        self._session["expires_at"] = int(now_s) + SESSION_LIFETIME_S
        self.record.effective_session = self._session
        return _Step(events=[self._event("session.created", session=copy.deepcopy(self._session))])

    def receive_binary(self) -> _Step:
        """A binary frame: the real service refuses those and keeps the session."""
        self.record.malformed_messages += 1
        return self._error_step(
            "invalid_event", "Expected a text WebSocket message; binary frames are not supported."
        )

    def receive_text(self, text: str) -> _Step:
        """Handle one client event (any text, however malformed)."""
        try:
            event = json.loads(text)
        except (ValueError, RecursionError):
            self.record.malformed_messages += 1
            return self._error_step(
                "invalid_json", "Invalid event: failed to parse JSON value. (MOCK server)"
            )
        if not isinstance(event, dict):
            self.record.malformed_messages += 1
            return self._error_step("invalid_event", "Invalid event: expected a JSON object.")
        client_event_id = event.get("event_id")
        event_id = client_event_id if isinstance(client_event_id, str) else None
        event_type = event.get("type")
        if not isinstance(event_type, str):
            self.record.malformed_messages += 1
            return self._error_step(
                "missing_required_parameter",
                "Missing required parameter: 'type'.",
                "type",
                event_id,
            )
        self.record.events.append(event_type)
        handler = self._handlers.get(event_type)
        if handler is None:
            supported = ", ".join(f"'{name}'" for name in _SUPPORTED_CLIENT_EVENTS[:-1])
            return self._error_step(
                "invalid_value",
                f"Invalid value: '{event_type}'. Supported values are: {supported}, "
                f"and '{_SUPPORTED_CLIENT_EVENTS[-1]}'.",
                "type",
                event_id,
            )
        return handler(event, event_id)

    # -- session --------------------------------------------------------------------

    @property
    def _input_format(self) -> str:
        return _format_type(_dig(self._session, "audio", "input", "format"))

    def _on_session_update(self, event: JsonObject, eid: str | None) -> _Step:
        session = event.get("session")
        if not isinstance(session, dict):
            return self._error_step(
                "missing_required_parameter",
                "Missing required parameter: 'session'.",
                "session",
                eid,
            )
        session_type = session.get("type")
        if session_type is None:
            return self._error_step(
                "missing_required_parameter",
                "Missing required parameter: 'session.type'.",
                "session.type",
                eid,
            )
        if session_type == "transcription":
            return self._error_step(
                "invalid_value",
                "Passing a transcription session update event to a realtime session "
                "is not allowed.",
                "session.type",
                eid,
            )
        if session_type != "realtime":
            return self._error_step(
                "invalid_value",
                f"Invalid value: '{session_type}'. Supported values are: 'realtime' and "
                "'transcription'.",
                "session.type",
                eid,
            )
        for key in session:
            if key not in _SESSION_FIELDS:
                return self._error_step(
                    "unknown_parameter",
                    f"Unknown parameter: 'session.{key}'.",
                    f"session.{key}",
                    eid,
                )
        try:
            RealtimeSessionCreateRequest.model_validate(session)
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            param = "session." + _pydantic_param(first["loc"])
            return self._error_step(
                "invalid_value", f"Invalid value for '{param}': {first['msg']}.", param, eid
            )
        old_input = self._input_format
        self.record.session_updates.append(copy.deepcopy(event))
        _merge_all(self.record.session_config, session)
        _merge(self._session, session)
        self._session["type"] = "realtime"
        if self._input_format != old_input:
            self._detector = MarkerToneDetector(_sample_rate(self._input_format))
        return _Step(events=[self._event("session.updated", session=copy.deepcopy(self._session))])

    def _on_session_close(self, event: JsonObject, eid: str | None) -> _Step:
        return _Step(close=(CLOSE_NORMAL, ""))

    # -- input audio ----------------------------------------------------------------

    def _on_append(self, event: JsonObject, eid: str | None) -> _Step:
        audio = event.get("audio")
        if not isinstance(audio, str):
            return self._error_step(
                "missing_required_parameter", "Missing required parameter: 'audio'.", "audio", eid
            )
        if len(audio) > MAX_AUDIO_EVENT_CHARS:
            return self._error_step(
                "string_above_max_length",
                f"Invalid 'audio': string too long. Expected a string with maximum length "
                f"{MAX_AUDIO_EVENT_CHARS}, but got a string with length {len(audio)} instead.",
                "audio",
                eid,
            )
        try:
            data = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            return self._error_step(
                "invalid_value",
                "Invalid 'audio'. Expected base64-encoded audio bytes (mono PCM16 at 24kHz).",
                "audio",
                eid,
            )
        self.record.appended_bytes += len(data)
        self._buffer += data
        cap = MAX_BUFFERED_INPUT_MS * _bytes_per_ms(self._input_format)
        if len(self._buffer) > cap:
            excess = len(self._buffer) - cap
            del self._buffer[:excess]
            self.record.dropped_input_bytes += excess
        self._detector.feed(_to_pcm16(data, self._input_format))
        return _Step()

    def _on_commit(self, event: JsonObject, eid: str | None) -> _Step:
        ms = len(self._buffer) / _bytes_per_ms(self._input_format)
        if ms < MIN_COMMIT_MS:
            return self._error_step(
                "input_audio_buffer_commit_empty",
                "Error committing input audio buffer: buffer too small. Expected at least "
                f"{MIN_COMMIT_MS}ms of audio, but buffer only has {ms:.2f}ms of audio.",
                None,
                eid,
            )
        previous = self._last_item_id()
        item_id = self._ids.new("item")
        body: JsonObject = {
            "id": item_id,
            "object": "realtime.item",
            "type": "message",
            "status": "completed",
            "role": "user",
            "content": [{"type": "input_audio", "transcript": None}],
        }
        self._add_item(item_id, _Item(body))
        self._keep_turn(bytes(self._buffer), int(ms))
        self.record.commits += 1
        self.record.committed_ms_total += int(ms)
        if self._detector.detected:
            self._tool_turn_pending = True
            logger.info(
                "MOCK realtime: marker tone in turn %s: next response calls a tool", item_id
            )
        self._buffer.clear()
        self._detector.reset()
        return _Step(
            events=[
                self._event(
                    "input_audio_buffer.committed", previous_item_id=previous, item_id=item_id
                ),
                self._event(
                    "conversation.item.added", previous_item_id=previous, item=copy.deepcopy(body)
                ),
                self._event(
                    "conversation.item.done", previous_item_id=previous, item=copy.deepcopy(body)
                ),
            ]
        )

    def _keep_turn(self, audio: bytes, ms: int) -> None:
        turns = self.record.committed_turns
        turns.append(audio)
        self._turn_ms.append(ms)
        while len(turns) > 1 and (
            len(turns) > MAX_KEPT_TURNS or sum(self._turn_ms) > MAX_KEPT_TURN_MS
        ):
            turns.pop(0)
            self._turn_ms.popleft()

    def _on_clear(self, event: JsonObject, eid: str | None) -> _Step:
        self._buffer.clear()
        self._detector.reset()
        return _Step(events=[self._event("input_audio_buffer.cleared")])

    # -- conversation items ---------------------------------------------------------

    def _last_item_id(self) -> str | None:
        return next(reversed(self._items), None)

    def _add_item(self, item_id: str, item: _Item) -> None:
        self._items.pop(item_id, None)
        self._items[item_id] = item
        call_id = item.body.get("call_id")
        if item.body.get("type") == "function_call" and isinstance(call_id, str):
            self._call_ids[call_id] = item_id
        while len(self._items) > MAX_CONVERSATION_ITEMS:
            self._forget(next(iter(self._items)))

    def _forget(self, item_id: str) -> None:
        item = self._items.pop(item_id)
        call_id = item.body.get("call_id")
        if isinstance(call_id, str) and self._call_ids.get(call_id) == item_id:
            del self._call_ids[call_id]

    def _on_item_create(self, event: JsonObject, eid: str | None) -> _Step:
        item = event.get("item")
        if not isinstance(item, dict):
            return self._error_step(
                "missing_required_parameter", "Missing required parameter: 'item'.", "item", eid
            )
        item_type = item.get("type")
        if not isinstance(item_type, str):
            return self._error_step(
                "missing_required_parameter",
                "Missing required parameter: 'item.type'.",
                "item.type",
                eid,
            )
        if item_type == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            for name, value in (("call_id", call_id), ("output", output)):
                if not isinstance(value, str):
                    return self._error_step(
                        "missing_required_parameter",
                        f"Missing required parameter: 'item.{name}'.",
                        f"item.{name}",
                        eid,
                    )
            # The real service checks that a function_call with this call_id exists
            # (openai-node ConversationItemWithReference docs); the wording is the mock's.
            if call_id not in self._call_ids:
                return self._error_step(
                    "invalid_value",
                    f"Tool call ID '{call_id}' not found in conversation. (MOCK server)",
                    "item.call_id",
                    eid,
                )
            assert isinstance(output, str)  # checked above; narrows for mypy
            self.record.function_call_outputs.append({"call_id": call_id, "output": output})
            self._function_output_chars += len(output)
        item_id = item.get("id")
        if not isinstance(item_id, str) or not item_id:
            item_id = self._ids.new("item")
        previous = event.get("previous_item_id")
        if not isinstance(previous, str):
            previous = self._last_item_id()
        body = {**copy.deepcopy(item), "id": item_id, "object": "realtime.item"}
        body.setdefault("status", "completed")
        self._add_item(item_id, _Item(body))
        return _Step(
            events=[
                self._event(
                    "conversation.item.added", previous_item_id=previous, item=copy.deepcopy(body)
                ),
                self._event(
                    "conversation.item.done", previous_item_id=previous, item=copy.deepcopy(body)
                ),
            ]
        )

    def _on_truncate(self, event: JsonObject, eid: str | None) -> _Step:
        item_id, content_index, end_ms = (
            event.get("item_id"),
            event.get("content_index", 0),
            event.get("audio_end_ms"),
        )
        if not isinstance(item_id, str):
            return self._error_step(
                "missing_required_parameter",
                "Missing required parameter: 'item_id'.",
                "item_id",
                eid,
            )
        if not isinstance(end_ms, int) or isinstance(end_ms, bool) or end_ms < 0:
            return self._error_step(
                "invalid_value",
                "Invalid 'audio_end_ms': expected a non-negative integer.",
                "audio_end_ms",
                eid,
            )
        item = self._items.get(item_id)
        if item is None:
            return self._error_step(
                "item_truncate_invalid_item_id",
                f"Error truncating item: the item with id '{item_id}' does not exist.",
                "item_id",
                eid,
            )
        if not item.truncatable or item.audio_ms == 0:
            return self._error_step(
                "unsupported_content_type",
                "Only model output audio messages can be truncated.",
                "item_id",
                eid,
            )
        if content_index != 0:
            return self._error_step(
                "invalid_value",
                f"Invalid 'content_index': item has no content part {content_index}.",
                "content_index",
                eid,
            )
        if end_ms > item.audio_ms:
            return self._error_step(
                "invalid_value",
                f"Audio content of {item.audio_ms}ms is already shorter than {end_ms}ms",
                "audio_end_ms",
                eid,
            )
        item.audio_ms = end_ms
        self.record.truncations.append(
            {"item_id": item_id, "content_index": 0, "audio_end_ms": end_ms}
        )
        return _Step(
            events=[
                self._event(
                    "conversation.item.truncated",
                    item_id=item_id,
                    content_index=0,
                    audio_end_ms=end_ms,
                )
            ]
        )

    def _item_or_error(self, event: JsonObject, eid: str | None) -> _Item | _Step:
        item_id = event.get("item_id")
        if not isinstance(item_id, str):
            return self._error_step(
                "missing_required_parameter",
                "Missing required parameter: 'item_id'.",
                "item_id",
                eid,
            )
        item = self._items.get(item_id)
        if item is None:
            return self._error_step(
                "invalid_value",
                f"Item with id '{item_id}' not found. (MOCK server)",
                "item_id",
                eid,
            )
        return item

    def _on_item_delete(self, event: JsonObject, eid: str | None) -> _Step:
        found = self._item_or_error(event, eid)
        if isinstance(found, _Step):
            return found
        item_id = str(found.body["id"])
        self._forget(item_id)
        return _Step(events=[self._event("conversation.item.deleted", item_id=item_id)])

    def _on_item_retrieve(self, event: JsonObject, eid: str | None) -> _Step:
        found = self._item_or_error(event, eid)
        if isinstance(found, _Step):
            return found
        return _Step(
            events=[self._event("conversation.item.retrieved", item=copy.deepcopy(found.body))]
        )

    # -- responses ------------------------------------------------------------------

    def _on_response_create(self, event: JsonObject, eid: str | None) -> _Step:
        if self._active is not None:
            return self._error_step(
                "conversation_already_has_active_response",
                "Conversation already has an active response in progress: "
                f"{self._active.response_id}. Wait until the response is finished before "
                "creating a new one.",
                None,
                eid,
            )
        options = event.get("response", {})
        if options is None:
            options = {}
        if not isinstance(options, dict):
            return self._error_step(
                "invalid_type", "Invalid type for 'response': expected an object.", "response", eid
            )
        try:
            RealtimeResponseCreateParams.model_validate(options)
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            param = "response." + _pydantic_param(first["loc"])
            return self._error_step(
                "invalid_value", f"Invalid value for '{param}': {first['msg']}.", param, eid
            )
        self.record.responses_created += 1
        plan = self._plan_response(options)
        self._active = plan
        return _Step(response=plan)

    def _plan_response(self, options: JsonObject) -> _ResponsePlan:
        fmt = copy.deepcopy(
            _dig(options, "audio", "output", "format")
            or _dig(self._session, "audio", "output", "format")
            or {}
        )
        modalities = list(
            options.get("output_modalities") or self._session.get("output_modalities") or ["audio"]
        )
        call = self._settings.take_scripted_call()
        if call is None and self._tool_turn_pending:
            call = self._settings.marker_tool
        self._tool_turn_pending = False
        kind: Literal["audio", "text", "function_call"] = (
            "function_call" if call is not None else "audio" if "audio" in modalities else "text"
        )
        plan = _ResponsePlan(
            response_id=self._ids.new("resp"),
            kind=kind,
            item_id=self._ids.new("item"),
            format=fmt,
            voice=_dig(options, "audio", "output", "voice")
            or _dig(self._session, "audio", "output", "voice"),
            modalities=modalities,
            max_output_tokens=options.get(
                "max_output_tokens", self._session.get("max_output_tokens")
            ),
            metadata=options.get("metadata"),
            instructions=str(
                options.get("instructions") or self._session.get("instructions") or ""
            ),
            call=call,
        )
        if call is not None:
            plan.call_id = self._ids.new("call")
        if kind == "audio":
            audio = self._settings.encoded_reply(_format_type(fmt))
            step = DELTA_MS * _bytes_per_ms(_format_type(fmt))
            plan.chunks = [audio[i : i + step] for i in range(0, len(audio), step)]
            plan.chunk_ms = [
                len(chunk) // _bytes_per_ms(_format_type(fmt)) for chunk in plan.chunks
            ]
        return plan

    def _response_body(
        self,
        plan: _ResponsePlan,
        status: str,
        status_details: JsonObject | None = None,
        output: list[JsonObject] | None = None,
        usage: JsonObject | None = None,
    ) -> JsonObject:
        return {
            "object": "realtime.response",
            "id": plan.response_id,
            "status": status,
            "status_details": status_details,
            "output": output or [],
            "conversation_id": self._conversation_id,
            "output_modalities": plan.modalities,
            "max_output_tokens": plan.max_output_tokens,
            "audio": {"output": {"format": plan.format, "voice": plan.voice}},
            "usage": usage,
            "metadata": plan.metadata,
        }

    def _item_body(self, plan: _ResponsePlan, status: str, text: str | None) -> JsonObject:
        """The response's output item; ``text`` None means no content part yet."""
        if plan.kind == "function_call":
            assert plan.call is not None
            return {
                "id": plan.item_id,
                "object": "realtime.item",
                "type": "function_call",
                "status": status,
                "name": plan.call.name,
                "call_id": plan.call_id,
                "arguments": "" if text is None else text,
            }
        content: list[JsonObject] = []
        if text is not None:
            content = [
                {"type": "output_audio", "transcript": text}
                if plan.kind == "audio"
                else {"type": "output_text", "text": text}
            ]
        return {
            "id": plan.item_id,
            "object": "realtime.item",
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": content,
        }

    def _part(self, plan: _ResponsePlan, text: str) -> JsonObject:
        return (
            {"type": "audio", "transcript": text}
            if plan.kind == "audio"
            else {
                "type": "text",
                "text": text,
            }
        )

    def _ref(self, plan: _ResponsePlan) -> JsonObject:
        """The fields every event about the response's item carries."""
        return {"response_id": plan.response_id, "item_id": plan.item_id, "output_index": 0}

    def begin_response(self, plan: _ResponsePlan) -> list[JsonObject]:
        """Events from ``response.created`` up to the first delta."""
        previous = self._last_item_id()
        item = self._item_body(plan, "in_progress", None)
        self._add_item(plan.item_id, _Item(copy.deepcopy(item), truncatable=plan.kind == "audio"))
        events = [
            self._event("response.created", response=self._response_body(plan, "in_progress")),
            self._event(
                "response.output_item.added",
                response_id=plan.response_id,
                output_index=0,
                item=copy.deepcopy(item),
            ),
            self._event("conversation.item.added", previous_item_id=previous, item=item),
        ]
        if plan.kind == "function_call":
            assert plan.call is not None
            arguments = json.dumps(plan.call.arguments)
            for start in range(0, max(len(arguments), 1), ARGUMENT_DELTA_CHARS):
                events.append(
                    self._event(
                        "response.function_call_arguments.delta",
                        call_id=plan.call_id,
                        delta=arguments[start : start + ARGUMENT_DELTA_CHARS],
                        **self._ref(plan),
                    )
                )
            events.append(
                self._event(
                    "response.function_call_arguments.done",
                    call_id=plan.call_id,
                    name=plan.call.name,
                    arguments=arguments,
                    **self._ref(plan),
                )
            )
            return events
        events.append(
            self._event(
                "response.content_part.added",
                content_index=0,
                part=self._part(plan, ""),
                **self._ref(plan),
            )
        )
        if plan.kind == "text":
            events.append(
                self._event(
                    "response.output_text.delta",
                    content_index=0,
                    delta=MOCK_TRANSCRIPT,
                    **self._ref(plan),
                )
            )
        return events

    def has_more(self, plan: _ResponsePlan) -> bool:
        """Whether audio deltas remain to be sent."""
        return plan.sent < len(plan.chunks)

    def next_delta(self, plan: _ResponsePlan) -> list[JsonObject]:
        """The next ``response.output_audio.delta`` (the first also carries the transcript)."""
        chunk = plan.chunks[plan.sent]
        plan.sent += 1
        item = self._items.get(plan.item_id)
        if item is not None:
            item.audio_ms += plan.chunk_ms[plan.sent - 1]
        events = [
            self._event(
                "response.output_audio.delta",
                content_index=0,
                delta=base64.b64encode(chunk).decode("ascii"),
                **self._ref(plan),
            )
        ]
        if plan.sent == 1:
            events.append(
                self._event(
                    "response.output_audio_transcript.delta",
                    content_index=0,
                    delta=MOCK_TRANSCRIPT,
                    **self._ref(plan),
                )
            )
        return events

    def finish_response(self, plan: _ResponsePlan, *, cancelled: bool) -> list[JsonObject]:
        """Events from the last delta to ``rate_limits.updated``; ends the response."""
        sent_ms = sum(plan.chunk_ms[: plan.sent])
        total_ms = sum(plan.chunk_ms)
        if plan.kind == "function_call":
            assert plan.call is not None
            text = json.dumps(plan.call.arguments)
            text_chars = len(plan.call.name) + len(text)
        elif plan.kind == "audio":
            share = sent_ms / total_ms if total_ms else 1.0
            text = MOCK_TRANSCRIPT[: math.ceil(len(MOCK_TRANSCRIPT) * share)]
            text_chars = len(text)
        else:
            text = MOCK_TRANSCRIPT
            text_chars = len(text)
        status = "cancelled" if cancelled else "completed"
        item_status = "incomplete" if cancelled else "completed"
        item = self._item_body(plan, item_status, text)
        stored = self._items.get(plan.item_id)
        if stored is not None:
            stored.body = copy.deepcopy(item)
        events: list[JsonObject] = []
        if plan.kind != "function_call":
            if plan.kind == "audio":
                events.append(
                    self._event("response.output_audio.done", content_index=0, **self._ref(plan))
                )
                events.append(
                    self._event(
                        "response.output_audio_transcript.done",
                        content_index=0,
                        transcript=text,
                        **self._ref(plan),
                    )
                )
            else:
                events.append(
                    self._event(
                        "response.output_text.done", content_index=0, text=text, **self._ref(plan)
                    )
                )
            events.append(
                self._event(
                    "response.content_part.done",
                    content_index=0,
                    part=self._part(plan, text),
                    **self._ref(plan),
                )
            )
        usage = self._usage(plan, sent_ms, text_chars)
        details = {"type": "cancelled", "reason": "client_cancelled"} if cancelled else None
        events += [
            self._event("conversation.item.done", previous_item_id=None, item=copy.deepcopy(item)),
            self._event(
                "response.output_item.done",
                response_id=plan.response_id,
                output_index=0,
                item=copy.deepcopy(item),
            ),
            self._event(
                "response.done",
                response=self._response_body(plan, status, details, [item], usage),
            ),
            self._event(
                "rate_limits.updated",
                rate_limits=[
                    {
                        "name": "tokens",
                        "limit": MOCK_RATE_LIMIT_TOKENS,
                        "remaining": MOCK_RATE_LIMIT_TOKENS - int(usage["total_tokens"]),
                        "reset_seconds": 0.001,
                    }
                ],
            ),
        ]
        self.record.responses.append(
            MockResponse(plan.response_id, plan.kind, status, sent_ms, usage)
        )
        self._active = None
        return events

    def abandon_response(self, plan: _ResponsePlan) -> None:
        """The socket went before the response finished: forget it."""
        if self._active is plan:
            self._active = None
            self.record.responses.append(
                MockResponse(
                    plan.response_id, plan.kind, "abandoned", sum(plan.chunk_ms[: plan.sent]), None
                )
            )

    def _usage(self, plan: _ResponsePlan, sent_ms: int, output_text_chars: int) -> JsonObject:
        text_chars = len(plan.instructions) + self._function_output_chars
        cached_text, cached_audio = self._last_input_tokens
        usage = mock_usage(
            input_audio_ms=self.record.committed_ms_total,
            input_text_chars=text_chars,
            cached_audio_tokens=cached_audio,
            cached_text_tokens=cached_text,
            output_audio_ms=sent_ms,
            output_text_chars=output_text_chars,
        )
        details = usage["input_token_details"]
        # The whole conversation is re-billed as input each time; what the last
        # response already read counts as cached, like the real prompt cache.
        self._last_input_tokens = (int(details["text_tokens"]), int(details["audio_tokens"]))
        return usage

    def _on_response_cancel(self, event: JsonObject, eid: str | None) -> _Step:
        wanted = event.get("response_id")
        active = self._active
        if active is None or (isinstance(wanted, str) and wanted != active.response_id):
            return self._error_step(
                "response_cancel_not_active",
                "Cancellation failed: no active response found",
                None,
                eid,
            )
        self.record.cancels += 1
        return _Step(cancel_response=True)


# --- the server (I/O) -----------------------------------------------------------------


class _ActiveStream:
    """A response being streamed: its task and its cancel signal."""

    def __init__(self) -> None:
        self.cancel = asyncio.Event()
        self.task: asyncio.Task[None] | None = None


class _ConnectionRunner:
    """Runs one connection: feeds the protocol, sends its events, paces audio."""

    def __init__(self, ws: ServerConnection, protocol: _RealtimeProtocol, speed: float) -> None:
        self._ws = ws
        self._protocol = protocol
        self._interval_s = 0.0 if math.isinf(speed) else DELTA_MS / 1000 / speed
        self._stream: _ActiveStream | None = None

    async def run(self, headers: dict[str, str]) -> None:
        try:
            if not await self._apply(self._protocol.open(time.time(), headers)):
                return
            async for message in self._ws:
                step = (
                    self._protocol.receive_text(message)
                    if isinstance(message, str)
                    else self._protocol.receive_binary()
                )
                if not await self._apply(step):
                    return
        except ConnectionClosed:
            pass
        finally:
            await self._stop_stream()

    async def _send(self, events: list[JsonObject]) -> None:
        for event in events:
            await self._ws.send(json.dumps(event))

    async def _apply(self, step: _Step) -> bool:
        """Carry out one step; False once the connection is to end."""
        if step.cancel_response and self._stream is not None:
            stream = self._stream
            stream.cancel.set()
            if stream.task is not None:
                await stream.task
        await self._send(step.events)
        if step.response is not None:
            stream = _ActiveStream()
            stream.task = asyncio.create_task(self._run_response(step.response, stream))
            self._stream = stream
        if step.close is not None:
            await self._ws.close(*step.close)
            return False
        return True

    async def _cancelled_by(self, stream: _ActiveStream, due: float) -> bool:
        """Wait until ``due`` (loop time); True if the response was cancelled first."""
        delay = due - asyncio.get_running_loop().time()
        if delay <= 0 or stream.cancel.is_set():
            await asyncio.sleep(0)  # let a pending response.cancel be read
            return stream.cancel.is_set()
        try:
            await asyncio.wait_for(stream.cancel.wait(), delay)
        except TimeoutError:
            return False
        return True

    async def _run_response(self, plan: _ResponsePlan, stream: _ActiveStream) -> None:
        protocol = self._protocol
        try:
            await self._send(protocol.begin_response(plan))
            start = asyncio.get_running_loop().time()
            index = 0
            while protocol.has_more(plan):
                if await self._cancelled_by(stream, start + index * self._interval_s):
                    break
                await self._send(protocol.next_delta(plan))
                index += 1
            await self._send(protocol.finish_response(plan, cancelled=stream.cancel.is_set()))
        except ConnectionClosed:
            protocol.abandon_response(plan)
        except asyncio.CancelledError:
            protocol.abandon_response(plan)
            raise
        except Exception:  # a mock bug must not take the server down
            logger.exception("MOCK realtime: response %s failed", plan.response_id)
            protocol.abandon_response(plan)
        finally:
            if self._stream is stream:
                self._stream = None

    async def _stop_stream(self) -> None:
        stream = self._stream
        if stream is not None and stream.task is not None:
            stream.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stream.task


def _json_response(connection: ServerConnection, status: HTTPStatus, body: JsonObject) -> Response:
    """An HTTP error answer to the upgrade request, with an OpenAI-style JSON body."""
    response = connection.respond(status, json.dumps(body) + "\n")
    del response.headers["Content-Type"]
    response.headers["Content-Type"] = "application/json"
    return response


class MockRealtimeServer:
    """The MOCK OpenAI Realtime server (offline; not OpenAI), startable in-process.

    ``reply_ms`` / ``reply_wav`` choose the reply audio (synthetic speech-like
    audio of that length, or a WAV's content), ``speed`` how many times faster
    than real time it is sent (``math.inf``: no pacing), ``marker_tool`` the
    call a marker-tone turn triggers. ``reject_auth`` (settable at any time)
    refuses new connections' credentials, the real service's way
    (``auth_rejection="in_band"``) or with HTTP 401 at the handshake
    (``"handshake"``). Raises :class:`MockServerConfigError` or
    :class:`~tools.realtime_mock_voice.ReplyWavError` for bad settings.

    Read (don't write): ``sessions`` (one :class:`MockSession` per connection,
    oldest first) and ``connections_total`` (upgrade requests on the realtime path).
    """

    def __init__(
        self,
        *,
        reply_ms: int = DEFAULT_REPLY_MS,
        reply_wav: str | Path | None = None,
        speed: float = DEFAULT_SPEED,
        voice_seed: int = DEFAULT_VOICE_SEED,
        marker_tool: MockToolCall = DEFAULT_MARKER_TOOL,
        reject_auth: bool = False,
        auth_rejection: AuthRejection = "in_band",
    ) -> None:
        if not 0 < reply_ms <= MAX_REPLY_MS:
            raise MockServerConfigError(
                "bad_reply_ms", f"reply_ms must be 1..{MAX_REPLY_MS}, got {reply_ms}"
            )
        if not speed > 0:
            raise MockServerConfigError("bad_speed", f"speed must be > 0, got {speed}")
        if auth_rejection not in ("in_band", "handshake"):
            raise MockServerConfigError(
                "bad_auth_rejection",
                f"auth_rejection must be in_band or handshake: {auth_rejection!r}",
            )
        self.reply_pcm24 = (
            load_reply_wav(reply_wav)
            if reply_wav is not None
            else synthesize_reply(reply_ms, seed=voice_seed)
        )
        self.speed = speed
        self.marker_tool = marker_tool
        self.reject_auth = reject_auth
        self.auth_rejection: AuthRejection = auth_rejection
        self.sessions: list[MockSession] = []
        self.connections_total = 0
        self._encoded: dict[str, bytes] = {}
        self._scripted: deque[MockToolCall] = deque()
        self._ids = _Ids()
        self._server: Server | None = None
        self._host = ""
        self._port = 0
        self._connections: set[ServerConnection] = set()

    # -- lifecycle --------------------------------------------------------------------

    async def start(self, host: str = DEFAULT_HOST, port: int = 0) -> None:
        """Listen on ``host:port`` (port 0: the OS picks; see :attr:`websocket_base_url`)."""
        if self._server is not None:
            raise RuntimeError("MOCK realtime server already started")
        self._server = await serve(
            self._handle,
            host,
            port,
            process_request=self._process_request,
            max_size=MAX_MESSAGE_BYTES,
            server_header=SERVER_HEADER,
        )
        self._host = host
        self._port = int(next(iter(self._server.sockets)).getsockname()[1])
        logger.info(
            "MOCK realtime: listening on %s (offline mock, not OpenAI)", self.websocket_base_url
        )

    async def stop(self) -> None:
        """Close every connection (1001 going away) and stop listening (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
            await server.wait_closed()
            logger.info("MOCK realtime: stopped")

    async def __aenter__(self) -> MockRealtimeServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def port(self) -> int:
        """The port it listens on."""
        if self._server is None:
            raise RuntimeError("MOCK realtime server not started")
        return self._port

    @property
    def websocket_base_url(self) -> str:
        """What to pass as the SDK's ``websocket_base_url``, e.g. ``ws://127.0.0.1:PORT/v1``."""
        return ws_url(self._host, self.port, WEBSOCKET_BASE_PATH)

    # -- test controls ----------------------------------------------------------------

    def script_tool_call(self, name: str, arguments: dict[str, Any]) -> None:
        """Make the next response (on any connection) call ``name`` with ``arguments``.

        Calls queue up; each response consumes one. ``arguments`` must be
        JSON-serialisable (``TypeError`` otherwise).
        """
        json.dumps(arguments)
        self._scripted.append(MockToolCall(name, dict(arguments)))

    async def drop_connections(self) -> None:
        """Abort every live connection without a close frame (the upstream vanished).

        Clients see ``ConnectionClosedError`` (code 1006), not a clean close.
        """
        victims = list(self._connections)
        for ws in victims:
            ws.transport.abort()
        logger.info("MOCK realtime: dropped %d connection(s) on purpose", len(victims))
        await self.wait_for(lambda: not (self._connections & set(victims)))

    async def wait_for(
        self, predicate: Callable[[], bool], timeout_s: float = DEFAULT_WAIT_TIMEOUT_S
    ) -> None:
        """Wait until ``predicate()`` holds (polled), or raise ``TimeoutError``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not predicate():
            if loop.time() >= deadline:
                raise TimeoutError("MOCK realtime: condition not met in time")
            await asyncio.sleep(WAIT_POLL_S)

    # -- connections ------------------------------------------------------------------

    def _take_scripted_call(self) -> MockToolCall | None:
        return self._scripted.popleft() if self._scripted else None

    def _encoded_reply(self, format_type: str) -> bytes:
        if format_type not in self._encoded:
            self._encoded[format_type] = _encode_reply(self.reply_pcm24, format_type)
        return self._encoded[format_type]

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path = urlsplit(request.path).path
        if path != REALTIME_PATH:
            # OpenAI's HTTP API answers an unknown path like this.
            return _json_response(
                connection,
                HTTPStatus.NOT_FOUND,
                {"error": _error_body(None, f"Invalid URL (GET {path})")},
            )
        self.connections_total += 1
        if self.reject_auth and self.auth_rejection == "handshake":
            key = request.headers.get("Authorization", "").partition(" ")[2].strip()
            logger.info("MOCK realtime: refusing credentials with HTTP 401 at the handshake")
            return _json_response(
                connection,
                HTTPStatus.UNAUTHORIZED,
                {
                    "error": _error_body(
                        "invalid_api_key",
                        f"Incorrect API key provided: {_mask_key(key)}. "
                        f"You can find your API key at {_API_KEYS_URL}.",
                    )
                },
            )
        return None

    async def _handle(self, ws: ServerConnection) -> None:
        request = ws.request
        assert request is not None  # the handler only runs after a handshake
        headers = {name.lower(): value for name, value in request.headers.raw_items()}
        models = parse_qs(urlsplit(request.path).query).get("model", [])
        record = MockSession(
            session_id=self._ids.new("sess"),
            model=models[0] if models else None,
            auth_header_present="authorization" in headers,
        )
        self.sessions.append(record)
        del self.sessions[: max(0, len(self.sessions) - MAX_SESSIONS_KEPT)]
        settings = _Settings(
            reject_auth=self.reject_auth and self.auth_rejection == "in_band",
            marker_tool=self.marker_tool,
            encoded_reply=self._encoded_reply,
            take_scripted_call=self._take_scripted_call,
        )
        protocol = _RealtimeProtocol(record, self._ids, settings)
        self._connections.add(ws)
        logger.info("MOCK realtime: session %s opened (model %s)", record.session_id, record.model)
        try:
            await _ConnectionRunner(ws, protocol, self.speed).run(headers)
        finally:
            self._connections.discard(ws)
            record.closed = True
            record.close_code = ws.close_code
            logger.info(
                "MOCK realtime: session %s closed (code %s)", record.session_id, record.close_code
            )


# --- standalone entry point -----------------------------------------------------------


async def _serve_until_signalled(server: MockRealtimeServer, host: str, port: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM)
    for signum in signals:
        loop.add_signal_handler(signum, stop.set)
    try:
        await server.start(host, port)
        print("MOCK OpenAI Realtime server (offline, not OpenAI)", flush=True)
        print(server.websocket_base_url, flush=True)
        await stop.wait()
    finally:
        await server.stop()
        for signum in signals:
            loop.remove_signal_handler(signum)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the mock until SIGINT/SIGTERM; prints a MOCK banner, then its base URL."""
    parser = argparse.ArgumentParser(
        prog="python -m rutster.tools.realtime_mock_server",
        description="MOCK OpenAI Realtime (GA) server for offline development. Not OpenAI.",
    )
    parser.add_argument("--host", default=DEFAULT_HOST, help="listen address (default loopback)")
    parser.add_argument("--port", type=int, default=0, help="listen port (0: any free port)")
    parser.add_argument("--reply-ms", type=int, default=DEFAULT_REPLY_MS, help="reply length")
    parser.add_argument("--reply-wav", type=Path, help="reply with this mono 16-bit WAV instead")
    parser.add_argument("--speed", type=float, default=DEFAULT_SPEED, help="x real time")
    parser.add_argument("--reject-auth", action="store_true", help="refuse every API key")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    try:
        server = MockRealtimeServer(
            reply_ms=args.reply_ms,
            reply_wav=args.reply_wav,
            speed=args.speed,
            reject_auth=args.reject_auth,
        )
    except ValueError as exc:  # MockServerConfigError, ReplyWavError
        print(f"mock_server: {exc}", file=sys.stderr)
        return 2
    asyncio.run(_serve_until_signalled(server, args.host, args.port))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
