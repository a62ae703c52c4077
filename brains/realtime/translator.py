"""Tap protocol ↔ OpenAI Realtime (GA) event translation, with no I/O.

``RealtimeTranslator`` is the mapping table of ``docs/TAP_PROTOCOL.md`` as a
state machine, in the style of ``h11``: feed it a tap event from the core
(:meth:`from_core`) or an OpenAI server event as a JSON object
(:meth:`from_openai`) and it returns :class:`Actions` — OpenAI client events to
send and tap events for the core. Sockets, the SDK and time live in
``bridge.py`` (:class:`RealtimeBridge`).

State it keeps, and why:

- the response in flight, because the API allows one at a time
  (``conversation_already_has_active_response``) and ``response.cancel`` with
  none active is an error;
- how much audio each assistant item has sent, so a truncation never asks for
  more than exists (``audio_end_ms`` beyond the item is an ``invalid_value``
  error) and the ``played_ms`` the core reports is clamped;
- function calls held until their ``response.done``: the API emits
  ``response.function_call_arguments.done`` even for a response that is then
  cancelled (docs/PROVIDERS.md §5.3), and a cancelled proposal must never reach the
  core as an action;
- how much caller audio was appended since the last commit: committing less
  than 100 ms is an error (``input_audio_buffer_commit_empty``).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rutster.brains.realtime.config import RealtimeBrainConfig
from rutster.media.formats import CANONICAL_SAMPLE_RATE, SAMPLE_WIDTH
from rutster.protocols.tap import (
    MAX_AUDIO_OUT_SAMPLES,
    AdvisorySpeechStarted,
    AdvisorySpeechStopped,
    AudioIn,
    AudioOut,
    BrainError,
    BrainEvent,
    CoreEvent,
    Dtmf,
    FunctionCall,
    FunctionCallOutput,
    SpeechStarted,
    SpeechStopped,
    Usage,
)

log = logging.getLogger(__name__)

#: The tap's PCM is exactly the Realtime API's ``audio/pcm`` format: 16-bit LE mono
#: at 24 kHz (docs/PROVIDERS.md §5.2), so audio passes through without resampling.
REALTIME_AUDIO_FORMAT: dict[str, Any] = {"type": "audio/pcm", "rate": CANONICAL_SAMPLE_RATE}
#: The API refuses to commit less than 100 ms of audio ("buffer too small. Expected
#: at least 100ms of audio"; error code ``input_audio_buffer_commit_empty``).
MIN_COMMIT_MS = 100
#: Assistant items whose audio length is remembered for truncation. A call rarely
#: has more than a few dozen replies; older items can no longer be barged into.
MAX_TRACKED_ITEMS = 64
#: Longest upstream error text passed to the core: enough for OpenAI's messages,
#: bounded so an upstream cannot flood the core's log. Seed decision.
MAX_ERROR_MESSAGE_CHARS = 300
#: Tap error codes the brain sends the core (TAP_PROTOCOL.md, ``error``).
ERROR_UPSTREAM_DISCONNECT = "brain_upstream_disconnect"
ERROR_AUTH_FAILED = "brain_auth_failed"
ERROR_UPSTREAM = "brain_upstream_error"
#: OpenAI error codes that mean the key is bad: retrying cannot help.
AUTH_ERROR_CODES = frozenset({"invalid_api_key", "authentication_error", "insufficient_quota"})

_BYTES_PER_MS = CANONICAL_SAMPLE_RATE * SAMPLE_WIDTH // 1000
_MAX_OUT_BYTES = MAX_AUDIO_OUT_SAMPLES * SAMPLE_WIDTH


@dataclass
class Actions:
    """What one input produced: events for OpenAI and events for the core."""

    to_openai: list[dict[str, Any]] = field(default_factory=list)
    to_core: list[BrainEvent] = field(default_factory=list)

    def extend(self, other: Actions) -> None:
        """Append ``other``'s actions after this one's."""
        self.to_openai.extend(other.to_openai)
        self.to_core.extend(other.to_core)


def session_update(config: RealtimeBrainConfig) -> dict[str, Any]:
    """The ``session.update`` that opens every session (TAP_PROTOCOL.md mapping).

    ``turn_detection`` is ``None``: the gateway owns turns, so the model never
    decides on its own that the caller has finished or interrupts itself.
    """
    return {
        "type": "session.update",
        "session": {
            "type": "realtime",
            "model": config.model,
            "instructions": config.instructions,
            "output_modalities": ["audio"],
            "audio": {
                "input": {"format": dict(REALTIME_AUDIO_FORMAT), "turn_detection": None},
                "output": {"format": dict(REALTIME_AUDIO_FORMAT), "voice": config.voice},
            },
            "tools": [
                {
                    "type": "function",
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.parameters,
                }
                for tool in config.tools
            ],
            "tool_choice": "auto",
        },
    }


def _int_field(obj: Mapping[str, Any] | None, key: str) -> int | None:
    if not isinstance(obj, Mapping):
        return None
    value = obj.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def usage_from_response(response: Mapping[str, Any], model: str) -> Usage | None:
    """The tap ``usage`` for one ``response.done`` (docs/PROVIDERS.md §5.5); None without usage."""
    usage = response.get("usage")
    if not isinstance(usage, Mapping):
        return None
    details_in = usage.get("input_token_details")
    details_out = usage.get("output_token_details")
    return Usage(
        model=model,
        input_audio_tokens=_int_field(details_in, "audio_tokens"),
        output_audio_tokens=_int_field(details_out, "audio_tokens"),
        input_text_tokens=_int_field(details_in, "text_tokens"),
        output_text_tokens=_int_field(details_out, "text_tokens"),
        cached_input_tokens=_int_field(details_in, "cached_tokens"),
    )


class RealtimeTranslator:
    """One Realtime session's translation state (see the module docstring).

    Counters for logs and tests: ``unknown_openai_events``, ``bad_openai_events``,
    ``dropped_function_calls`` (held calls of a cancelled response).
    """

    def __init__(self, config: RealtimeBrainConfig) -> None:
        self.config = config
        self.active_response: str | None = None
        self._response_requested = False
        self._respond_after_done = False
        self._appended_bytes = 0
        self._item_bytes: OrderedDict[str, int] = OrderedDict()
        self._held_calls: dict[str, list[FunctionCall]] = {}
        self._odd_byte: dict[str, bytes] = {}
        self.unknown_openai_events = 0
        self.bad_openai_events = 0
        self.dropped_function_calls = 0

    # ---- session lifecycle --------------------------------------------------

    def open_session(self) -> Actions:
        """Events that start (or restart, after an upstream reconnect) a session."""
        self.active_response = None
        self._response_requested = False
        self._respond_after_done = False
        self._appended_bytes = 0
        self._item_bytes.clear()
        self._held_calls.clear()
        self._odd_byte.clear()
        return Actions(to_openai=[session_update(self.config)])

    def item_audio_ms(self, item_id: str) -> int | None:
        """Milliseconds of audio the model has sent for ``item_id`` (None if unknown)."""
        n = self._item_bytes.get(item_id)
        return None if n is None else n // _BYTES_PER_MS

    # ---- core -> OpenAI -----------------------------------------------------

    def from_core(self, event: CoreEvent) -> Actions:
        """Translate one tap event from the core (``hello``/``session_end`` are the glue's)."""
        if isinstance(event, AudioIn):
            self._appended_bytes += len(event.pcm)
            audio = base64.b64encode(event.pcm).decode("ascii")
            return Actions(to_openai=[{"type": "input_audio_buffer.append", "audio": audio}])
        if isinstance(event, SpeechStopped):
            return self._end_of_turn()
        if isinstance(event, SpeechStarted):
            return self._speech_started(event)
        if isinstance(event, FunctionCallOutput):
            return self._function_call_output(event)
        if isinstance(event, Dtmf):
            # Not in the mapping table: the model hears keypad digits as a note in the
            # conversation, answered with the caller's next turn.
            item = {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": f"[caller pressed keypad digit {event.digit}]"}
                ],
            }
            return Actions(to_openai=[{"type": "conversation.item.create", "item": item}])
        return Actions()

    def _request_response(self) -> list[dict[str, Any]]:
        if self.active_response is not None or self._response_requested:
            self._respond_after_done = True
            return []
        self._response_requested = True
        return [{"type": "response.create"}]

    def _end_of_turn(self) -> Actions:
        actions = Actions()
        if self._appended_bytes < MIN_COMMIT_MS * _BYTES_PER_MS:
            # Too little audio to commit (an API error); drop it and keep listening.
            if self._appended_bytes:
                actions.to_openai.append({"type": "input_audio_buffer.clear"})
            self._appended_bytes = 0
            return actions
        if self.active_response is not None:
            # The core ended a new turn while an answer is still being generated:
            # that answer is stale, the new turn gets a fresh one.
            actions.to_openai.append({"type": "response.cancel"})
            self._respond_after_done = False
        self._appended_bytes = 0
        actions.to_openai.append({"type": "input_audio_buffer.commit"})
        if self.active_response is not None:
            self._respond_after_done = True
        else:
            actions.to_openai.extend(self._request_response())
        return actions

    def _speech_started(self, event: SpeechStarted) -> Actions:
        actions = Actions()
        if not event.interrupted:
            return actions
        if self.active_response is not None or self._response_requested:
            # Requested but not yet created still counts: the server handles events
            # in order, so by the time it reads the cancel that response is live.
            actions.to_openai.append({"type": "response.cancel"})
        self._respond_after_done = False
        if event.item is not None and event.item in self._item_bytes:
            sent_ms = self._item_bytes[event.item] // _BYTES_PER_MS
            played = max(0, min(event.played_ms or 0, sent_ms))
            actions.to_openai.append(
                {
                    "type": "conversation.item.truncate",
                    "item_id": event.item,
                    "content_index": 0,
                    "audio_end_ms": played,
                }
            )
        return actions

    def _function_call_output(self, event: FunctionCallOutput) -> Actions:
        output = json.dumps({"status": event.status.value, "result": event.result})
        item = {"type": "function_call_output", "call_id": event.id, "output": output}
        actions = Actions(to_openai=[{"type": "conversation.item.create", "item": item}])
        actions.to_openai.extend(self._request_response())
        return actions

    # ---- OpenAI -> core -----------------------------------------------------

    def from_openai(self, event: Mapping[str, Any]) -> Actions:
        """Translate one OpenAI server event (a parsed JSON object)."""
        kind = event.get("type")
        if kind == "response.output_audio.delta":
            return self._audio_delta(event)
        if kind == "response.created":
            response = event.get("response")
            rid = response.get("id") if isinstance(response, Mapping) else None
            self.active_response = rid if isinstance(rid, str) else "unknown"
            self._response_requested = False
            return Actions()
        if kind == "response.function_call_arguments.done":
            return self._function_call_done(event)
        if kind == "response.done":
            return self._response_done(event)
        if kind == "input_audio_buffer.speech_started":
            return Actions(to_core=[AdvisorySpeechStarted()])
        if kind == "input_audio_buffer.speech_stopped":
            return Actions(to_core=[AdvisorySpeechStopped()])
        if kind == "error":
            return self._error(event)
        if not isinstance(kind, str):
            self.bad_openai_events += 1
        elif kind not in _IGNORED_EVENTS:
            self.unknown_openai_events += 1
        return Actions()

    def _audio_delta(self, event: Mapping[str, Any]) -> Actions:
        item = event.get("item_id")
        delta = event.get("delta")
        if not isinstance(item, str) or not isinstance(delta, str):
            self.bad_openai_events += 1
            return Actions()
        try:
            pcm = base64.b64decode(delta, validate=True)
        except (binascii.Error, ValueError):
            self.bad_openai_events += 1
            return Actions()
        pcm = self._odd_byte.pop(item, b"") + pcm
        if len(pcm) % SAMPLE_WIDTH:
            self._odd_byte[item] = pcm[-1:]
            pcm = pcm[:-1]
        if not pcm:
            return Actions()
        self._item_bytes[item] = self._item_bytes.get(item, 0) + len(pcm)
        self._item_bytes.move_to_end(item)
        while len(self._item_bytes) > MAX_TRACKED_ITEMS:
            self._item_bytes.popitem(last=False)
        return Actions(
            to_core=[
                AudioOut(pcm[start : start + _MAX_OUT_BYTES], item=item)
                for start in range(0, len(pcm), _MAX_OUT_BYTES)
            ]
        )

    def _function_call_done(self, event: Mapping[str, Any]) -> Actions:
        call_id = event.get("call_id")
        name = event.get("name")
        response_id = event.get("response_id")
        if not isinstance(call_id, str) or not isinstance(name, str):
            self.bad_openai_events += 1
            return Actions()
        try:
            args = json.loads(event.get("arguments") or "{}")
        except (TypeError, ValueError):
            args = None
        if not isinstance(args, dict):
            # The model produced arguments that are not a JSON object: answer it
            # directly (the core could only reject them) and let it try again.
            output = json.dumps(
                {"status": "error", "result": {"error": "arguments must be a JSON object"}}
            )
            item = {"type": "function_call_output", "call_id": call_id, "output": output}
            return Actions(to_openai=[{"type": "conversation.item.create", "item": item}])
        key = response_id if isinstance(response_id, str) else (self.active_response or "")
        self._held_calls.setdefault(key, []).append(FunctionCall(call_id, name, args))
        return Actions()

    def _response_done(self, event: Mapping[str, Any]) -> Actions:
        actions = Actions()
        response = event.get("response")
        if not isinstance(response, Mapping):
            self.bad_openai_events += 1
            response = {}
        rid = response.get("id")
        status = response.get("status")
        usage = usage_from_response(response, self.config.model)
        if usage is not None:
            actions.to_core.append(usage)
        held = self._held_calls.pop(rid if isinstance(rid, str) else "", [])
        if rid == self.active_response or self.active_response == "unknown":
            self.active_response = None
        if status == "completed":
            actions.to_core.extend(held)
        elif held:
            self.dropped_function_calls += len(held)
            log.info(
                "realtime brain: dropped %d function call(s) of a %s response", len(held), status
            )
        self._held_calls.clear()  # anything left belonged to an older, finished response
        if self._respond_after_done and self.active_response is None:
            self._respond_after_done = False
            actions.to_openai.extend(self._request_response())
        return actions

    def _error(self, event: Mapping[str, Any]) -> Actions:
        error = event.get("error")
        error = error if isinstance(error, Mapping) else {}
        code = str(error.get("code") or error.get("type") or "unknown")[:64]
        message = str(error.get("message") or "")[:MAX_ERROR_MESSAGE_CHARS]
        if code == "conversation_already_has_active_response":
            # Our view of the response lifecycle was behind: ask again once it is done.
            self._response_requested = False
            self._respond_after_done = True
        elif code in ("response_cancel_not_active",):
            self.active_response = None
        tap_code = ERROR_AUTH_FAILED if code in AUTH_ERROR_CODES else ERROR_UPSTREAM
        return Actions(to_core=[BrainError(tap_code, f"{code}: {message}")])


#: Server events the translator knowingly ignores (progress and transcripts: the
#: brain stores no transcript, and the core needs none).
_IGNORED_EVENTS = frozenset(
    {
        "session.created",
        "session.updated",
        "conversation.created",
        "conversation.item.added",
        "conversation.item.done",
        "conversation.item.created",
        "conversation.item.deleted",
        "conversation.item.retrieved",
        "conversation.item.truncated",
        "conversation.item.input_audio_transcription.delta",
        "conversation.item.input_audio_transcription.completed",
        "conversation.item.input_audio_transcription.failed",
        "conversation.item.input_audio_transcription.segment",
        "input_audio_buffer.committed",
        "input_audio_buffer.cleared",
        "input_audio_buffer.timeout_triggered",
        "response.output_item.added",
        "response.output_item.done",
        "response.content_part.added",
        "response.content_part.done",
        "response.output_audio.done",
        "response.output_audio_transcript.delta",
        "response.output_audio_transcript.done",
        "response.output_text.delta",
        "response.output_text.done",
        "response.function_call_arguments.delta",
        "rate_limits.updated",
    }
)
