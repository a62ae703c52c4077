"""The tap protocol v1 codec, shared by the gateway core and every brain.

Sans-I/O: this module turns events into JSON text frames and back, and does
nothing else. Time comes in as an argument (``now_ms``); sockets, logging and
metrics belong to the callers. The contract is ``docs/TAP_PROTOCOL.md``; the
golden fixtures under ``tests/fixtures/tap/`` pin the wire format.

Byte order: ``pcm`` payloads are signed 16-bit **little-endian** on the wire,
and the bytes in :class:`AudioIn` / :class:`AudioOut` are those same s16le
bytes. The codec never byte-swaps, so big-endian hosts are unsupported (the
media layer also assumes a little-endian host).
"""

from __future__ import annotations

import binascii
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NoReturn, TypeAlias

from rutster.media.formats import CANONICAL_FRAME_SAMPLES, CANONICAL_SAMPLE_RATE, SAMPLE_WIDTH
from rutster.protocols.ingress import DTMF_DIGITS

#: Protocol version carried in every envelope's ``v`` (TAP_PROTOCOL.md, v1).
TAP_VERSION = 1
#: Samples in every ``audio_in``: one 20 ms canonical frame (TAP_PROTOCOL.md).
AUDIO_IN_SAMPLES = CANONICAL_FRAME_SAMPLES
#: Bytes of s16le PCM in every ``audio_in``.
AUDIO_IN_BYTES = AUDIO_IN_SAMPLES * SAMPLE_WIDTH
#: Smallest ``audio_out``: one whole sample (TAP_PROTOCOL.md: 1 … 24,000).
MIN_AUDIO_OUT_SAMPLES = 1
#: Largest ``audio_out``: one second at 24 kHz (TAP_PROTOCOL.md: 1 … 24,000).
MAX_AUDIO_OUT_SAMPLES = CANONICAL_SAMPLE_RATE
#: Largest tap frame either peer accepts, used as websockets ``max_size``.
#: The biggest legitimate frame is a full ``audio_out``: 48,000 PCM bytes are
#: 64,000 base64 characters plus an envelope of ~150 bytes; 128 KiB leaves
#: 2x margin for a large ``tools.update`` catalog (seed decision).
MAX_MESSAGE_BYTES = 128 * 1024
#: Longest ``type`` string accepted, known or not: ours are ≤ 20 characters,
#: and an unknown type is logged by callers, so a huge one must not get that far.
MAX_TYPE_CHARS = 64
#: Longest id a brain may give a tool call or an audio item (``function_call.id``,
#: ``audio_out.item``) and the core echoes back (``function_call_output.id``,
#: ``speech_started.item``). OpenAI's call ids are ~30 characters; 256 of the
#: widest JSON escape (6 bytes) keep every reply far inside MAX_MESSAGE_BYTES.
#: Seed decision: an id of 30,000 "é" was accepted and its 180 KB reply could
#: not be sent (issue 14, finding 9).
MAX_ID_CHARS = 256
#: Tool names: OpenAI's function-name rule (``^[a-zA-Z0-9_-]{1,64}$``), so a
#: catalog is valid for the realtime brain and safe as a metrics label.
TOOL_NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: ``hello.audio`` values fixed by v1 (canonical audio, docs/ARCHITECTURE.md).
AUDIO_FORMAT_PCM_S16LE = "pcm_s16le"
AUDIO_CHANNELS = 1

#: Any JSON value (``function_call_output.result``). Read-only container types
#: so a caller's ``dict[str, int]`` is accepted as-is.
JSON: TypeAlias = "bool | int | float | str | Sequence[JSON] | Mapping[str, JSON] | None"


class Direction(StrEnum):
    """Which way a message travels; the values name the fixture folders."""

    CORE_TO_BRAIN = "core_to_brain"
    BRAIN_TO_CORE = "brain_to_core"


class ToolStatus(StrEnum):
    """Outcome of a tool call in ``function_call_output``."""

    OK = "ok"
    ERROR = "error"
    NOT_IMPLEMENTED = "not_implemented"
    REJECTED = "rejected"


class SessionEndReason(StrEnum):
    """Why the core ended the session (``session_end.reason``)."""

    CALLER_HANGUP = "caller_hangup"
    HANGUP_TOOL = "hangup_tool"
    API_HANGUP = "api_hangup"
    BUDGET_EXHAUSTED = "budget_exhausted"
    MAX_DURATION = "max_duration"
    ERROR = "error"
    SHUTDOWN = "shutdown"
    #: The ``transfer`` tool handed the caller to another line (additive in v1).
    TRANSFERRED = "transferred"


class TurnOwner(StrEnum):
    """Who decides the caller's turns (the brain's ``hello.turns``, additive in v1)."""

    #: The core's reflex loop: VAD, ``speech_started``/``speech_stopped``, barge-in.
    CORE = "core"
    #: A full-duplex brain that listens while it speaks and takes turns itself.
    BRAIN = "brain"


#: The brain ``hello`` fields that declare how the brain behaves, in wire order
#: (TAP_PROTOCOL.md, "Brains that say what they are"); top-level, next to ``brain``.
BRAIN_DECLARATIONS = ("interruptible", "turns")
#: ``hello.interruptible`` when absent or not a boolean: caller speech may cut
#: the brain (TAP_PROTOCOL.md; the behaviour of every brain before the field).
DEFAULT_INTERRUPTIBLE = True
#: ``hello.turns`` when absent or unknown: the core decides turns
#: (TAP_PROTOCOL.md; the behaviour of every brain before the field).
DEFAULT_TURNS = TurnOwner.CORE


class TapErrorReason(StrEnum):
    """The stable, low-cardinality labels :class:`TapProtocolError` uses."""

    TOO_LARGE = "too_large"
    BAD_UTF8 = "bad_utf8"
    MALFORMED_JSON = "malformed_json"
    NOT_AN_OBJECT = "not_an_object"
    BAD_ENVELOPE = "bad_envelope"
    BAD_VERSION = "bad_version"
    BAD_FIELD = "bad_field"
    BAD_BASE64 = "bad_base64"
    BAD_AUDIO_LENGTH = "bad_audio_length"
    UNSUPPORTED_AUDIO = "unsupported_audio"


class TapProtocolError(ValueError):
    """A tap message that breaks the protocol (or an event that cannot be sent).

    ``reason`` is a short stable label (see :class:`TapErrorReason`) for
    metrics; the message is for logs and never contains audio or long values.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


# ---- events: core -> brain ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class CallInfo:
    """The call a session belongs to (``hello.call``); ``from_`` is wire ``from``."""

    id: str
    direction: str  # "in" | "out" (protocols.ingress.CallDirection values)
    from_: str
    to: str
    provider: str


@dataclass(frozen=True, slots=True)
class AudioSpec:
    """The audio format of the session (``hello.audio``); fixed in v1."""

    format: str = AUDIO_FORMAT_PCM_S16LE
    sample_rate: int = CANONICAL_SAMPLE_RATE
    channels: int = AUDIO_CHANNELS
    frame_samples: int = AUDIO_IN_SAMPLES


@dataclass(frozen=True, slots=True)
class Hello:
    """First message on every connection; ``resume`` after a reconnect."""

    session_id: str
    resume: bool
    call: CallInfo
    audio: AudioSpec = AudioSpec()


@dataclass(frozen=True, slots=True)
class AudioIn:
    """20 ms of caller audio: exactly 480 samples of s16le PCM (960 bytes)."""

    pcm: bytes


@dataclass(frozen=True, slots=True)
class SpeechStarted:
    """The core's VAD heard the caller start; maybe it cut assistant audio."""

    interrupted: bool = False
    item: str | None = None
    played_ms: int | None = None


@dataclass(frozen=True, slots=True)
class SpeechStopped:
    """The core decided the caller's turn is over: the brain should answer."""


@dataclass(frozen=True, slots=True)
class Dtmf:
    """A keypad digit from the caller (one of :data:`DTMF_DIGITS`)."""

    digit: str


@dataclass(frozen=True, slots=True)
class FunctionCallOutput:
    """The core's answer to a ``function_call`` with the same ``id``."""

    id: str
    status: ToolStatus
    result: JSON


@dataclass(frozen=True, slots=True)
class SessionEnd:
    """The call is over; the core closes the socket after this."""

    reason: SessionEndReason


# ---- events: brain -> core ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class BrainHello:
    """The brain's answer to ``hello`` (wire type ``hello``, field ``brain``).

    ``interruptible`` and ``turns`` are the brain's declarations (top-level
    ``hello`` fields, additive in v1): absent ones read as the defaults. A
    present value the decoder does not understand (a ``turns`` it does not
    know, an ``interruptible`` that is not a boolean) also reads as the
    default, never as an error, and its field name is listed in ``ignored``
    (in :data:`BRAIN_DECLARATIONS` order) so the core can count it. The
    encoder always writes both declarations and never ``ignored``.
    """

    name: str
    version: str
    interruptible: bool = DEFAULT_INTERRUPTIBLE
    turns: TurnOwner = DEFAULT_TURNS
    ignored: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One tool of the brain's catalog; ``parameters`` is a JSON Schema object."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolsUpdate:
    """The brain's whole tool catalog (wire type ``tools.update``)."""

    tools: tuple[ToolSpec, ...]


@dataclass(frozen=True, slots=True)
class AudioOut:
    """Assistant audio: 1 … 24,000 samples of s16le PCM, ``item`` names its response."""

    pcm: bytes
    item: str | None = None


@dataclass(frozen=True, slots=True)
class AudioClear:
    """The brain dropped its pending answer: flush unplayed assistant audio."""


@dataclass(frozen=True, slots=True)
class FunctionCall:
    """The brain proposes a tool call; ``args`` is a JSON object."""

    id: str
    name: str
    args: dict[str, Any]


@dataclass(frozen=True, slots=True)
class AdvisorySpeechStarted:
    """The brain's own VAD heard speech start (wire ``speech_started``); advisory."""


@dataclass(frozen=True, slots=True)
class AdvisorySpeechStopped:
    """The brain's own VAD heard speech stop (wire ``speech_stopped``); advisory."""


@dataclass(frozen=True, slots=True)
class Usage:
    """Upstream consumption for the spend gate; every field is optional."""

    model: str | None = None
    input_audio_tokens: int | None = None
    output_audio_tokens: int | None = None
    input_text_tokens: int | None = None
    output_text_tokens: int | None = None
    cached_input_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class BrainError:
    """A brain-side problem (wire type ``error``); the call stays up."""

    code: str
    message: str


@dataclass(frozen=True, slots=True)
class Bye:
    """The brain is closing its side."""

    reason: str


@dataclass(frozen=True, slots=True)
class UnknownTapEvent:
    """A well-formed message of a type unknown in its direction.

    Returned (not raised) by :meth:`TapDecoder.decode` so callers log, count
    and drop it: forward compatibility, never a reason to close.
    """

    type: str


CoreEvent: TypeAlias = (
    Hello | AudioIn | SpeechStarted | SpeechStopped | Dtmf | FunctionCallOutput | SessionEnd
)
BrainEvent: TypeAlias = (
    BrainHello
    | ToolsUpdate
    | AudioOut
    | AudioClear
    | FunctionCall
    | AdvisorySpeechStarted
    | AdvisorySpeechStopped
    | Usage
    | BrainError
    | Bye
)
TapEvent: TypeAlias = CoreEvent | BrainEvent


#: ``hello.audio`` must carry exactly these values (type included) in v1.
_V1_AUDIO: dict[str, str | int] = {
    "format": AUDIO_FORMAT_PCM_S16LE,
    "sample_rate": CANONICAL_SAMPLE_RATE,
    "channels": AUDIO_CHANNELS,
    "frame_samples": AUDIO_IN_SAMPLES,
}


# ---- field validation (run by the decoder, and by the encoder before sending)


def _fail(reason: TapErrorReason, message: str) -> NoReturn:
    raise TapProtocolError(reason, message)


def _field_error(msg_type: str, parent: str, key: str, expected: str) -> NoReturn:
    name = f"{parent}.{key}" if parent else key
    _fail(TapErrorReason.BAD_FIELD, f"{msg_type}: field {name!r} must be {expected}")


def _req_str(
    obj: Mapping[str, Any], msg_type: str, key: str, *, nonempty: bool = False, parent: str = ""
) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or (nonempty and not value):
        _field_error(msg_type, parent, key, "a non-empty string" if nonempty else "a string")
    return value


def _is_id(value: object) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_ID_CHARS


def _req_id(obj: Mapping[str, Any], msg_type: str, key: str) -> str:
    """A non-empty id of at most MAX_ID_CHARS characters."""
    value = obj.get(key)
    if not _is_id(value):
        _field_error(msg_type, "", key, f"a string of 1..{MAX_ID_CHARS} characters")
    return str(value)


def _opt_id(obj: Mapping[str, Any], msg_type: str, key: str) -> str | None:
    """A nullable id: absent or null reads as None; else as :func:`_req_id`."""
    value = obj.get(key)
    if value is not None and not _is_id(value):
        _field_error(msg_type, "", key, f"null or a string of 1..{MAX_ID_CHARS} characters")
    return None if value is None else str(value)


def _opt_str(obj: Mapping[str, Any], msg_type: str, key: str) -> str | None:
    """A nullable string: absent or null reads as None; "" is refused (ambiguous)."""
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        _field_error(msg_type, "", key, "a non-empty string or null")
    return value


def _req_bool(obj: Mapping[str, Any], msg_type: str, key: str) -> bool:
    value = obj.get(key)
    if type(value) is not bool:
        _field_error(msg_type, "", key, "a boolean")
    return value


def _opt_count(obj: Mapping[str, Any], msg_type: str, key: str) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    # type() rather than isinstance(): JSON true must not pass as the count 1.
    if type(value) is not int or value < 0:
        _field_error(msg_type, "", key, "an integer >= 0 or null")
    return value


def _req_object(obj: Mapping[str, Any], msg_type: str, key: str) -> dict[str, Any]:
    value = obj.get(key)
    if not isinstance(value, dict):
        _field_error(msg_type, "", key, "an object")
    return value


def _b64_chars(n_bytes: int) -> int:
    """Length of the canonical (padded) base64 text of ``n_bytes`` bytes."""
    return 4 * ((n_bytes + 2) // 3)


def _parse_pcm(obj: Mapping[str, Any], msg_type: str, min_samples: int, max_samples: int) -> bytes:
    samples = obj.get("samples")
    if type(samples) is not int:
        _field_error(msg_type, "", "samples", "an integer")
    if not min_samples <= samples <= max_samples:
        _fail(
            TapErrorReason.BAD_AUDIO_LENGTH,
            f"{msg_type}: samples={samples} outside {min_samples}..{max_samples}",
        )
    text = obj.get("pcm")
    if type(text) is not str:
        _field_error(msg_type, "", "pcm", "a base64 string")
    try:
        pcm = binascii.a2b_base64(text, strict_mode=True)
    except ValueError:  # binascii.Error, or a non-ASCII str
        _fail(TapErrorReason.BAD_BASE64, f"{msg_type}: pcm is not strict base64")
    if len(pcm) != samples * SAMPLE_WIDTH:
        _fail(
            TapErrorReason.BAD_AUDIO_LENGTH,
            f"{msg_type}: pcm holds {len(pcm)} bytes but samples={samples} "
            f"needs {samples * SAMPLE_WIDTH}",
        )
    if len(text) != _b64_chars(len(pcm)):  # strict_mode still lets "AAAA====" through
        _fail(TapErrorReason.BAD_BASE64, f"{msg_type}: pcm has excess base64 padding")
    return pcm


# ---- core -> brain parsers ---------------------------------------------------


def _parse_hello(obj: Mapping[str, Any]) -> Hello:
    session_id = _req_str(obj, "hello", "session_id", nonempty=True)
    resume = _req_bool(obj, "hello", "resume")
    call = _req_object(obj, "hello", "call")
    direction = call.get("direction")
    if direction not in ("in", "out"):
        _field_error("hello", "call", "direction", '"in" or "out"')
    info = CallInfo(
        id=_req_str(call, "hello", "id", nonempty=True, parent="call"),
        direction=direction,
        from_=_req_str(call, "hello", "from", parent="call"),
        to=_req_str(call, "hello", "to", parent="call"),
        provider=_req_str(call, "hello", "provider", nonempty=True, parent="call"),
    )
    audio = _req_object(obj, "hello", "audio")
    for key, want in _V1_AUDIO.items():
        got = audio.get(key)
        # Type included: 24000.0 or true are not the v1 values.
        if type(got) is not type(want) or got != want:
            _fail(TapErrorReason.UNSUPPORTED_AUDIO, f"hello: audio.{key} must be {want!r} in v1")
    return Hello(session_id=session_id, resume=resume, call=info, audio=AudioSpec())


def _parse_audio_in(obj: Mapping[str, Any]) -> AudioIn:
    return AudioIn(_parse_pcm(obj, "audio_in", AUDIO_IN_SAMPLES, AUDIO_IN_SAMPLES))


def _parse_speech_started(obj: Mapping[str, Any]) -> SpeechStarted:
    return SpeechStarted(
        interrupted=_req_bool(obj, "speech_started", "interrupted"),
        item=_opt_id(obj, "speech_started", "item"),
        played_ms=_opt_count(obj, "speech_started", "played_ms"),
    )


def _parse_speech_stopped(obj: Mapping[str, Any]) -> SpeechStopped:
    return SpeechStopped()


def _parse_dtmf(obj: Mapping[str, Any]) -> Dtmf:
    digit = obj.get("digit")
    if not isinstance(digit, str) or digit not in DTMF_DIGITS:
        _field_error("dtmf", "", "digit", "one of 0-9 * # A-D")
    return Dtmf(digit)


def _parse_function_call_output(obj: Mapping[str, Any]) -> FunctionCallOutput:
    call_id = _req_id(obj, "function_call_output", "id")
    status = obj.get("status")
    if not isinstance(status, str):
        _field_error("function_call_output", "", "status", "a string")
    try:
        tool_status = ToolStatus(status)
    except ValueError:
        _field_error("function_call_output", "", "status", "ok, error, not_implemented or rejected")
    # "result" may be any JSON value, null included; an absent one reads as null.
    return FunctionCallOutput(id=call_id, status=tool_status, result=obj.get("result"))


def _parse_session_end(obj: Mapping[str, Any]) -> SessionEnd:
    reason = obj.get("reason")
    if not isinstance(reason, str):
        _field_error("session_end", "", "reason", "a string")
    try:
        return SessionEnd(SessionEndReason(reason))
    except ValueError:
        _field_error("session_end", "", "reason", "a known session_end reason")


# ---- brain -> core parsers ---------------------------------------------------


#: ``hello.turns`` values this codec understands.
_TURN_OWNERS = frozenset(owner.value for owner in TurnOwner)


def _parse_brain_hello(obj: Mapping[str, Any]) -> BrainHello:
    brain = _req_object(obj, "hello", "brain")
    name = _req_str(brain, "hello", "name", nonempty=True, parent="brain")
    version = _req_str(brain, "hello", "version", parent="brain")
    # The declarations are lenient on purpose: a value from a newer brain (or
    # a buggy one) must not cost the call its brain, so it reads as the default.
    ignored: list[str] = []
    interruptible = DEFAULT_INTERRUPTIBLE
    if "interruptible" in obj:
        value = obj["interruptible"]
        if type(value) is bool:
            interruptible = value
        else:
            ignored.append("interruptible")
    turns = DEFAULT_TURNS
    if "turns" in obj:
        value = obj["turns"]
        if type(value) is str and value in _TURN_OWNERS:
            turns = TurnOwner(value)
        else:
            ignored.append("turns")
    return BrainHello(
        name=name,
        version=version,
        interruptible=interruptible,
        turns=turns,
        ignored=tuple(ignored),
    )


def _parse_tools_update(obj: Mapping[str, Any]) -> ToolsUpdate:
    tools = obj.get("tools")
    if type(tools) is not list:
        _field_error("tools.update", "", "tools", "an array")
    specs: list[ToolSpec] = []
    seen: set[str] = set()
    for index, tool in enumerate(tools):
        where = f"tools[{index}]"
        if not isinstance(tool, dict):
            _field_error("tools.update", "", where, "an object")
        name = tool.get("name")
        if not isinstance(name, str) or not TOOL_NAME_PATTERN.fullmatch(name):
            _field_error("tools.update", where, "name", "1-64 characters of [A-Za-z0-9_-]")
        if name in seen:
            _field_error("tools.update", where, "name", "unique in the catalog")
        seen.add(name)
        description = _req_str(tool, "tools.update", "description", parent=where)
        parameters = tool.get("parameters")
        # JSON Schema sanity only; the gateway's tool registry validates calls.
        if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
            _field_error("tools.update", where, "parameters", 'a JSON Schema of type "object"')
        specs.append(ToolSpec(name=name, description=description, parameters=parameters))
    return ToolsUpdate(tuple(specs))


def _parse_audio_out(obj: Mapping[str, Any]) -> AudioOut:
    pcm = _parse_pcm(obj, "audio_out", MIN_AUDIO_OUT_SAMPLES, MAX_AUDIO_OUT_SAMPLES)
    return AudioOut(pcm, _opt_id(obj, "audio_out", "item"))


def _parse_audio_clear(obj: Mapping[str, Any]) -> AudioClear:
    return AudioClear()


def _parse_function_call(obj: Mapping[str, Any]) -> FunctionCall:
    # The name is only checked to be a string: an unknown name must still
    # reach the core, which answers not_implemented for this id.
    return FunctionCall(
        id=_req_id(obj, "function_call", "id"),
        name=_req_str(obj, "function_call", "name"),
        args=_req_object(obj, "function_call", "args"),
    )


def _parse_advisory_speech_started(obj: Mapping[str, Any]) -> AdvisorySpeechStarted:
    return AdvisorySpeechStarted()


def _parse_advisory_speech_stopped(obj: Mapping[str, Any]) -> AdvisorySpeechStopped:
    return AdvisorySpeechStopped()


def _parse_usage(obj: Mapping[str, Any]) -> Usage:
    return Usage(
        model=_opt_str(obj, "usage", "model"),
        input_audio_tokens=_opt_count(obj, "usage", "input_audio_tokens"),
        output_audio_tokens=_opt_count(obj, "usage", "output_audio_tokens"),
        input_text_tokens=_opt_count(obj, "usage", "input_text_tokens"),
        output_text_tokens=_opt_count(obj, "usage", "output_text_tokens"),
        cached_input_tokens=_opt_count(obj, "usage", "cached_input_tokens"),
    )


def _parse_brain_error(obj: Mapping[str, Any]) -> BrainError:
    return BrainError(
        code=_req_str(obj, "error", "code", nonempty=True),
        message=_req_str(obj, "error", "message"),
    )


def _parse_bye(obj: Mapping[str, Any]) -> Bye:
    return Bye(_req_str(obj, "bye", "reason"))


_Parser: TypeAlias = Callable[[Mapping[str, Any]], TapEvent]

_PARSERS: dict[Direction, dict[str, _Parser]] = {
    Direction.CORE_TO_BRAIN: {
        "hello": _parse_hello,
        "audio_in": _parse_audio_in,
        "speech_started": _parse_speech_started,
        "speech_stopped": _parse_speech_stopped,
        "dtmf": _parse_dtmf,
        "function_call_output": _parse_function_call_output,
        "session_end": _parse_session_end,
    },
    Direction.BRAIN_TO_CORE: {
        "hello": _parse_brain_hello,
        "tools.update": _parse_tools_update,
        "audio_out": _parse_audio_out,
        "audio_clear": _parse_audio_clear,
        "function_call": _parse_function_call,
        "speech_started": _parse_advisory_speech_started,
        "speech_stopped": _parse_advisory_speech_stopped,
        "usage": _parse_usage,
        "error": _parse_brain_error,
        "bye": _parse_bye,
    },
}


# ---- bodies: event -> wire fields (everything but the envelope) -------------


def _hello_body(event: Hello) -> dict[str, Any]:
    call, audio = event.call, event.audio
    return {
        "session_id": event.session_id,
        "resume": event.resume,
        "call": {
            "id": call.id,
            "direction": call.direction,
            "from": call.from_,
            "to": call.to,
            "provider": call.provider,
        },
        "audio": {
            "format": audio.format,
            "sample_rate": audio.sample_rate,
            "channels": audio.channels,
            "frame_samples": audio.frame_samples,
        },
    }


def _speech_started_body(event: SpeechStarted) -> dict[str, Any]:
    # Always all three keys, null included: the brain never has to guess.
    return {"interrupted": event.interrupted, "item": event.item, "played_ms": event.played_ms}


def _no_body(event: object) -> dict[str, Any]:
    return {}


def _dtmf_body(event: Dtmf) -> dict[str, Any]:
    return {"digit": event.digit}


def _function_call_output_body(event: FunctionCallOutput) -> dict[str, Any]:
    return {"id": event.id, "status": event.status, "result": event.result}


def _session_end_body(event: SessionEnd) -> dict[str, Any]:
    return {"reason": event.reason}


def _brain_hello_body(event: BrainHello) -> dict[str, Any]:
    # The decoder would read a bad declaration as the default; a brain that
    # uses this codec gets told instead of silently losing its declaration.
    if type(event.interruptible) is not bool:
        _field_error("hello", "", "interruptible", "a boolean")
    if not isinstance(event.turns, str) or event.turns not in _TURN_OWNERS:
        _field_error("hello", "", "turns", '"core" or "brain"')
    # Always both declarations, defaults included: the core never has to guess.
    return {
        "brain": {"name": event.name, "version": event.version},
        "interruptible": event.interruptible,
        "turns": TurnOwner(event.turns).value,
    }


def _tools_update_body(event: ToolsUpdate) -> dict[str, Any]:
    return {
        "tools": [
            {"name": t.name, "description": t.description, "parameters": t.parameters}
            for t in event.tools
        ]
    }


def _function_call_body(event: FunctionCall) -> dict[str, Any]:
    return {"id": event.id, "name": event.name, "args": event.args}


#: Usage token counters, in wire order (all optional, all omitted when None).
_USAGE_TOKEN_FIELDS = (
    "input_audio_tokens",
    "output_audio_tokens",
    "input_text_tokens",
    "output_text_tokens",
    "cached_input_tokens",
)


def _usage_body(event: Usage) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if event.model is not None:
        body["model"] = event.model
    for key in _USAGE_TOKEN_FIELDS:
        value = getattr(event, key)
        if value is not None:
            body[key] = value
    return body


def _brain_error_body(event: BrainError) -> dict[str, Any]:
    return {"code": event.code, "message": event.message}


def _bye_body(event: Bye) -> dict[str, Any]:
    return {"reason": event.reason}


_BodyOf: TypeAlias = Callable[[Any], dict[str, Any]]

#: Every event class except the two audio ones (which have a fast path):
#: its wire type, its direction, and how to build its fields.
_ENCODERS: dict[type, tuple[str, Direction, _BodyOf]] = {
    Hello: ("hello", Direction.CORE_TO_BRAIN, _hello_body),
    SpeechStarted: ("speech_started", Direction.CORE_TO_BRAIN, _speech_started_body),
    SpeechStopped: ("speech_stopped", Direction.CORE_TO_BRAIN, _no_body),
    Dtmf: ("dtmf", Direction.CORE_TO_BRAIN, _dtmf_body),
    FunctionCallOutput: (
        "function_call_output",
        Direction.CORE_TO_BRAIN,
        _function_call_output_body,
    ),
    SessionEnd: ("session_end", Direction.CORE_TO_BRAIN, _session_end_body),
    BrainHello: ("hello", Direction.BRAIN_TO_CORE, _brain_hello_body),
    ToolsUpdate: ("tools.update", Direction.BRAIN_TO_CORE, _tools_update_body),
    AudioClear: ("audio_clear", Direction.BRAIN_TO_CORE, _no_body),
    FunctionCall: ("function_call", Direction.BRAIN_TO_CORE, _function_call_body),
    AdvisorySpeechStarted: ("speech_started", Direction.BRAIN_TO_CORE, _no_body),
    AdvisorySpeechStopped: ("speech_stopped", Direction.BRAIN_TO_CORE, _no_body),
    Usage: ("usage", Direction.BRAIN_TO_CORE, _usage_body),
    BrainError: ("error", Direction.BRAIN_TO_CORE, _brain_error_body),
    Bye: ("bye", Direction.BRAIN_TO_CORE, _bye_body),
}


def wire_type(event: TapEvent) -> str:
    """The wire ``type`` of ``event`` (e.g. ``"tools.update"``), for logs and metrics."""
    if isinstance(event, AudioIn):
        return "audio_in"
    if isinstance(event, AudioOut):
        return "audio_out"
    return _ENCODERS[type(event)][0]


def event_direction(event: TapEvent) -> Direction:
    """Which way ``event`` travels on the wire."""
    if isinstance(event, AudioIn):
        return Direction.CORE_TO_BRAIN
    if isinstance(event, AudioOut):
        return Direction.BRAIN_TO_CORE
    return _ENCODERS[type(event)][1]


# ---- encoder -----------------------------------------------------------------


class TapEncoder:
    """Turns events into tap text frames for one connection (one direction).

    ``seq`` counts from 0 per encoder; ``ts`` is ``int(now_ms - start_ms)``.
    Before a frame is produced, its fields go through the same checks the
    peer's :class:`TapDecoder` runs, so an event the peer would refuse raises
    :class:`TapProtocolError` here instead (and consumes no ``seq``).

    Hot-path cost, measured on the 2-core dev machine (CPython 3.11.7, 1,000
    distinct 480-sample frames, best of 5 x 100 passes): ``encode(AudioIn)``
    ≈ 1.2 µs, ``encode(AudioOut)`` with an item ≈ 1.7 µs per frame.
    """

    def __init__(self, start_ms: float) -> None:
        self.start_ms = start_ms
        self._seq = 0

    @property
    def next_seq(self) -> int:
        """The ``seq`` the next encoded frame will carry."""
        return self._seq

    def encode(self, event: TapEvent, now_ms: float) -> str:
        """One JSON text frame (ASCII only) carrying ``event``.

        Raises :class:`TapProtocolError` for an event the peer would refuse
        (wrong audio length, empty id, unknown digit, non-JSON result, frame
        over :data:`MAX_MESSAGE_BYTES`...) and ``TypeError`` for a non-event.
        """
        ts = int(now_ms - self.start_ms)
        # Audio first and hand-formatted: it is ~all of the traffic, and
        # base64 text and ints need no JSON escaping.
        if isinstance(event, AudioIn):
            if len(event.pcm) != AUDIO_IN_BYTES:
                _fail(
                    TapErrorReason.BAD_AUDIO_LENGTH,
                    f"audio_in: pcm is {len(event.pcm)} bytes, must be {AUDIO_IN_BYTES}",
                )
            seq = self._seq
            self._seq = seq + 1
            b64 = binascii.b2a_base64(event.pcm, newline=False).decode("ascii")
            return (
                f'{{"v":1,"type":"audio_in","seq":{seq},"ts":{ts},'
                f'"pcm":"{b64}","samples":{AUDIO_IN_SAMPLES}}}'
            )
        if isinstance(event, AudioOut):
            return self._encode_audio_out(event, ts)
        spec = _ENCODERS.get(type(event))
        if spec is None:
            raise TypeError(f"not a tap event: {type(event).__name__}")
        msg_type, direction, body_of = spec
        message: dict[str, Any] = {"v": TAP_VERSION, "type": msg_type, "seq": self._seq, "ts": ts}
        message.update(body_of(event))
        _PARSERS[direction][msg_type](message)  # the peer's checks, raised here
        try:
            text = json.dumps(message, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError, RecursionError) as exc:
            _fail(
                TapErrorReason.BAD_FIELD,
                f"{msg_type}: fields are not JSON-serialisable ({type(exc).__name__})",
            )
        if len(text) > MAX_MESSAGE_BYTES:  # ASCII: characters are bytes
            _fail(TapErrorReason.TOO_LARGE, f"{msg_type}: frame over {MAX_MESSAGE_BYTES} bytes")
        self._seq += 1
        return text

    def _encode_audio_out(self, event: AudioOut, ts: int) -> str:
        n_bytes = len(event.pcm)
        samples, odd = divmod(n_bytes, SAMPLE_WIDTH)
        if odd or not MIN_AUDIO_OUT_SAMPLES <= samples <= MAX_AUDIO_OUT_SAMPLES:
            _fail(
                TapErrorReason.BAD_AUDIO_LENGTH,
                f"audio_out: pcm is {n_bytes} bytes; need an even count of "
                f"{MIN_AUDIO_OUT_SAMPLES}..{MAX_AUDIO_OUT_SAMPLES} samples "
                "(split longer audio)",
            )
        item = ""
        if event.item is not None:
            if not isinstance(event.item, str) or not 0 < len(event.item) <= MAX_ID_CHARS:
                _field_error(
                    "audio_out", "", "item", f"null or a string of 1..{MAX_ID_CHARS} characters"
                )
            item = f',"item":{json.dumps(event.item)}'
        b64 = binascii.b2a_base64(event.pcm, newline=False).decode("ascii")
        text = (
            f'{{"v":1,"type":"audio_out","seq":{self._seq},"ts":{ts},'
            f'"pcm":"{b64}","samples":{samples}{item}}}'
        )
        if len(text) > MAX_MESSAGE_BYTES:  # only a pathological item gets here
            _fail(TapErrorReason.TOO_LARGE, f"audio_out: frame over {MAX_MESSAGE_BYTES} bytes")
        self._seq += 1
        return text


# ---- decoder -----------------------------------------------------------------


def _reject_constant(name: str) -> NoReturn:
    # Python's json reads NaN/Infinity by default; they are not JSON (RFC 8259 §6).
    raise ValueError(f"non-standard JSON constant {name}")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 would otherwise read as inf
        raise ValueError("number out of range")
    return value


_JSON_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)


class TapDecoder:
    """Parses tap frames travelling in one direction, for one connection.

    A brain decodes ``Direction.CORE_TO_BRAIN``; the core decodes
    ``Direction.BRAIN_TO_CORE``. A type unknown in that direction comes back
    as :class:`UnknownTapEvent`; anything malformed raises
    :class:`TapProtocolError`. Neither is a reason to close the connection.

    ``last_seq``/``last_ts`` are the envelope of the last well-formed frame;
    ``seq_gaps`` counts frames whose ``seq`` was not ``last_seq + 1`` (or 0
    for the first); ordering is not enforced.

    Hot-path cost, measured like :class:`TapEncoder`'s: ``decode`` of a
    480-sample ``audio_out`` ≈ 4.3 µs, of an ``audio_in`` ≈ 4.4 µs per frame
    (about 1.7 µs JSON parsing and 1.4 µs base64 of that; both are C code).
    """

    def __init__(self, direction: Direction) -> None:
        self.direction = direction
        self._parsers = _PARSERS[direction]
        self.last_seq: int | None = None
        self.last_ts: float | None = None
        self.seq_gaps = 0

    def decode(self, data: str | bytes) -> TapEvent | UnknownTapEvent:
        """Decode one frame (text, or its UTF-8 bytes) into an event."""
        if len(data) > MAX_MESSAGE_BYTES:
            _fail(TapErrorReason.TOO_LARGE, f"frame over {MAX_MESSAGE_BYTES} bytes")
        if isinstance(data, bytes):
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                _fail(TapErrorReason.BAD_UTF8, "frame is not valid UTF-8")
        else:
            text = data
            # str.isascii() is O(1) in CPython; only non-ASCII text needs counting.
            if not text.isascii() and len(text.encode("utf-8", "surrogatepass")) > (
                MAX_MESSAGE_BYTES
            ):
                _fail(TapErrorReason.TOO_LARGE, f"frame over {MAX_MESSAGE_BYTES} bytes")
        try:
            obj = _JSON_DECODER.decode(text)
        except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
            _fail(TapErrorReason.MALFORMED_JSON, "frame is not valid JSON")
        if type(obj) is not dict:
            _fail(TapErrorReason.NOT_AN_OBJECT, "frame is not a JSON object")

        version = obj.get("v")
        if type(version) is not int:
            _fail(TapErrorReason.BAD_ENVELOPE, "envelope: 'v' must be an integer")
        if version != TAP_VERSION:
            _fail(TapErrorReason.BAD_VERSION, f"envelope: unsupported version v={version}")
        msg_type = obj.get("type")
        if type(msg_type) is not str or not 0 < len(msg_type) <= MAX_TYPE_CHARS:
            _fail(
                TapErrorReason.BAD_ENVELOPE,
                f"envelope: 'type' must be a string of 1..{MAX_TYPE_CHARS} characters",
            )
        seq = obj.get("seq")
        if type(seq) is not int or seq < 0:
            _fail(TapErrorReason.BAD_ENVELOPE, "envelope: 'seq' must be an integer >= 0")
        ts = obj.get("ts")
        if type(ts) is not int and type(ts) is not float:
            _fail(TapErrorReason.BAD_ENVELOPE, "envelope: 'ts' must be a number")

        expected = 0 if self.last_seq is None else self.last_seq + 1
        if seq != expected:
            self.seq_gaps += 1
        self.last_seq = seq
        self.last_ts = ts

        parser = self._parsers.get(msg_type)
        if parser is None:
            return UnknownTapEvent(msg_type)
        return parser(obj)
