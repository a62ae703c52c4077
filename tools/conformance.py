"""The tap conformance kit: plays the core's side of tap v1 against any brain URL.

It proves the protocol is language-agnostic: point it at a brain written in
anything (``python -m rutster.tools.conformance ws://127.0.0.1:8083/node``) and it
reports PASS, FAIL or SKIP per rule. It dials the brain like the core does
(websockets, ``max_size`` 128 KiB, no compression), sends ``hello``, scripted
caller turns, a barge-in, a marker-tone turn, unknown events, a DTMF digit, a
resumed connection and ``session_end``, and decodes every message the brain
sends with the project's own :class:`~protocols.tap.TapDecoder`.

How the script behaves (so a brain author knows what to expect):

- Caller audio is a synthetic voiced signal (a 120 Hz harmonic series with a
  syllable-rate envelope; never the marker tone), sent as exactly 480-sample
  ``audio_in`` frames at :data:`AUDIO_PACE` times real time. Between turns the
  kit sends no audio at all (a real core streams silence), so any audio the
  brain sends after a barge-in is attributable to the interrupted item.
- A brain "answers" a turn if ``audio_out`` arrives after the turn began: a
  streaming brain (the echo brain) answers while the caller speaks, a
  turn-based one after ``speech_stopped``. Both pass ``answers-turn``.
- The brain's ``hello`` is optional (TAP_PROTOCOL.md): a brain that sends
  none still PASSes ``hello`` with the detail "brain sent no hello
  (optional)"; a malformed one FAILs it.
- The kit respects the brain's declarations (``hello.interruptible`` and
  ``hello.turns``, TAP_PROTOCOL.md "Brains that say what they are"), checked
  by ``hello-declarations``. For ``turns: "brain"`` it sends no
  ``speech_started``/``speech_stopped`` at all, as the core does; after each
  caller turn it streams silence (the core forwards all caller audio) and
  expects the brain to answer on its own, else ``answers-turn`` is SKIP. For
  ``interruptible: false`` (and for ``turns: "brain"``, since the core never
  cuts such a brain) ``barge-in`` is SKIP with the reason.
- A ``function_call`` outside ``tool-round-trip`` gets ``not_implemented``,
  as from a core with no such tool, so a brain waiting on it is not stuck.
- Without ``require_tool``, a brain that answers the marker-tone turn with
  audio and then stays quiet for :data:`TOOL_QUIET_S` is taken as having
  proposed no tool (SKIP), so the run stays short; with it, the kit waits the
  whole turn timeout.

Every step has a timeout, so a dead or silent brain gives FAIL, never a hang.
Rules are data (:data:`RULES`, name + coroutine); add one by appending.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import sys
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NoReturn, TypeVar

import numpy as np
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, UnknownType, best_match
from referencing.exceptions import Unresolvable
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, WebSocketException
from websockets.frames import CloseCode

from rutster.media.formats import (
    CANONICAL_FRAME_SAMPLES,
    CANONICAL_SAMPLE_RATE,
    FRAME_MS,
    SAMPLE_WIDTH,
    samples_to_ms,
)
from rutster.protocols.tap import (
    BRAIN_DECLARATIONS,
    MAX_MESSAGE_BYTES,
    AudioIn,
    AudioOut,
    BrainHello,
    Bye,
    CallInfo,
    CoreEvent,
    Direction,
    Dtmf,
    FunctionCall,
    FunctionCallOutput,
    Hello,
    SessionEnd,
    SessionEndReason,
    SpeechStarted,
    SpeechStopped,
    TapDecoder,
    TapEncoder,
    TapEvent,
    TapProtocolError,
    ToolStatus,
    ToolsUpdate,
    TurnOwner,
    UnknownTapEvent,
)
from rutster.tools.marker_tone import marker_tone_pcm

#: How long a brain may take to start answering a turn (or propose a tool).
#: Seed decision: a realtime brain's first audio usually comes within ~1 s of
#: ``response.create``; 5 s covers a slow upstream without stalling the run.
DEFAULT_TURN_TIMEOUT_S = 5.0
#: Opening handshake limit (seed decision: loopback or LAN brains open in ms).
CONNECT_TIMEOUT_S = 5.0
#: Closing handshake limit, as websockets ``close_timeout`` (seed decision).
CLOSE_TIMEOUT_S = 2.0
#: Wait for the pong to a liveness ping (seed decision, like CLOSE_TIMEOUT_S).
PING_TIMEOUT_S = 2.0
#: Wait for the brain's ``hello`` after ours (it is sent at once in practice;
#: a brain that sends none costs the run this much). Seed decision.
HELLO_WAIT_S = 1.0
#: Wait for ``tools.update`` after the hello rule: TAP_PROTOCOL.md says it is
#: "sent after hello", so it arrives in the same burst. Seed decision.
CATALOG_WAIT_S = 0.3
#: Caller audio goes out this many times faster than real time. The core
#: sends a frame every 20 ms; a brain must not depend on wall-clock arrival
#: (the network jitters anyway), and 2x halves the kit's run time.
AUDIO_PACE = 2.0
#: Length of the first caller turn (the brief: ~1.5 s of audio).
ACCEPT_AUDIO_MS = 1_500
#: Length of the later, short caller turns (seed decision: 20 frames).
SHORT_TURN_MS = 400
#: Voiced audio before and after the marker tone in the tool turn, so the
#: tone sits inside ordinary speech as it would on a call (seed decision).
TOOL_LEAD_MS = 200
#: Audio the brain may still send for an interrupted item after the
#: barge-in: frames already in flight on the socket (seed decision, 500 ms).
BARGE_IN_GRACE_MS = 500
#: How long, after the grace, the kit watches for audio of that item.
BARGE_IN_WATCH_MS = 500
#: Without ``require_tool``: an answered tool turn followed by this much
#: silence from the brain counts as "no tool call" (seed decision).
TOOL_QUIET_S = 0.5
#: How long the brain must stay up after the ``function_call_output``.
AFTER_TOOL_S = 0.3
#: Settle time before a "still connected?" check, so a brain that closes
#: in reaction to the last message is caught (seed decision).
SETTLE_S = 0.2
#: Before a new turn the kit waits for this much silence from the brain...
QUIET_S = 0.2
#: ...but no longer than this (a chatty brain must not stall the run).
QUIET_CAP_S = 2.0
#: After ``session_end``, time the brain gets to close by itself before the
#: kit closes (the core "closes the socket after this"). Seed decision.
SESSION_END_WAIT_S = 0.5
#: Every rule's hard limit is the turn timeout plus this (streaming, grace
#: windows and handshakes); it turns any unforeseen stall into a FAIL.
RULE_SLACK_S = 10.0
#: Poll interval for time-based conditions (e.g. "quiet for 0.5 s").
POLL_S = 0.05
#: The synthetic voice: fundamental (a typical male voice, 85-155 Hz; 2000 Hz
#: is not one of its harmonics, so the marker detector never fires on it)...
VOICE_F0_HZ = 120.0
#: ...harmonics up to 2.4 kHz, inside the telephone band...
VOICE_HARMONICS = 20
#: ...peak level 0.25 of full scale (~ -12 dBFS, a normal speaking level)...
VOICE_AMPLITUDE = 0.25
#: ...and a syllable-rate envelope (speech modulates at ~4 Hz).
VOICE_SYLLABLE_HZ = 4.0
#: The unknown event type the kit sends (must be ignored, TAP_PROTOCOL.md).
PROBE_TYPE = "x_conformance_probe"
#: Extra fields added to known events (unknown fields must be ignored).
PROBE_FIELDS: dict[str, Any] = {"x_conformance": {"probe": True, "list": [1, 2, 3]}}
#: The keypad digit of the dtmf rule.
PROBE_DIGIT = "5"
#: The ``result`` the kit returns for a valid tool call.
TOOL_RESULT: dict[str, Any] = {"ok": True, "by": "rutster tap conformance kit"}
#: Call info in the kit's ``hello``: NANP fictional numbers (555-0100..0199).
CALL_FROM = "+15555550100"
CALL_TO = "+15555550199"
CALL_PROVIDER = "conformance"
#: Exit status of :func:`main` when some rule failed (0 when none did).
EXIT_FAILED = 1
#: Exit status after Ctrl-C (shell convention: 128 + SIGINT).
EXIT_INTERRUPTED = 130
#: Longest rule detail kept: one readable line (jsonschema messages quote the
#: offending value, which could be long). Seed decision.
MAX_DETAIL_CHARS = 300
#: Width of the rule-name column in the printed report.
NAME_COLUMN = 16

_T = TypeVar("_T")

#: What dialling a brain can raise: refused/unreachable (OSError, TLS
#: included), a bad URL or handshake (WebSocketException, ValueError), or
#: CONNECT_TIMEOUT_S running out.
_DIAL_ERRORS = (OSError, WebSocketException, ValueError, TimeoutError)


class RuleStatus(StrEnum):
    """Outcome of one rule."""

    PASS = "pass"
    FAIL = "fail"
    SKIP = "skip"


@dataclass(frozen=True, slots=True)
class RuleResult:
    """One rule's outcome; ``detail`` says why, in one line."""

    name: str
    status: RuleStatus
    detail: str


@dataclass(frozen=True, slots=True)
class ConformanceReport:
    """Every rule's result, in the order they ran."""

    url: str
    rules: tuple[RuleResult, ...]

    @property
    def passed(self) -> bool:
        """True when no rule failed (SKIPs are allowed)."""
        return all(rule.status is not RuleStatus.FAIL for rule in self.rules)

    def result(self, name: str) -> RuleResult:
        """The result of rule ``name`` (``KeyError`` if it did not run)."""
        for rule in self.rules:
            if rule.name == name:
                return rule
        raise KeyError(name)


class _Outcome(Exception):
    """Ends a rule early with ``status`` (raised by helpers, caught by the runner)."""

    def __init__(self, status: RuleStatus, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


def _fail(detail: str) -> NoReturn:
    raise _Outcome(RuleStatus.FAIL, detail)


def _skip(detail: str) -> NoReturn:
    raise _Outcome(RuleStatus.SKIP, detail)


# ---- caller audio ---------------------------------------------------------------


def voiced_pcm(ms: int, *, sample_rate: int = CANONICAL_SAMPLE_RATE) -> bytes:
    """A speech-like voiced signal (not the marker tone) as PCM s16le mono."""
    n = sample_rate * ms // 1000
    t = np.arange(n, dtype=np.float64) / sample_rate
    wave = np.zeros(n, dtype=np.float64)
    for k in range(1, VOICE_HARMONICS + 1):  # a glottal-like 1/k spectrum
        wave += np.sin(2 * math.pi * k * VOICE_F0_HZ * t) / k
    envelope = 0.6 + 0.4 * np.sin(2 * math.pi * VOICE_SYLLABLE_HZ * t)
    wave *= envelope
    peak = float(np.max(np.abs(wave))) if n else 0.0
    if peak > 0.0:
        wave *= VOICE_AMPLITUDE / peak
    return (wave * 32767).astype("<i2").tobytes()


def _frames(pcm: bytes) -> list[bytes]:
    """``pcm`` cut into 480-sample frames, the last one padded with silence."""
    size = CANONICAL_FRAME_SAMPLES * SAMPLE_WIDTH
    return [pcm[i : i + size].ljust(size, b"\0") for i in range(0, len(pcm), size)]


# ---- one connection to the brain -------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Message:
    """One message from the brain: its event, or why it failed to decode."""

    at: float  # loop time, seconds
    event: TapEvent | UnknownTapEvent | None
    error: TapProtocolError | None
    raw_type: str | None  # best-effort ``type`` of a message that failed to decode


def _raw_type(data: str | bytes) -> str | None:
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        return None
    value = obj.get("type") if isinstance(obj, dict) else None
    return value if isinstance(value, str) else None


class BrainLink:
    """One WebSocket connection to the brain, seen from the core's side.

    A reader task decodes and records every message (``messages``); rules
    wait on that record. ``answer_tool_calls`` makes the reader reply
    ``not_implemented`` to any ``function_call`` (off while a rule handles
    them itself).
    """

    def __init__(self, ws: ClientConnection, label: str) -> None:
        self.ws = ws
        self.label = label
        self.messages: list[_Message] = []
        #: The raw JSON of every valid brain ``hello``, by message index: the
        #: decoded event cannot tell an absent declaration from a default one.
        self.raw_hellos: dict[int, dict[str, Any]] = {}
        self.decoder = TapDecoder(Direction.BRAIN_TO_CORE)
        self.seq_problems: list[str] = []
        self.binary_frames = 0
        self.closed = False
        self.answer_tool_calls = True
        self._loop = asyncio.get_running_loop()
        self._encoder = TapEncoder(start_ms=self._loop.time() * 1000.0)
        self._seq = 0
        self._send_lock = asyncio.Lock()
        self._arrival = asyncio.Event()
        self._reader = asyncio.create_task(self._read(), name=f"tap-conformance-{label}")

    @classmethod
    async def open(cls, url: str, label: str) -> BrainLink:
        """Dial ``url`` as the core does (128 KiB frames, no compression)."""
        ws = await connect(
            url,
            max_size=MAX_MESSAGE_BYTES,
            compression=None,
            open_timeout=CONNECT_TIMEOUT_S,
            close_timeout=CLOSE_TIMEOUT_S,
            ping_interval=None,  # the kit pings when it wants proof of life
        )
        return cls(ws, label)

    def now(self) -> float:
        """Loop time in seconds (the clock of ``_Message.at``)."""
        return self._loop.time()

    def mark(self) -> int:
        """Index of the next message: rules look at messages ``[mark:]``."""
        return len(self.messages)

    # -- sending --

    async def send(self, event: CoreEvent, extra: dict[str, Any] | None = None) -> None:
        """Encode and send ``event`` (plus unknown ``extra`` fields, if any)."""
        async with self._send_lock:
            text = self._encoder.encode(event, self.now() * 1000.0)
            # The kit keeps its own seq so raw probes fit in the same sequence.
            obj = json.loads(text)
            obj["seq"] = self._seq
            obj.update(extra or {})
            await self._send_text(obj)

    async def send_unknown(self, msg_type: str, fields: dict[str, Any]) -> None:
        """Send a well-enveloped message of a type the brain does not know."""
        async with self._send_lock:
            ts = int(self.now() * 1000.0 - self._encoder.start_ms)
            await self._send_text({"v": 1, "type": msg_type, "seq": self._seq, "ts": ts, **fields})

    async def _send_text(self, obj: dict[str, Any]) -> None:
        self._seq += 1
        await self.ws.send(json.dumps(obj, separators=(",", ":")))

    async def stream(self, pcm: bytes, extra_first: dict[str, Any] | None = None) -> int:
        """Send ``pcm`` as ``audio_in`` frames at :data:`AUDIO_PACE`; returns the frame count."""
        frames = _frames(pcm)
        interval = FRAME_MS / 1000.0 / AUDIO_PACE
        start = self.now()
        for index, frame in enumerate(frames):
            delay = start + index * interval - self.now()
            if delay > 0:
                await asyncio.sleep(delay)
            await self.send(AudioIn(frame), extra_first if index == 0 else None)
        return len(frames)

    # -- receiving --

    async def _read(self) -> None:
        try:
            async for data in self.ws:
                message = self._ingest(data)
                if self.answer_tool_calls and isinstance(message.event, FunctionCall):
                    await self.send(
                        FunctionCallOutput(
                            message.event.id,
                            ToolStatus.NOT_IMPLEMENTED,
                            {"error": "the conformance kit only runs tools in tool-round-trip"},
                        )
                    )
        except ConnectionClosed:
            pass
        finally:
            self.closed = True
            self._arrival.set()

    def _ingest(self, data: str | bytes) -> _Message:
        if isinstance(data, bytes):
            self.binary_frames += 1  # tap is text frames; decoded anyway, counted
        previous, gaps = self.decoder.last_seq, self.decoder.seq_gaps
        try:
            message = _Message(self.now(), self.decoder.decode(data), None, None)
        except TapProtocolError as exc:
            message = _Message(self.now(), None, exc, _raw_type(data))
        if isinstance(message.event, BrainHello):  # rare: parse it a second time
            self.raw_hellos[len(self.messages)] = json.loads(data)
        if self.decoder.seq_gaps > gaps:
            expected = 0 if previous is None else previous + 1
            self.seq_problems.append(f"seq {self.decoder.last_seq} where {expected} was due")
        self.messages.append(message)
        self._arrival.set()
        return message

    async def wait_until(self, check: Callable[[], bool], timeout_s: float) -> bool:
        """Wait until ``check()`` holds, the link closes, or ``timeout_s`` passes."""
        deadline = self.now() + timeout_s
        while True:
            if check():
                return True
            remaining = deadline - self.now()
            if self.closed or remaining <= 0:
                return False
            self._arrival.clear()
            # POLL_S bound: some checks depend on time, not only on arrivals.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrival.wait(), min(remaining, POLL_S))

    async def pause(self, seconds: float) -> None:
        """Sleep ``seconds``, or less if the link closes meanwhile."""
        await self.wait_until(lambda: False, seconds)

    async def wait_quiet(self, quiet_s: float, cap_s: float) -> None:
        """Wait until the brain has sent nothing for ``quiet_s`` (at most ``cap_s``)."""
        start = self.now()

        def quiet() -> bool:
            last = self.messages[-1].at if self.messages else start
            return self.now() - max(last, start) >= quiet_s

        await self.wait_until(quiet, cap_s)

    async def alive(self, settle_s: float = 0.0) -> str | None:
        """None if the brain is still connected (answers a ping), else why not."""
        if settle_s > 0:
            await self.pause(settle_s)
        if self.closed:
            return self.describe_close()
        try:
            pong = await self.ws.ping()
            await asyncio.wait_for(pong, PING_TIMEOUT_S)
        except ConnectionClosed:
            return self.describe_close()
        except TimeoutError:
            return f"no pong within {PING_TIMEOUT_S:g} s"
        return None

    def describe_close(self) -> str:
        """How the connection ended, for a FAIL detail."""
        protocol = self.ws.protocol
        rcvd, sent = protocol.close_rcvd, protocol.close_sent
        if rcvd is None:
            return "connection lost without a close frame from the brain"
        who = "brain" if sent is None or protocol.close_rcvd_then_sent else "kit"
        reason = f" {rcvd.reason!r}" if rcvd.reason else ""
        if rcvd.code == CloseCode.MESSAGE_TOO_BIG:
            reason += f" (a frame over {MAX_MESSAGE_BYTES} bytes)"
        return f"{who} closed the connection (code {rcvd.code}{reason})"

    # -- queries over the record --

    def events(self, kind: type[_T], since: int = 0) -> list[tuple[int, _T]]:
        """Decoded events of class ``kind`` from ``since`` on, with their indexes."""
        return [
            (index, message.event)
            for index, message in enumerate(self.messages[since:], start=since)
            if isinstance(message.event, kind)
        ]

    def invalid(self, since: int = 0, raw_type: str | None = None) -> list[_Message]:
        """Messages from ``since`` on that failed to decode (of ``raw_type`` if given)."""
        return [
            message
            for message in self.messages[since:]
            if message.error is not None and (raw_type is None or message.raw_type == raw_type)
        ]

    def catalog(self, before: int | None = None) -> ToolsUpdate | None:
        """The latest valid ``tools.update`` (received before index ``before``)."""
        found = self.events(ToolsUpdate)
        if before is not None:
            found = [(i, update) for i, update in found if i < before]
        return found[-1][1] if found else None

    async def close(self) -> None:
        """Close from the kit's side (idempotent) and stop the reader."""
        await self.ws.close()
        # return_exceptions: a reader bug must not turn the report into a crash.
        await asyncio.gather(self._reader, return_exceptions=True)


def _describe_invalid(bad: Sequence[_Message]) -> str:
    first = bad[0].error
    assert first is not None  # only decode failures are passed here
    more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
    return f"{first.reason}: {first}{more}"


# ---- the run ---------------------------------------------------------------------


class ConformanceRun:
    """State shared by the rules of one run: the links, the session and what was learnt."""

    def __init__(self, url: str, turn_timeout_s: float, require_tool: bool) -> None:
        self.url = url
        self.turn_timeout_s = turn_timeout_s
        self.require_tool = require_tool
        self.links: list[BrainLink] = []
        self.link: BrainLink | None = None
        token = uuid.uuid4().hex[:12]
        self.session_id = f"conformance-{token}"
        self.call = CallInfo(
            id=f"conformance-call-{token}",
            direction="in",
            from_=CALL_FROM,
            to=CALL_TO,
            provider=CALL_PROVIDER,
        )
        self.brain_hello: BrainHello | None = None
        self.brain_hello_raw: dict[str, Any] = {}  # the first valid hello's JSON
        self.brain_answers = False  # it answered a turn with audio
        self.turn_open = False  # a speech_started without its speech_stopped
        self.turn_mark: int | None = None  # where the first turn began
        self.answer_mark: int | None = None  # where the answered turn began

    def hello(self, *, resume: bool) -> Hello:
        """The core's ``hello`` for this run's session."""
        return Hello(session_id=self.session_id, resume=resume, call=self.call)

    async def open_link(self) -> BrainLink:
        """Open a new connection and make it the current one."""
        link = await BrainLink.open(self.url, f"connection {len(self.links) + 1}")
        self.links.append(link)
        self.link = link
        self.turn_open = False
        return link

    def live_link(self) -> BrainLink:
        """The current connection, or SKIP the rule if there is none open."""
        if self.link is None:
            _skip("no connection (see connect)")
        if self.link.closed:
            _skip(f"connection already closed: {self.link.describe_close()}")
        return self.link

    @property
    def brain_owns_turns(self) -> bool:
        """The brain declared ``turns: "brain"``: the core sends it no speech events."""
        return self.brain_hello is not None and self.brain_hello.turns is TurnOwner.BRAIN

    @property
    def brain_interruptible(self) -> bool:
        """The brain's ``interruptible`` (the default when it sent no hello)."""
        return self.brain_hello is None or self.brain_hello.interruptible

    async def start_turn(self, link: BrainLink, extra: dict[str, Any] | None = None) -> None:
        """``speech_started`` (not interrupted), unless a barge-in already opened the turn.

        Nothing for a brain that owns turns: the core never sends it one.
        """
        if not self.turn_open and not self.brain_owns_turns:
            await link.send(SpeechStarted(interrupted=False), extra)
            self.turn_open = True

    async def end_turn(self, link: BrainLink) -> float:
        """``speech_stopped`` (nothing if the brain owns turns); returns when the turn ended."""
        if not self.brain_owns_turns:
            await link.send(SpeechStopped())
        self.turn_open = False
        return link.now()

    async def wait_answer(
        self, link: BrainLink, check: Callable[[], bool], timeout_s: float
    ) -> bool:
        """Wait for ``check()`` after a caller turn, like :meth:`BrainLink.wait_until`.

        A brain that owns turns decides by itself when the caller is done, so
        meanwhile the kit streams silent ``audio_in`` (the core forwards all
        caller audio, silence included) for its VAD to hear.
        """
        if not self.brain_owns_turns:
            return await link.wait_until(check, timeout_s)
        silence = AudioIn(bytes(CANONICAL_FRAME_SAMPLES * SAMPLE_WIDTH))
        interval = FRAME_MS / 1000.0 / AUDIO_PACE
        deadline = link.now() + timeout_s
        while True:
            if check():
                return True
            remaining = deadline - link.now()
            if link.closed or remaining <= 0:
                return False
            await link.send(silence)
            await link.wait_until(check, min(interval, remaining))

    async def short_turn_answered(self, link: BrainLink) -> str | None:
        """Play a short turn and wait for audio; None if answered, else why not."""
        mark = link.mark()
        await self.start_turn(link)
        await link.stream(voiced_pcm(SHORT_TURN_MS))
        await self.end_turn(link)
        if await self.wait_answer(
            link, lambda: bool(link.events(AudioOut, mark)), self.turn_timeout_s
        ):
            return None
        if link.closed:
            return link.describe_close()
        return f"no audio_out within {self.turn_timeout_s:g} s of {self.turn_end_name}"

    @property
    def turn_end_name(self) -> str:
        """What ends a caller turn for this brain, for details."""
        return "the caller's turn (turns: brain)" if self.brain_owns_turns else "speech_stopped"

    async def close_all(self) -> None:
        """Close every connection still open."""
        for link in self.links:
            await link.close()


_Check = Callable[[ConformanceRun], Awaitable[tuple[RuleStatus, str]]]


@dataclass(frozen=True, slots=True)
class ConformanceRule:
    """One named check; ``check`` returns (status, detail) or raises ``_Outcome``."""

    name: str
    check: _Check


def _passed(detail: str) -> tuple[RuleStatus, str]:
    return RuleStatus.PASS, detail


# ---- the rules -------------------------------------------------------------------


async def _check_connect(run: ConformanceRun) -> tuple[RuleStatus, str]:
    loop = asyncio.get_running_loop()
    start = loop.time()
    try:
        await run.open_link()
    except _DIAL_ERRORS as exc:
        _fail(f"cannot open {run.url}: {type(exc).__name__}: {exc}")
    return _passed(f"opened {run.url} in {(loop.time() - start) * 1000:.0f} ms")


async def _check_hello(run: ConformanceRun) -> tuple[RuleStatus, str]:
    link = run.live_link()
    mark = link.mark()
    await link.send(run.hello(resume=False))
    await link.wait_until(
        lambda: bool(link.events(BrainHello, mark) or link.invalid(mark, "hello")),
        HELLO_WAIT_S,
    )
    bad = link.invalid(mark, "hello")
    if bad:
        _fail(f"malformed hello: {_describe_invalid(bad)}")
    hellos = link.events(BrainHello, mark)
    why = await link.alive(SETTLE_S)
    if why is not None:
        _fail(why)
    if not hellos:
        return _passed("brain sent no hello (optional)")
    index, run.brain_hello = hellos[0]
    run.brain_hello_raw = link.raw_hellos.get(index, {})
    return _passed(f"brain {run.brain_hello.name!r} version {run.brain_hello.version!r}")


def _declared(hello: BrainHello) -> str:
    return f"interruptible {str(hello.interruptible).lower()}, turns {hello.turns.value!r}"


async def _check_hello_declarations(run: ConformanceRun) -> tuple[RuleStatus, str]:
    hello = run.brain_hello
    if hello is None:
        _skip("no valid hello (see hello)")
    raw = run.brain_hello_raw
    if hello.ignored:
        values = ", ".join(f"{name}={json.dumps(raw.get(name))[:40]}" for name in hello.ignored)
        _fail(
            f"invalid declaration(s) {values}: interruptible must be a boolean, turns "
            '"core" or "brain"; a core reads them as the defaults'
        )
    brain = raw.get("brain")
    nested = [name for name in BRAIN_DECLARATIONS if isinstance(brain, dict) and name in brain]
    if nested:
        _fail(
            f"{', '.join(nested)} inside hello.brain: declarations are top-level hello "
            "fields, a core ignores them there"
        )
    present = [name for name in BRAIN_DECLARATIONS if name in raw]
    if not present:
        _skip(f"brain declares nothing (defaults: {_declared(hello)})")
    defaulted = [name for name in BRAIN_DECLARATIONS if name not in present]
    note = f" ({', '.join(defaulted)} by default)" if defaulted else ""
    return _passed(_declared(hello) + note)


async def _check_tools_catalog(run: ConformanceRun) -> tuple[RuleStatus, str]:
    link = run.live_link()
    await link.wait_until(
        lambda: bool(link.events(ToolsUpdate) or link.invalid(0, "tools.update")),
        CATALOG_WAIT_S,
    )
    bad = link.invalid(0, "tools.update")
    if bad:
        _fail(f"malformed tools.update: {_describe_invalid(bad)}")
    catalog = link.catalog()
    if catalog is None:
        _skip("brain sent no tools.update")
    problems: list[str] = []
    for tool in catalog.tools:
        try:
            Draft202012Validator.check_schema(tool.parameters)
        except SchemaError as exc:
            problems.append(f"{tool.name}: parameters is not a valid JSON Schema: {exc.message}")
    if problems:
        _fail("; ".join(problems))
    names = ", ".join(tool.name for tool in catalog.tools) or "empty catalog"
    return _passed(f"{len(catalog.tools)} tool(s) ({names}); schemas valid (Draft 2020-12)")


async def _check_audio_accepted(run: ConformanceRun) -> tuple[RuleStatus, str]:
    link = run.live_link()
    run.turn_mark = link.mark()
    await run.start_turn(link)
    frames = await link.stream(voiced_pcm(ACCEPT_AUDIO_MS))
    why = await link.alive()
    if why is not None:
        _fail(why)
    return _passed(f"{frames} audio_in frames ({ACCEPT_AUDIO_MS} ms at {AUDIO_PACE:g}x real time)")


async def _check_answers_turn(run: ConformanceRun) -> tuple[RuleStatus, str]:
    link = run.live_link()
    mark = run.turn_mark
    if mark is None:
        _skip("no caller turn was played (see audio-accepted)")
    stop_mark = link.mark()
    stopped_at = await run.end_turn(link)
    answered = await run.wait_answer(
        link, lambda: bool(link.events(AudioOut, mark)), run.turn_timeout_s
    )
    if answered:  # what the brain does, even if some of its audio was invalid
        run.brain_answers = True
        run.answer_mark = mark
    bad = link.invalid(mark, "audio_out")
    if bad:
        _fail(f"invalid audio_out: {_describe_invalid(bad)}")
    if not answered:
        if link.closed:
            _fail(link.describe_close())
        if run.brain_owns_turns:  # no speech_stopped to answer: its silence is its call
            _skip(f"turns: brain, and no audio_out on its own within {run.turn_timeout_s:g} s")
        _fail(f"no audio_out within {run.turn_timeout_s:g} s of speech_stopped")
    first_index, _ = link.events(AudioOut, mark)[0]
    if first_index < stop_mark:
        return _passed("audio_out arrived while the caller spoke (a streaming brain)")
    delay_ms = (link.messages[first_index].at - stopped_at) * 1000
    if run.brain_owns_turns:
        return _passed(
            f"turns: brain; answered on its own {delay_ms:.0f} ms after the caller's audio "
            "(no speech events sent)"
        )
    return _passed(f"first audio_out {delay_ms:.0f} ms after speech_stopped")


async def _check_barge_in(run: ConformanceRun) -> tuple[RuleStatus, str]:
    link = run.live_link()
    if not run.brain_interruptible:
        _skip("brain declares interruptible: false (the core never cuts it)")
    if run.brain_owns_turns:
        _skip(
            'brain declares turns: "brain" (the core sends it no speech_started; '
            "cutting its audio is its own audio_clear)"
        )
    mark = run.answer_mark
    if mark is None:
        _skip("no answer to interrupt (see answers-turn)")
    with_item = [out for _, out in link.events(AudioOut, mark) if out.item is not None]
    if not with_item:
        _skip("the brain's audio carried no item id")
    item = with_item[-1].item
    heard = sum(len(out.pcm) for out in with_item if out.item == item) // SAMPLE_WIDTH
    played_ms = samples_to_ms(heard)  # never more than what arrived
    await link.send(SpeechStarted(interrupted=True, item=item, played_ms=played_ms))
    run.turn_open = True  # the caller is speaking: the next turn continues this one
    barge_mark = link.mark()
    await link.pause(BARGE_IN_GRACE_MS / 1000)
    watch_mark = link.mark()
    await link.pause(BARGE_IN_WATCH_MS / 1000)
    why = await link.alive()
    if why is not None:
        _fail(why)
    in_grace = sum(1 for _, out in link.events(AudioOut, barge_mark) if out.item == item) - sum(
        1 for _, out in link.events(AudioOut, watch_mark) if out.item == item
    )
    late = [out for _, out in link.events(AudioOut, watch_mark) if out.item == item]
    if late:
        _fail(
            f"{len(late)} audio_out for item {item!r} more than {BARGE_IN_GRACE_MS} ms "
            "after the barge-in"
        )
    return _passed(
        f"interrupted {item!r} at {played_ms} ms; {in_grace} audio_out in the "
        f"{BARGE_IN_GRACE_MS} ms grace, none after"
    )


def _validate_call(call: FunctionCall, catalog: ToolsUpdate | None) -> tuple[ToolStatus, str]:
    """The status the core would answer, and the problem if it is not ``ok``."""
    tools = {tool.name: tool for tool in catalog.tools} if catalog else {}
    tool = tools.get(call.name)
    if tool is None:
        return ToolStatus.NOT_IMPLEMENTED, f"tool {call.name!r} is not in the latest catalog"
    try:
        Draft202012Validator.check_schema(tool.parameters)
        error = best_match(Draft202012Validator(tool.parameters).iter_errors(call.args))
    except SchemaError as exc:
        return ToolStatus.ERROR, f"tool {call.name!r} has an invalid schema: {exc.message}"
    except (UnknownType, Unresolvable) as exc:  # a valid schema can still fail to apply
        return ToolStatus.ERROR, f"cannot check args of {call.name!r}: {type(exc).__name__}"
    if error is not None:
        return ToolStatus.ERROR, f"args of {call.name!r} fail its schema: {error.message}"
    return ToolStatus.OK, ""


async def _check_tool_round_trip(run: ConformanceRun) -> tuple[RuleStatus, str]:
    link = run.live_link()
    mark = link.mark()
    link.answer_tool_calls = False
    try:
        await run.start_turn(link)
        tone = voiced_pcm(TOOL_LEAD_MS) + marker_tone_pcm() + voiced_pcm(TOOL_LEAD_MS)
        await link.stream(tone)
        stopped_at = await run.end_turn(link)

        def answered_then_quiet() -> bool:
            if run.require_tool or not link.events(AudioOut, mark):
                return False
            last = max(link.messages[-1].at, stopped_at)
            return link.now() - last >= TOOL_QUIET_S

        await run.wait_answer(
            link,
            lambda: bool(link.events(FunctionCall, mark)) or answered_then_quiet(),
            run.turn_timeout_s,
        )
        bad = link.invalid(mark, "function_call")
        if bad:
            _fail(f"invalid function_call: {_describe_invalid(bad)}")
        calls = link.events(FunctionCall, mark)
        if not calls:
            if link.closed:
                _fail(link.describe_close())
            if run.require_tool:
                _fail(f"brain proposed no tool call within {run.turn_timeout_s:g} s")
            _skip("brain proposed no tool call")
        index, call = calls[0]
        status, problem = _validate_call(call, link.catalog(before=index))
        result = TOOL_RESULT if status is ToolStatus.OK else {"error": problem}
        await link.send(FunctionCallOutput(call.id, status, result))
        for _, extra_call in calls[1:]:
            await link.send(
                FunctionCallOutput(
                    extra_call.id,
                    ToolStatus.NOT_IMPLEMENTED,
                    {"error": "the conformance kit runs one tool call per turn"},
                )
            )
    finally:
        link.answer_tool_calls = True
    after_mark = link.mark()
    why = await link.alive(AFTER_TOOL_S)
    if problem:
        _fail(problem)
    if why is not None:
        _fail(f"after function_call_output: {why}")
    more = len(link.events(AudioOut, after_mark))
    return _passed(
        f"{call.name}({json.dumps(call.args, sort_keys=True)}) valid; answered ok; "
        f"{more} audio_out after the result"
    )


async def _check_unknown_events(run: ConformanceRun) -> tuple[RuleStatus, str]:
    link = run.live_link()
    await link.wait_quiet(QUIET_S, QUIET_CAP_S)
    await link.send_unknown(PROBE_TYPE, {"x_note": "forward-compatibility probe", **PROBE_FIELDS})
    mark = link.mark()
    await run.start_turn(link, PROBE_FIELDS)
    await link.stream(voiced_pcm(SHORT_TURN_MS), PROBE_FIELDS)
    await run.end_turn(link)
    if not run.brain_answers:
        why = await link.alive(SETTLE_S)
        if why is not None:
            _fail(why)
        return _passed("ignored the unknown type and fields (brain does not answer turns)")
    got = await run.wait_answer(link, lambda: bool(link.events(AudioOut, mark)), run.turn_timeout_s)
    if not got:
        if link.closed:
            _fail(link.describe_close())
        _fail(f"no answer to the turn after the probe within {run.turn_timeout_s:g} s")
    return _passed(f"ignored {PROBE_TYPE!r} and unknown fields; answered the next turn")


async def _check_dtmf(run: ConformanceRun) -> tuple[RuleStatus, str]:
    link = run.live_link()
    await link.send(Dtmf(PROBE_DIGIT))
    why = await link.alive(SETTLE_S)
    if why is not None:
        _fail(why)
    return _passed(f"digit {PROBE_DIGIT!r} sent; still connected")


async def _check_resume(run: ConformanceRun) -> tuple[RuleStatus, str]:
    if run.link is None:
        _skip("no session to resume (see connect)")
    await run.link.close()  # as if the connection were lost
    try:
        link = await run.open_link()
    except _DIAL_ERRORS as exc:
        _fail(f"cannot reconnect: {type(exc).__name__}: {exc}")
    mark = link.mark()
    await link.send(run.hello(resume=True))
    notes = [f"session {run.session_id}"]
    if run.brain_hello is not None:
        await link.wait_until(
            lambda: bool(link.events(BrainHello, mark) or link.invalid(mark, "hello")),
            HELLO_WAIT_S,
        )
        notes.append("hello again" if link.events(BrainHello, mark) else "no hello this time")
    bad = link.invalid(mark, "hello")
    if bad:
        _fail(f"malformed hello: {_describe_invalid(bad)}")
    if run.brain_answers:
        why = await run.short_turn_answered(link)
        if why is not None:
            _fail(f"after resume: {why}")
        notes.append("answered a turn")
    else:
        why = await link.alive(SETTLE_S)
        if why is not None:
            _fail(why)
        notes.append("stayed connected")
    return _passed("resumed " + ", ".join(notes))


async def _check_session_end(run: ConformanceRun) -> tuple[RuleStatus, str]:
    link = run.live_link()
    mark = link.mark()
    await link.send(SessionEnd(SessionEndReason.CALLER_HANGUP))
    await link.wait_until(lambda: False, SESSION_END_WAIT_S)  # ends early on close
    brain_closed = link.closed
    await link.close()  # the core closes the socket after session_end
    bad = link.invalid(mark)
    if bad:
        _fail(f"invalid message after session_end: {_describe_invalid(bad)}")
    protocol = link.ws.protocol
    if not brain_closed and protocol.close_rcvd is None:
        _fail(f"brain did not answer the kit's close frame within {CLOSE_TIMEOUT_S:g} s")
    byes = link.events(Bye, mark)
    said = f"bye ({byes[0][1].reason!r}), " if byes else "no bye, "
    return _passed(said + link.describe_close())


async def _check_messages_valid(run: ConformanceRun) -> tuple[RuleStatus, str]:
    if not run.links:
        _skip("never connected")
    problems: list[str] = []
    total = 0
    for link in run.links:
        total += len(link.messages)
        bad = link.invalid()
        if bad:
            reasons = Counter(message.error.reason for message in bad if message.error)
            counts = ", ".join(f"{reason} x{n}" for reason, n in sorted(reasons.items()))
            problems.append(f"{link.label}: {len(bad)} invalid ({counts}; first: {bad[0].error})")
        if link.seq_problems:
            gaps = link.seq_problems
            problems.append(f"{link.label}: {len(gaps)} seq gap(s), first {gaps[0]}")
        if link.binary_frames:
            problems.append(f"{link.label}: {link.binary_frames} binary frame(s) (tap is text)")
        frames = (link.ws.protocol.close_rcvd, link.ws.protocol.close_sent)
        if any(f is not None and f.code == CloseCode.MESSAGE_TOO_BIG for f in frames):
            problems.append(f"{link.label}: a frame over {MAX_MESSAGE_BYTES} bytes")
    if problems:
        _fail("; ".join(problems))
    return _passed(
        f"{total} messages on {len(run.links)} connection(s): all valid v1, seq continuous from 0"
    )


#: The rules, in the order they run. Each gets the shared run state.
RULES: tuple[ConformanceRule, ...] = (
    ConformanceRule("connect", _check_connect),
    ConformanceRule("hello", _check_hello),
    ConformanceRule("hello-declarations", _check_hello_declarations),
    ConformanceRule("tools-catalog", _check_tools_catalog),
    ConformanceRule("audio-accepted", _check_audio_accepted),
    ConformanceRule("answers-turn", _check_answers_turn),
    ConformanceRule("barge-in", _check_barge_in),
    ConformanceRule("tool-round-trip", _check_tool_round_trip),
    ConformanceRule("unknown-events", _check_unknown_events),
    ConformanceRule("dtmf", _check_dtmf),
    ConformanceRule("resume", _check_resume),
    ConformanceRule("session-end", _check_session_end),
    ConformanceRule("messages-valid", _check_messages_valid),
)


async def _run_rule(run: ConformanceRun, rule: ConformanceRule) -> RuleResult:
    limit_s = run.turn_timeout_s + RULE_SLACK_S
    try:
        async with asyncio.timeout(limit_s):
            status, detail = await rule.check(run)
    except _Outcome as outcome:
        status, detail = outcome.status, outcome.detail
    except ConnectionClosed:
        status = RuleStatus.FAIL
        detail = run.link.describe_close() if run.link else "connection closed"
    except WebSocketException as exc:
        status, detail = RuleStatus.FAIL, f"{type(exc).__name__}: {exc}"
    except TimeoutError:
        status, detail = RuleStatus.FAIL, f"did not finish within {limit_s:g} s"
    except (OSError, TapProtocolError) as exc:
        status, detail = RuleStatus.FAIL, f"{type(exc).__name__}: {exc}"
    if len(detail) > MAX_DETAIL_CHARS:
        detail = detail[: MAX_DETAIL_CHARS - 3] + "..."
    return RuleResult(rule.name, status, detail)


async def run_conformance(
    url: str,
    *,
    turn_timeout_s: float = DEFAULT_TURN_TIMEOUT_S,
    require_tool: bool = False,
) -> ConformanceReport:
    """Play the core's side of tap v1 against the brain at ``url`` and report per rule.

    The brain's faults become FAILs, never exceptions.

    ``turn_timeout_s`` bounds each wait for the brain's answer (audio or a
    tool call); ``require_tool`` turns "no tool call on the marker tone" from
    SKIP into FAIL.
    """
    if not turn_timeout_s > 0:
        raise ValueError(f"turn_timeout_s must be > 0, got {turn_timeout_s}")
    run = ConformanceRun(url, turn_timeout_s, require_tool)
    results: list[RuleResult] = []
    try:
        for rule in RULES:
            results.append(await _run_rule(run, rule))
    finally:
        await run.close_all()
    return ConformanceReport(url, tuple(results))


def format_result(result: RuleResult) -> str:
    """One report line: ``PASS  rule-name  detail``."""
    return f"{result.status.upper():<4}  {result.name:<{NAME_COLUMN}}  {result.detail}"


def format_summary(report: ConformanceReport) -> str:
    """The report's last line: counts per status and the verdict."""
    counts = {status: 0 for status in RuleStatus}
    for rule in report.rules:
        counts[rule.status] += 1
    verdict = "conformant" if report.passed else "NOT conformant"
    return (
        f"{verdict}: {counts[RuleStatus.PASS]} passed, {counts[RuleStatus.FAIL]} failed, "
        f"{counts[RuleStatus.SKIP]} skipped ({report.url})"
    )


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds: {text!r}")
    return value


def _tap_url(text: str) -> str:
    if not text.startswith(("ws://", "wss://")):
        raise argparse.ArgumentTypeError(f"not a ws:// or wss:// URL: {text!r}")
    return text


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``rutster tap-conformance`` / ``python -m rutster.tools.conformance``."""
    parser = argparse.ArgumentParser(
        prog="rutster tap-conformance",
        description="Check a tap v1 brain: plays the core's side against URL and "
        "prints PASS/FAIL/SKIP per rule. Exit status 0 iff no rule failed.",
    )
    parser.add_argument("url", type=_tap_url, help="the brain's ws:// or wss:// URL")
    parser.add_argument(
        "--require-tool",
        action="store_true",
        help="fail (not skip) if the brain proposes no tool call on the marker tone",
    )
    parser.add_argument(
        "--timeout",
        type=_positive_seconds,
        default=DEFAULT_TURN_TIMEOUT_S,
        metavar="SECONDS",
        help=f"how long the brain may take to answer a turn (default {DEFAULT_TURN_TIMEOUT_S:g})",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the kit from the command line; returns the exit status (0 iff no FAIL)."""
    args = build_parser().parse_args(argv)
    try:
        report = asyncio.run(
            run_conformance(args.url, turn_timeout_s=args.timeout, require_tool=args.require_tool)
        )
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    for result in report.rules:
        print(format_result(result))
    print(format_summary(report))
    return 0 if report.passed else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
