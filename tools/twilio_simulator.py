"""A Twilio simulator: plays Twilio's part of a phone call against a running gateway.

It does what Twilio does for an inbound call on a number whose voice webhook
points at the gateway (docs/PROVIDERS.md §1), or for an outbound call created through
the REST API once the callee answers (the webhook is then the call's ``Url``,
with ``Direction=outbound-api``; :class:`SimulatedCallee` plays such callees for
a FAKE REST API, such as the tests' ``tests/support/fake_twilio_rest.py``): posts the
signed voice webhook, reads the TwiML ``<Connect><Stream>``, opens the media
WebSocket (signed upgrade), sends ``connected``/``start`` and the caller's audio
as 20 ms μ-law ``media`` messages at real-time pace (or faster), and plays back
what the gateway sends the way Twilio does: audio is queued and played in real
time, ``mark`` is echoed once the audio before it has played, ``clear`` drops the
queue and echoes pending marks at once. What the caller would have heard is kept as PCM (and
can be written to a WAV) together with timings.

This is a test and demo tool, not a Twilio emulator for production traffic.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
import time
import wave
import weakref
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import httpx
import numpy as np
import numpy.typing as npt
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from rutster.media.g711 import ulaw_decode, ulaw_encode
from rutster.trunk.twilio.signature import SIGNATURE_HEADER, TwilioSignatureValidator

#: Twilio's caller audio: 20 ms of 8 kHz μ-law per ``media`` message (docs/PROVIDERS.md §1.3).
SIM_SAMPLE_RATE = 8_000
SIM_FRAME_MS = 20
SIM_FRAME_BYTES = SIM_SAMPLE_RATE * SIM_FRAME_MS // 1000
#: How long to keep listening after the last caller frame (echo still arriving).
DEFAULT_TAIL_S = 1.5
#: HTTP timeout for the webhook.
WEBHOOK_TIMEOUT_S = 10.0
#: ``Direction`` of the voice webhook (docs/PROVIDERS.md §1.1): a call to one of our numbers,
#: or a call we created through the REST API.
DIRECTION_INBOUND = "inbound"
DIRECTION_OUTBOUND_API = "outbound-api"
#: ``CallStatus`` the voice webhook carries: an inbound call is still ringing when Twilio
#: asks for TwiML; an outbound call's ``Url`` is fetched once the callee has answered.
WEBHOOK_CALL_STATUS = {DIRECTION_INBOUND: "ringing", DIRECTION_OUTBOUND_API: "in-progress"}


@dataclass(frozen=True)
class StreamInstructions:
    """What the gateway's TwiML told Twilio to do."""

    url: str
    parameters: dict[str, str]


@dataclass
class SimulatedCallResult:
    """What happened on one simulated call, seen from Twilio's side."""

    call_sid: str
    stream_sid: str
    #: True when the call ended because the provider hung it up (``provider_hangup``).
    hung_up_by_provider: bool = False
    frames_sent: int = 0
    media_received: int = 0
    audio_ms_received: float = 0.0
    marks_received: int = 0
    marks_echoed: int = 0
    clears_received: int = 0
    #: PCM16 8 kHz of what the caller heard, on the caller's timeline (index 0 = first frame sent).
    heard_pcm: bytes = b""
    #: Arrival time (ms since the first frame was sent) and duration of each media message.
    arrivals: list[tuple[float, float]] = field(default_factory=list)
    #: Largest amount of audio queued at "Twilio" at any arrival (the gateway's lead), ms.
    max_queue_ms: float = 0.0
    #: Gaps heard by the caller once playback had begun (queue ran dry then resumed).
    heard_gaps: int = 0
    heard_gap_ms: float = 0.0
    first_audio_ms: float | None = None
    close_code: int | None = None
    close_reason: str = ""
    #: When each ``clear`` arrived (ms since the first frame was sent), in order.
    clear_times_ms: list[float] = field(default_factory=list)
    #: When each caller frame was actually sent (ms since the first frame was due),
    #: filled by :meth:`TwilioSimulator.place_reactive_call`.
    sent_times_ms: list[float] = field(default_factory=list)
    #: The caller audio actually sent (PCM16 8 kHz), filled by
    #: :meth:`TwilioSimulator.place_reactive_call`.
    sent_pcm: bytes = b""
    #: Each gap heard: (when it began, how long), ms on the caller's timeline.
    gaps: list[tuple[float, float]] = field(default_factory=list)
    #: Moments the simulator itself did not run on time (its process descheduled, a
    #: garbage collection): (when, how late), ms on the caller's timeline. Real Twilio
    #: keeps its own clock, so audio timing the simulator recorded then is its error.
    harness_stalls: list[tuple[float, float]] = field(default_factory=list)

    def inter_arrival_jitter_ms(self, percentile: float = 99.0) -> float:
        """Percentile of |inter-arrival - audio duration| over consecutive media messages."""
        if len(self.arrivals) < 3:
            return 0.0
        times = np.array([t for t, _ in self.arrivals])
        durs = np.array([d for _, d in self.arrivals])
        dev = np.abs(np.diff(times) - durs[:-1])
        return float(np.percentile(dev, percentile))


def signed_headers(auth_token: str | None, url: str, params: Mapping[str, str]) -> dict[str, str]:
    """``X-Twilio-Signature`` for ``url`` + ``params`` (none when no token)."""
    if auth_token is None:
        return {}
    return {SIGNATURE_HEADER: TwilioSignatureValidator(auth_token).compute(url, dict(params))}


class CallRefused(ValueError):
    """The gateway answered the call's webhook with no media stream (a ``<Reject>``, a
    busy signal, a spoken refusal): ``answer`` is what it sent."""

    def __init__(self, problem: str, answer: str) -> None:
        super().__init__(f"{problem}; the gateway answered: {answer[:MAX_ANSWER_SHOWN]!r}")
        self.answer = answer


#: How much of a refusing answer a CallRefused message shows.
MAX_ANSWER_SHOWN = 200


def parse_connect_stream(twiml: str) -> StreamInstructions:
    """Extract ``<Connect><Stream url>`` and its ``<Parameter>``s from TwiML."""
    root = ET.fromstring(twiml)
    stream = root.find("./Connect/Stream")
    if stream is None or not stream.get("url"):
        raise ValueError("TwiML has no <Connect><Stream url=...>")
    params = {
        p.get("name", ""): p.get("value", "") for p in stream.findall("Parameter") if p.get("name")
    }
    return StreamInstructions(url=stream.get("url", ""), parameters=params)


def new_sid(prefix: str) -> str:
    """A Twilio-shaped SID: two letters + 32 hex digits."""
    return prefix + secrets.token_hex(16)


def connected_message() -> str:
    """Twilio's first media-socket message."""
    return json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"})


def start_message(
    stream_sid: str, call_sid: str, account_sid: str, parameters: Mapping[str, str]
) -> str:
    """Twilio's ``start`` message."""
    return json.dumps(
        {
            "event": "start",
            "sequenceNumber": "1",
            "streamSid": stream_sid,
            "start": {
                "accountSid": account_sid,
                "streamSid": stream_sid,
                "callSid": call_sid,
                "tracks": ["inbound"],
                "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
                "customParameters": dict(parameters),
            },
        }
    )


def media_message(stream_sid: str, seq: int, chunk: int, timestamp_ms: int, mulaw: bytes) -> str:
    """Twilio's ``media`` message (numbers as strings, as Twilio sends them)."""
    return json.dumps(
        {
            "event": "media",
            "sequenceNumber": str(seq),
            "streamSid": stream_sid,
            "media": {
                "track": "inbound",
                "chunk": str(chunk),
                "timestamp": str(timestamp_ms),
                "payload": base64.b64encode(mulaw).decode("ascii"),
            },
        }
    )


def stop_message(stream_sid: str, seq: int, call_sid: str, account_sid: str) -> str:
    """Twilio's ``stop`` message."""
    return json.dumps(
        {
            "event": "stop",
            "sequenceNumber": str(seq),
            "streamSid": stream_sid,
            "stop": {"accountSid": account_sid, "callSid": call_sid},
        }
    )


def read_wav_8k(path: str | Path) -> bytes:
    """PCM16 mono 8 kHz samples of a WAV file (the simulator's caller audio)."""
    with wave.open(str(path), "rb") as wav:
        if wav.getnchannels() != 1 or wav.getsampwidth() != 2 or wav.getframerate() != 8000:
            raise ValueError(
                f"{path}: need 8 kHz mono 16-bit PCM, got {wav.getframerate()} Hz, "
                f"{wav.getnchannels()} ch, {8 * wav.getsampwidth()}-bit"
            )
        return wav.readframes(wav.getnframes())


def write_wav_8k(path: str | Path, pcm: bytes) -> None:
    """Write PCM16 mono 8 kHz samples to a WAV file."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(SIM_SAMPLE_RATE)
        wav.writeframes(pcm)


class _Playback:
    """Twilio's side of outbound audio: a real-time queue, marks, clear."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.queue_end = t0
        self.segments: list[tuple[float, bytes]] = []  # (start time, pcm16)
        self.pending_marks: list[tuple[float, str]] = []
        self.started = False
        #: Start of the current run of back-to-back audio (None: none since a clear).
        self.run_start: float | None = None

    def add(self, now: float, pcm: bytes, result: SimulatedCallResult) -> None:
        duration = len(pcm) / 2 / SIM_SAMPLE_RATE * 1000.0
        if self.started and now > self.queue_end + 0.5:
            # Queue ran dry while audio was still coming: the caller heard a gap.
            result.heard_gaps += 1
            result.heard_gap_ms += now - self.queue_end
            result.gaps.append((self.queue_end - self.t0, now - self.queue_end))
        if self.run_start is None or now > self.queue_end + 0.5:
            self.run_start = max(now, self.queue_end)
        start = max(now, self.queue_end)
        self.queue_end = start + duration
        self.started = True
        self.segments.append((start, pcm))
        result.max_queue_ms = max(result.max_queue_ms, self.queue_end - now)

    def clear(self, now: float) -> list[str]:
        kept: list[tuple[float, bytes]] = []
        for start, pcm in self.segments:
            if start >= now:
                continue
            played = int((now - start) / 1000.0 * SIM_SAMPLE_RATE) * 2
            kept.append((start, pcm[:played]))
        self.segments = kept
        self.queue_end = now
        self.started = False
        self.run_start = None
        # Marks whose audio had not finished playing are echoed at once (Twilio's clear rule).
        marks = [name for at, name in self.pending_marks if at > now]
        self.pending_marks = []
        return marks

    def view(self, now: float) -> CallerView:
        """What the caller hears at ``now`` (absolute ms), on the caller's timeline."""
        playing = self.run_start is not None and self.run_start <= now < self.queue_end
        return CallerView(
            now_ms=now - self.t0,
            playing_since_ms=(
                self.run_start - self.t0 if playing and self.run_start is not None else None
            ),
            heard_until_ms=(self.queue_end - self.t0) if self.segments else None,
        )

    def heard(self) -> bytes:
        if not self.segments:
            return b""
        end = max(s + len(p) / 2 / SIM_SAMPLE_RATE * 1000.0 for s, p in self.segments)
        total = int((end - self.t0) / 1000.0 * SIM_SAMPLE_RATE) + 1
        out = np.zeros(total, dtype=np.int16)
        for start, pcm in self.segments:
            idx = round((start - self.t0) / 1000.0 * SIM_SAMPLE_RATE)
            samples = np.frombuffer(pcm, dtype=np.int16)
            out[idx : idx + len(samples)] = samples[: max(0, total - idx)]
        return out.tobytes()


#: How often the simulator checks that its own event loop runs on time (seed decision:
#: half a frame, so a stall worth a frame is seen).
STALL_WATCH_PERIOD_MS = 10.0
#: Lateness of that check counted as a stall of the simulator itself (seed decision:
#: well above asyncio's timer jitter of about 1 ms, below a 20 ms frame).
HARNESS_STALL_MS = 15.0


class _StallWatch:
    """Notices when this event loop runs late; one per loop, shared by its calls.

    Real Twilio keeps its own clock; a simulator that was not scheduled on time
    recorded arrival times late by that much, so each call gets the stalls that
    happened while it ran (:attr:`SimulatedCallResult.harness_stalls`).
    """

    def __init__(self) -> None:
        self.stalls: list[tuple[float, float]] = []  # (when due, how late), monotonic ms
        self.users = 0
        self.task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        due = time.monotonic() * 1000.0
        while True:
            due += STALL_WATCH_PERIOD_MS
            await asyncio.sleep(max(0.0, due / 1000.0 - time.monotonic()))
            now = time.monotonic() * 1000.0
            if now - due > HARNESS_STALL_MS:
                self.stalls.append((due, now - due))
                due = now

    def join(self) -> None:
        self.users += 1
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self.run())

    def leave(self, t0: float, result: SimulatedCallResult) -> None:
        result.harness_stalls = [(at - t0, ms) for at, ms in self.stalls if at >= t0]
        self.users -= 1
        if not self.users and self.task is not None:
            self.task.cancel()
            self.task = None
            self.stalls.clear()


_STALL_WATCHES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _StallWatch] = (
    weakref.WeakKeyDictionary()
)


def _stall_watch() -> _StallWatch:
    loop = asyncio.get_running_loop()
    watch = _STALL_WATCHES.get(loop)
    if watch is None:
        watch = _STALL_WATCHES[loop] = _StallWatch()
    return watch


#: How long a finished call waits for its reader task to drain the socket.
READER_STOP_TIMEOUT_S = 5.0
#: Longest a reactive call may last before the simulator hangs up on its own.
DEFAULT_REACTIVE_MAX_S = 120.0


@dataclass(frozen=True)
class CallerView:
    """What a reactive caller knows when it chooses its next 20 ms frame.

    Times are ms on the caller's timeline (0 = when the first frame was due).
    ``playing_since_ms`` is when the run of back-to-back assistant audio the
    caller hears right now began (None when nothing is playing: before any
    audio, in a gap, or after a ``clear``); ``heard_until_ms`` when the audio
    queued so far ends (or ended: a ``clear`` ends it at once; None before any).
    """

    now_ms: float
    playing_since_ms: float | None
    heard_until_ms: float | None


class ReactiveCaller(Protocol):
    """A caller that decides what to say frame by frame, from what it hears."""

    def next_frame(self, view: CallerView) -> bytes | None:
        """The next 20 ms of caller audio (320 bytes of PCM16 8 kHz), or None to hang up."""


async def _stop_reader(reader: asyncio.Task[None]) -> None:
    """Wait for a call's reader to finish (bounded) and re-raise what it hit."""
    done, _ = await asyncio.wait({reader}, timeout=READER_STOP_TIMEOUT_S)
    if not done:
        reader.cancel()
        raise TimeoutError("the simulated call's reader did not stop")
    if not reader.cancelled():
        reader.result()


class TwilioSimulator:
    """Places simulated Twilio calls into a gateway reachable at ``public_url``.

    ``public_url`` is the gateway's ``RUTSTER_PUBLIC_URL`` (what it signs against);
    ``auth_token`` the ``TWILIO_AUTH_TOKEN`` it expects (None for dev mode).
    """

    def __init__(
        self,
        public_url: str,
        *,
        auth_token: str | None = None,
        account_sid: str | None = None,
    ) -> None:
        self.public_url = public_url.rstrip("/")
        self.auth_token = auth_token
        self.account_sid = account_sid or new_sid("AC")

    def voice_url(self, query: str = "") -> str:
        """The gateway's voice webhook URL, with ``query`` (as configured on the number)."""
        return f"{self.public_url}/twilio/voice" + (f"?{query}" if query else "")

    async def post_voice_webhook(
        self, call_sid: str, *, from_: str, to: str, query: str = ""
    ) -> httpx.Response:
        """POST the signed voice webhook, as Twilio does when an inbound call arrives."""
        return await self.post_webhook(
            self.voice_url(query), call_sid, from_=from_, to=to, direction=DIRECTION_INBOUND
        )

    async def post_webhook(
        self, url: str, call_sid: str, *, from_: str, to: str, direction: str
    ) -> httpx.Response:
        """POST the signed voice webhook to ``url`` (query string included: Twilio signs it).

        ``direction`` is ``inbound`` (``CallStatus=ringing``) or ``outbound-api``
        (``CallStatus=in-progress``: an outbound call's ``Url`` is fetched on answer).
        """
        if direction not in WEBHOOK_CALL_STATUS:
            raise ValueError(f"direction must be one of {sorted(WEBHOOK_CALL_STATUS)}")
        params = {
            "AccountSid": self.account_sid,
            "ApiVersion": "2010-04-01",
            "CallSid": call_sid,
            "CallStatus": WEBHOOK_CALL_STATUS[direction],
            "Direction": direction,
            "From": from_,
            "To": to,
        }
        # Building an SSL context costs ~15 ms of CPU: only do it for https.
        async with httpx.AsyncClient(
            timeout=WEBHOOK_TIMEOUT_S, verify=url.startswith("https://")
        ) as client:
            return await client.post(
                url, data=params, headers=signed_headers(self.auth_token, url, params)
            )

    async def open_stream(
        self,
        call_sid: str,
        *,
        from_: str,
        to: str,
        query: str = "",
        webhook_url: str | None = None,
        direction: str = DIRECTION_INBOUND,
    ) -> StreamInstructions:
        """Webhook → TwiML → the stream instructions (raises on a non-200 answer).

        ``query`` is added to the webhook URL, as an operator would configure it
        on the number (e.g. ``brain=wss://...`` to choose an allowlisted brain).
        ``webhook_url`` replaces that URL (query string included), e.g. with an
        outbound call's ``Url``; ``direction`` as for :meth:`post_webhook`.
        """
        if webhook_url is not None and query:
            raise ValueError("give the query inside webhook_url, not both")
        if webhook_url is None and direction == DIRECTION_INBOUND:
            # Through post_voice_webhook, so subclasses that override it keep working.
            response = await self.post_voice_webhook(call_sid, from_=from_, to=to, query=query)
        else:
            url = webhook_url or self.voice_url(query)
            response = await self.post_webhook(
                url, call_sid, from_=from_, to=to, direction=direction
            )
        if response.status_code != 200:
            raise RuntimeError(f"voice webhook answered {response.status_code}: {response.text}")
        try:
            return self._parse_answer(response.text)
        except ValueError as exc:  # an answer, but no stream in it: the call was refused
            raise CallRefused(str(exc), response.text) from None

    async def connect_media(self, instructions: StreamInstructions) -> ClientConnection:
        """Open the media WebSocket with a signed upgrade, as Twilio does."""
        return await connect(
            instructions.url,
            additional_headers=signed_headers(self.auth_token, instructions.url, {}),
            max_size=2**20,
            compression=None,
        )

    async def place_call(
        self,
        caller_pcm: bytes,
        *,
        from_: str = "+15551230000",
        to: str = "+15559870000",
        speed: float = 1.0,
        tail_s: float = DEFAULT_TAIL_S,
        query: str = "",
        call_sid: str | None = None,
        provider_hangup: asyncio.Event | None = None,
        webhook_url: str | None = None,
        direction: str = DIRECTION_INBOUND,
        dtmf: Sequence[tuple[float, str]] = (),
        media_path: str | None = None,
    ) -> SimulatedCallResult:
        """Run one whole call: stream ``caller_pcm`` (PCM16 8 kHz) and record the answer.

        ``query`` is added to the voice-webhook URL (see :meth:`open_stream`);
        ``webhook_url`` replaces that URL and ``direction`` says whose call it is
        (see :meth:`post_voice_webhook`): an outbound call's callee is played with
        the call's ``Url`` and ``outbound-api``.
        ``dtmf``: keypad digits the caller presses, each ``(seconds into the call,
        digit)``, sent between media frames.
        ``media_path``: stream to this path of the answer's stream URL instead (its
        host and query kept): an operator who points the stream at the one ``/media``.
        ``provider_hangup``, once set (e.g. by the fake Twilio REST server when the
        gateway hangs up through the REST API), ends the call early the way Twilio
        does: the caller's media stops and a ``stop`` event follows.
        """
        call_sid = call_sid or new_sid("CA")
        hangup = provider_hangup or asyncio.Event()
        stream_sid = new_sid("MZ")
        instructions = await self.open_stream(
            call_sid,
            from_=from_,
            to=to,
            query=query,
            webhook_url=webhook_url,
            direction=direction,
        )
        if media_path is not None:
            moved = urlsplit(instructions.url)._replace(path=media_path)
            instructions = StreamInstructions(urlunsplit(moved), instructions.parameters)
        result = SimulatedCallResult(call_sid=call_sid, stream_sid=stream_sid)
        mulaw = ulaw_encode(caller_pcm)
        ws = await self.connect_media(instructions)
        async with ws:
            t0, playback, reader = await self._begin_stream(
                ws, instructions, call_sid, stream_sid, result
            )
            try:
                seq = 2
                frames = [
                    mulaw[i : i + SIM_FRAME_BYTES] for i in range(0, len(mulaw), SIM_FRAME_BYTES)
                ]
                presses = sorted(dtmf)
                for n, chunk in enumerate(frames):
                    if hangup.is_set():
                        break
                    while presses and presses[0][0] * 1000.0 <= n * SIM_FRAME_MS:
                        await ws.send(self._dtmf_message(stream_sid, seq, presses.pop(0)[1]))
                        seq += 1
                    due = t0 + n * SIM_FRAME_MS / speed
                    delay = (due - time.monotonic() * 1000.0) / 1000.0
                    if delay > 0:
                        await asyncio.sleep(delay)
                    await self._send_media(
                        ws, self._media_message(stream_sid, seq, n + 1, n * SIM_FRAME_MS, chunk)
                    )
                    seq += 1
                    result.frames_sent += 1
                await self._flush_media(ws)
                if not hangup.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(hangup.wait(), tail_s)
                stop = self._stop_message(stream_sid, seq, call_sid)
                if stop is not None:
                    await ws.send(stop)
                await ws.close()
            except ConnectionClosed:
                pass
            except asyncio.CancelledError:
                # Cancelled mid-call: stop reading at once and let the cancellation through.
                reader.cancel()
                raise
            finally:
                result.hung_up_by_provider = hangup.is_set()
                await _stop_reader(reader)
        result.heard_pcm = playback.heard()
        return result

    async def _begin_stream(
        self,
        ws: ClientConnection,
        instructions: StreamInstructions,
        call_sid: str,
        stream_sid: str,
        result: SimulatedCallResult,
    ) -> tuple[float, _Playback, asyncio.Task[None]]:
        """Send ``connected`` and ``start``; return the call's clock origin (ms), its
        playback and the task reading what the gateway sends."""
        connected = self._connected_message()
        if connected is not None:
            await ws.send(connected)
        await ws.send(self._start_message(stream_sid, call_sid, instructions))
        t0 = time.monotonic() * 1000.0
        playback = _Playback(t0)
        return t0, playback, asyncio.create_task(self._read(ws, playback, result, stream_sid))

    async def place_reactive_call(
        self,
        caller: ReactiveCaller,
        *,
        from_: str = "+15551230000",
        to: str = "+15559870000",
        query: str = "",
        call_sid: str | None = None,
        provider_hangup: asyncio.Event | None = None,
        max_s: float = DEFAULT_REACTIVE_MAX_S,
    ) -> SimulatedCallResult:
        """Run one whole call whose caller reacts to what it hears (see :class:`ReactiveCaller`).

        Every 20 ms, at real-time pace, ``caller.next_frame`` gets a
        :class:`CallerView` of the playback so far and returns the frame to
        send; None hangs up (``stop``, then the socket is closed). The call also
        ends when ``provider_hangup`` is set or after ``max_s``. On top of what
        :meth:`place_call` records, the result carries the audio actually sent
        (:attr:`SimulatedCallResult.sent_pcm`) and each frame's send time.
        """
        call_sid = call_sid or new_sid("CA")
        hangup = provider_hangup or asyncio.Event()
        stream_sid = new_sid("MZ")
        instructions = await self.open_stream(call_sid, from_=from_, to=to, query=query)
        result = SimulatedCallResult(call_sid=call_sid, stream_sid=stream_sid)
        sent: list[bytes] = []
        ws = await self.connect_media(instructions)
        async with ws:
            t0, playback, reader = await self._begin_stream(
                ws, instructions, call_sid, stream_sid, result
            )
            try:
                seq = 2
                n = 0
                while not hangup.is_set() and n * SIM_FRAME_MS < max_s * 1000.0:
                    due = t0 + n * SIM_FRAME_MS
                    delay = (due - time.monotonic() * 1000.0) / 1000.0
                    if delay > 0:
                        await asyncio.sleep(delay)
                    now = time.monotonic() * 1000.0
                    pcm = caller.next_frame(playback.view(now))
                    if pcm is None:
                        break
                    if len(pcm) != SIM_FRAME_BYTES * 2:
                        raise ValueError(
                            f"a reactive caller frame is {SIM_FRAME_BYTES * 2} bytes, "
                            f"got {len(pcm)}"
                        )
                    await self._send_media(
                        ws,
                        self._media_message(
                            stream_sid, seq, n + 1, n * SIM_FRAME_MS, ulaw_encode(pcm)
                        ),
                    )
                    result.sent_times_ms.append(now - t0)
                    sent.append(pcm)
                    seq += 1
                    n += 1
                    result.frames_sent += 1
                await self._flush_media(ws)
                stop = self._stop_message(stream_sid, seq, call_sid)
                if stop is not None:
                    await ws.send(stop)
                await ws.close()
            except ConnectionClosed:
                pass
            except asyncio.CancelledError:
                reader.cancel()
                raise
            finally:
                result.hung_up_by_provider = hangup.is_set()
                await _stop_reader(reader)
        result.heard_pcm = playback.heard()
        result.sent_pcm = b"".join(sent)
        return result

    # ---- the provider's wire (a subclass for another provider overrides these) ----

    #: Whether marks of audio a ``clear`` dropped come back (Twilio sends them, §1.4).
    echoes_cleared_marks = True

    def _parse_answer(self, document: str) -> StreamInstructions:
        """The webhook's answer: where to stream, with which parameters."""
        return parse_connect_stream(document)

    def _parse_outgoing(self, raw: str | bytes) -> tuple[str, str | bytes]:
        """A gateway message as ``("media", PCM16 8 kHz)``, ``("mark", name)``,
        ``("clear", "")`` or ``(other event, "")``."""
        message: dict[str, Any] = json.loads(raw)
        event = str(message.get("event"))
        if event == "media":
            return event, ulaw_decode(base64.b64decode(message["media"]["payload"]))
        if event == "mark":
            return event, str(message["mark"]["name"])
        return event, ""

    def _after_clear(self, stream_sid: str) -> list[str]:
        """What the provider sends when a ``clear`` has emptied its queue (Twilio: nothing)."""
        return []

    def _connected_message(self) -> str | None:
        return connected_message()

    def _start_message(
        self, stream_sid: str, call_sid: str, instructions: StreamInstructions
    ) -> str:
        return start_message(stream_sid, call_sid, self.account_sid, instructions.parameters)

    def _media_message(
        self, stream_sid: str, seq: int, chunk: int, timestamp_ms: int, mulaw: bytes
    ) -> str | bytes:
        return media_message(stream_sid, seq, chunk, timestamp_ms, mulaw)

    def _stop_message(self, stream_sid: str, seq: int, call_sid: str) -> str | None:
        return stop_message(stream_sid, seq, call_sid, self.account_sid)

    def _dtmf_message(self, stream_sid: str, seq: int, digit: str) -> str:
        """A keypad press (bidirectional streams send them, docs/PROVIDERS.md §1.3)."""
        return json.dumps(
            {
                "event": "dtmf",
                "sequenceNumber": str(seq),
                "streamSid": stream_sid,
                "dtmf": {"track": "inbound_track", "digit": digit},
            }
        )

    def _mark_message(self, stream_sid: str, name: str) -> str:
        """The mark echoed once the audio before it has played."""
        return json.dumps({"event": "mark", "streamSid": stream_sid, "mark": {"name": name}})

    async def _send_media(self, ws: ClientConnection, message: str | bytes) -> None:
        """Send one caller media message (a subclass may hold and reorder them)."""
        await ws.send(message)

    async def _flush_media(self, ws: ClientConnection) -> None:
        """Send any media message :meth:`_send_media` still holds."""

    async def _read(
        self,
        ws: ClientConnection,
        playback: _Playback,
        result: SimulatedCallResult,
        stream_sid: str,
    ) -> None:
        mark_tasks: set[asyncio.Task[None]] = set()
        watch = _stall_watch()
        watch.join()

        async def echo_mark(name: str, at_ms: float) -> None:
            delay = (at_ms - time.monotonic() * 1000.0) / 1000.0
            if delay > 0:
                await asyncio.sleep(delay)
            try:
                await ws.send(self._mark_message(stream_sid, name))
                result.marks_echoed += 1
            except ConnectionClosed:
                pass

        try:
            async for raw in ws:
                now = time.monotonic() * 1000.0
                event, value = self._parse_outgoing(raw)
                if event == "media":
                    assert isinstance(value, bytes)
                    pcm = value
                    result.media_received += 1
                    duration = len(pcm) / 2 / SIM_SAMPLE_RATE * 1000.0
                    result.audio_ms_received += duration
                    result.arrivals.append((now - playback.t0, duration))
                    if result.first_audio_ms is None:
                        result.first_audio_ms = now - playback.t0
                    playback.add(now, pcm, result)
                elif event == "mark":
                    result.marks_received += 1
                    name = str(value)
                    playback.pending_marks.append((playback.queue_end, name))
                    task = asyncio.create_task(echo_mark(name, playback.queue_end))
                    mark_tasks.add(task)
                    task.add_done_callback(mark_tasks.discard)
                elif event == "clear":
                    result.clears_received += 1
                    result.clear_times_ms.append(now - playback.t0)
                    for task in list(mark_tasks):
                        task.cancel()
                    cleared = playback.clear(now)
                    for reply in self._after_clear(stream_sid):
                        await ws.send(reply)
                    for name in cleared if self.echoes_cleared_marks else ():
                        task = asyncio.create_task(echo_mark(name, now))
                        mark_tasks.add(task)
                        task.add_done_callback(mark_tasks.discard)
        except ConnectionClosed:
            pass
        finally:
            watch.leave(playback.t0, result)
            result.close_code = ws.close_code
            result.close_reason = ws.close_reason or ""
            for task in list(mark_tasks):
                task.cancel()
            if mark_tasks:
                await asyncio.gather(*mark_tasks, return_exceptions=True)


class AnsweredCall(Protocol):
    """What :class:`SimulatedCallee` reads of an answered outbound call: the fields
    a FAKE Twilio REST API keeps of a created call (the tests' ``CreatedFakeCall``,
    ``tests/support/fake_twilio_rest.py``).
    """

    @property
    def sid(self) -> str: ...
    @property
    def account_sid(self) -> str: ...
    @property
    def to(self) -> str: ...
    @property
    def from_(self) -> str: ...
    @property
    def url(self) -> str | None: ...
    @property
    def method(self) -> str: ...
    @property
    def provider_hangup(self) -> asyncio.Event: ...


class SimulatedCallee:
    """Plays the callee of outbound calls made through a FAKE Twilio REST API.

    Set an instance as the fake's ``on_answer`` (``FakeTwilioRest.on_answer``,
    ``tests/support/fake_twilio_rest.py``):
    when a created call is answered it runs :meth:`TwilioSimulator.place_call`
    with the call's ``Url`` as the voice webhook (``Direction=outbound-api``,
    ``CallStatus=in-progress``, the call's SID, From and To, the fake's account),
    streams ``callee_pcm`` (PCM16 8 kHz) as the callee's voice and records what
    the callee heard in :attr:`results`. A hang-up through the fake's REST API
    ends the call early (``provider_hangup``); otherwise it lasts the audio plus
    ``tail_s``. ``auth_token`` is the account's Auth Token the webhook is signed
    with (``None`` for a gateway in dev mode).
    """

    def __init__(
        self,
        callee_pcm: bytes,
        *,
        auth_token: str | None,
        speed: float = 1.0,
        tail_s: float = DEFAULT_TAIL_S,
    ) -> None:
        self.callee_pcm = callee_pcm
        self.auth_token = auth_token
        self.speed = speed
        self.tail_s = tail_s
        #: What happened on each answered call, by call SID.
        self.results: dict[str, SimulatedCallResult] = {}
        #: Calls whose simulation failed (e.g. the webhook did not answer a stream), by SID.
        self.errors: dict[str, BaseException] = {}

    def __repr__(self) -> str:
        return f"SimulatedCallee(calls={len(self.results)}, errors={len(self.errors)})"

    async def __call__(self, call: AnsweredCall) -> None:
        """Answer ``call``: run it through the simulator until it ends. Failures re-raise."""
        try:
            if call.url is None or call.method != "POST":
                raise ValueError("only calls with a POST voice webhook Url can be simulated")
            split = urlsplit(call.url)
            simulator = TwilioSimulator(
                f"{split.scheme}://{split.netloc}",
                auth_token=self.auth_token,
                account_sid=call.account_sid,
            )
            self.results[call.sid] = await simulator.place_call(
                self.callee_pcm,
                from_=call.from_,
                to=call.to,
                speed=self.speed,
                tail_s=self.tail_s,
                call_sid=call.sid,
                provider_hangup=call.provider_hangup,
                webhook_url=call.url,
                direction=DIRECTION_OUTBOUND_API,
            )
        except Exception as exc:
            self.errors[call.sid] = exc
            raise


def best_lag_correlation(
    sent: bytes, heard: bytes, *, max_lag_samples: int = 8000
) -> tuple[float, int]:
    """Normalised correlation of ``heard`` with ``sent`` at the best lag ≥ 0, and that lag.

    Both are PCM16 at the same rate. The lag search uses FFT cross-correlation
    over ``0..max_lag_samples``; the returned correlation is the Pearson
    coefficient of the overlapping parts at that lag.
    """
    a = np.frombuffer(sent, dtype=np.int16).astype(np.float64)
    b = np.frombuffer(heard, dtype=np.int16).astype(np.float64)
    if len(a) == 0 or len(b) == 0:
        return 0.0, 0
    n = len(a) + len(b)
    size = 1 << (n - 1).bit_length()
    xc = np.fft.irfft(np.fft.rfft(b, size) * np.conj(np.fft.rfft(a, size)), size)
    lags = xc[: max_lag_samples + 1]
    lag = int(np.argmax(lags))
    overlap = min(len(a), len(b) - lag)
    if overlap <= 1:
        return 0.0, lag
    x = a[:overlap]
    y = b[lag : lag + overlap]
    if x.std() == 0 or y.std() == 0:
        return 0.0, lag
    return float(np.corrcoef(x, y)[0, 1]), lag


#: Window of the echo judgement (seed decision: a second holds a few words, so its
#: correlation is stable, and one stall spoils at most one or two windows).
ECHO_WINDOW_MS = 1000
#: Largest delay change searched between windows (ms): far above any step a stall makes.
ECHO_WINDOW_MAX_LAG_MS = 500
#: A window this quiet (RMS of the sent audio, -45 dBFS) has no speech to correlate.
ECHO_WINDOW_MIN_RMS = 180.0


@dataclass(frozen=True)
class EchoWindow:
    """One window of an echo call, judged at its own best delay."""

    start_ms: int
    correlation: float
    lag_samples: int
    #: The simulator itself stalled in or just before this window, so what it
    #: recorded there is not the gateway's doing (see ``harness_stalls``).
    harness_stalled: bool


def echo_windows(
    sent: bytes,
    result: SimulatedCallResult,
    *,
    base_lag_samples: int,
    window_ms: int = ECHO_WINDOW_MS,
) -> list[EchoWindow]:
    """Correlate each window of ``sent`` with what was heard around ``base_lag_samples``.

    Windows with no speech in ``sent`` are skipped; a last window shorter than
    half of ``window_ms`` is left out. A window is marked
    ``harness_stalled`` when the simulator ran late between one window before
    it and its end (the echo of a window reflects the frames sent up to a
    round trip earlier).
    """
    rate = SIM_SAMPLE_RATE
    step = window_ms * rate // 1000 * 2
    reach = ECHO_WINDOW_MAX_LAG_MS * rate // 1000
    out: list[EchoWindow] = []
    heard = result.heard_pcm
    for start in range(0, len(sent) - step // 2 + 1, step):
        chunk = sent[start : start + step]  # the last may be short, at least half a window
        samples = np.frombuffer(chunk, dtype=np.int16).astype(np.float64)
        if float(np.sqrt(np.mean(samples * samples))) < ECHO_WINDOW_MIN_RMS:
            continue
        begin = max(0, start + 2 * (base_lag_samples - reach))  # bytes
        corr, lag = best_lag_correlation(
            chunk,
            heard[begin : start + 2 * (base_lag_samples + reach) + step],
            max_lag_samples=2 * reach,
        )
        start_ms = start // 2 * 1000 // rate
        stalled = any(
            start_ms - window_ms <= at <= start_ms + window_ms + base_lag_samples * 1000 / rate
            for at, _ in result.harness_stalls
        )
        out.append(EchoWindow(start_ms, corr, begin // 2 + lag - start // 2, stalled))
    return out


#: Level above which a 20 ms frame of what the caller heard counts as reply audio:
#: about -45 dBFS, well above μ-law idle noise and far below any voice. Seed decision.
REPLY_RMS_THRESHOLD = 180.0


@dataclass(frozen=True)
class ConversationScript:
    """Caller audio for a turn-taking call: speech, then room for the brain's reply.

    ``turn_ends_s`` are the caller-timeline instants each turn's speech ends;
    ``pcm`` is the whole caller side (PCM16 8 kHz), silence included, since a
    real phone keeps sending frames while the caller listens.
    """

    pcm: bytes
    turn_ends_s: tuple[float, ...]
    reply_window_s: float


def conversation_script(
    speech_8k: bytes,
    *,
    turns: int,
    speech_s: float,
    reply_window_s: float,
    speech_from_s: float = 0.0,
    final_pcm: bytes = b"",
) -> ConversationScript:
    """Caller audio: ``turns`` x (speech, then a silent reply window), then ``final_pcm``.

    Consecutive turns take consecutive slices of ``speech_8k`` from ``speech_from_s``
    (wrapping round), so no two turns say the same thing.
    """
    rate = SIM_SAMPLE_RATE
    chunk = int(speech_s * rate) * 2
    start = int(speech_from_s * rate) * 2
    parts: list[bytes] = []
    ends: list[float] = []
    t = 0.0
    for n in range(turns):
        a = (start + n * chunk) % max(1, len(speech_8k) - chunk)
        parts.append(speech_8k[a : a + chunk])
        t += speech_s
        ends.append(t)
        parts.append(b"\x00\x00" * int(reply_window_s * rate))
        t += reply_window_s
    parts.append(final_pcm)
    return ConversationScript(b"".join(parts), tuple(ends), reply_window_s)


def reply_onsets_ms(
    heard_pcm: bytes, script: ConversationScript, threshold: float = REPLY_RMS_THRESHOLD
) -> list[float | None]:
    """For each turn, ms from the end of the caller's speech to the first reply audio heard.

    ``None`` for a turn with no reply inside its window. ``heard_pcm`` is
    :attr:`SimulatedCallResult.heard_pcm` (the caller's timeline).
    """
    frame = SIM_FRAME_BYTES * 2  # 20 ms of PCM16
    samples = np.frombuffer(heard_pcm[: len(heard_pcm) - len(heard_pcm) % 2], dtype="<i2")
    onsets: list[float | None] = []
    for end_s in script.turn_ends_s:
        first = int(end_s * SIM_SAMPLE_RATE) * 2 // frame
        last = int((end_s + script.reply_window_s) * SIM_SAMPLE_RATE) * 2 // frame
        found: float | None = None
        for index in range(first, last):
            window = samples[index * frame // 2 : (index + 1) * frame // 2].astype(np.float64)
            if window.size and float(np.sqrt(np.mean(window**2))) > threshold:
                found = index * SIM_FRAME_MS - end_s * 1000.0
                break
        onsets.append(found)
    return onsets


#: Frames quieter than this are pauses, not speech, when an active level is measured
#: (the echo gate's near-end floor, media.echo_gate.NEAR_END_FLOOR_DBFS).
ACTIVE_LEVEL_FLOOR_DBFS = -50.0
#: Level of the first frame of an utterance that counts as its true onset.
ONSET_LEVEL_DBFS = -40.0
#: Level :class:`BargeInCaller` keeps the line at between utterances: very low line
#: noise, far under any voice (None: digital silence). Seed decision.
LINE_NOISE_DBFS = -70.0
_FULL_SCALE_PCM16 = 32768.0
_PCM16_FRAME = SIM_FRAME_BYTES * 2  # 20 ms of PCM16 at 8 kHz


def frame_levels_dbfs(pcm: bytes) -> npt.NDArray[np.float64]:
    """RMS level (dBFS, 0 = full-scale square wave) of each whole 20 ms frame of 8 kHz PCM16.

    An all-zero frame reports -100 dBFS. Same definition as
    :func:`media.endpointing.frame_level_dbfs`, vectorised.
    """
    count = len(pcm) // _PCM16_FRAME
    samples = np.frombuffer(pcm[: count * _PCM16_FRAME], dtype="<i2").astype(np.float64)
    power = (samples.reshape(count, SIM_FRAME_BYTES) ** 2).mean(axis=1)
    floor = _FULL_SCALE_PCM16**2 * 1e-10
    return np.asarray(10.0 * np.log10(np.maximum(power, floor) / _FULL_SCALE_PCM16**2))


def active_level_dbfs(pcm: bytes, floor_dbfs: float = ACTIVE_LEVEL_FLOOR_DBFS) -> float:
    """Active speech level of 8 kHz PCM16: mean power of its 20 ms frames above ``floor_dbfs``.

    A simple frame-gated version of ITU-T P.56's active level: the pauses
    between words (frames under the floor) do not pull it down. Returns -100
    dBFS when no frame is above the floor.
    """
    levels = frame_levels_dbfs(pcm)
    active = levels[levels > floor_dbfs]
    if not active.size:
        return -100.0
    return float(10.0 * np.log10(np.mean(10.0 ** (active / 10.0))))


def scale_to_active_level(
    pcm: bytes, target_dbfs: float, floor_dbfs: float = ACTIVE_LEVEL_FLOOR_DBFS
) -> bytes:
    """``pcm`` (8 kHz PCM16) with a gain that puts its :func:`active_level_dbfs` at ``target_dbfs``.

    The gain is refined a few times, since frames near the floor move in or
    out of the measurement as the level changes; samples are clipped to 16 bits.
    """
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
    gain = 1.0
    for _ in range(4):
        scaled = np.clip(np.rint(samples * gain), -32768, 32767).astype("<i2").tobytes()
        level = active_level_dbfs(scaled, floor_dbfs)
        if level <= -100.0:
            return scaled
        gain *= 10.0 ** ((target_dbfs - level) / 20.0)
    return np.clip(np.rint(samples * gain), -32768, 32767).astype("<i2").tobytes()


def onset_frame(pcm: bytes, threshold_dbfs: float = ONSET_LEVEL_DBFS) -> int | None:
    """Index of the first 20 ms frame of ``pcm`` above ``threshold_dbfs`` (None if none)."""
    above = np.flatnonzero(frame_levels_dbfs(pcm) > threshold_dbfs)
    return int(above[0]) if above.size else None


@dataclass(frozen=True)
class BargeIn:
    """One interruption: once the assistant's reply has played ``after_ms``, say ``speech``.

    ``speech`` is PCM16 8 kHz (any length; the last frame is padded with line noise).
    """

    after_ms: float
    speech: bytes


@dataclass
class SpokenUtterance:
    """One utterance a :class:`BargeInCaller` said, on the caller's timeline (ms).

    ``kind`` is ``opening`` (the first turn), ``barge_in`` (said over a reply;
    ``index`` into the script's barge-ins) or ``recovery`` (the opening said
    again because no reply came: a missed barge-in leaves no turn to answer).
    ``onset_ms`` is when its first frame above :data:`ONSET_LEVEL_DBFS` was sent;
    ``reply_played_ms`` how long the reply had been playing when it began.
    """

    kind: str
    index: int | None
    start_ms: float
    onset_ms: float | None = None
    end_ms: float | None = None
    reply_played_ms: float | None = None


class BargeInCaller:
    """A :class:`ReactiveCaller` that talks over each reply of the assistant.

    It says ``opening`` (after ``lead_in_ms`` of line noise), then for each
    :class:`BargeIn` in turn waits for a reply that *began after its last
    utterance ended*, lets it play ``after_ms`` and says the barge-in's speech
    over it; between utterances it sends only line noise at
    ``line_noise_dbfs`` (None: digital silence), never the assistant's audio
    (a clean line, no echo). If no such reply begins within ``recovery_ms``
    of the line going quiet (a missed barge-in is not a turn, so nothing
    answers it), it says ``opening`` again as a plain turn (a ``recovery``
    utterance) and keeps waiting for the same barge-in. After the last one it
    waits for the next reply (or ``recovery_ms`` of quiet), lets ``tail_ms``
    pass and hangs up. What it said is in :attr:`utterances`.
    """

    def __init__(
        self,
        opening: bytes,
        barge_ins: list[BargeIn],
        *,
        line_noise_dbfs: float | None = LINE_NOISE_DBFS,
        lead_in_ms: float = 500.0,
        recovery_ms: float = 1_500.0,
        tail_ms: float = 500.0,
        max_recoveries: int | None = None,
        seed: int = 0,
    ) -> None:
        self.opening = opening
        self.barge_ins = list(barge_ins)
        self.line_noise_dbfs = line_noise_dbfs
        self.recovery_ms = recovery_ms
        self.tail_ms = tail_ms
        self.max_recoveries = len(self.barge_ins) + 1 if max_recoveries is None else max_recoveries
        #: Every utterance said so far, in order.
        self.utterances: list[SpokenUtterance] = []
        self._rng = np.random.default_rng(seed)
        self._lead_in_frames = int(lead_in_ms // SIM_FRAME_MS)
        self._frames = 0
        self._speech = b""  # what is left of the current utterance
        self._current: SpokenUtterance | None = None
        self._next = 0  # index of the next barge-in to say
        self._hang_up_at: float | None = None
        self._recoveries = 0

    def _noise(self) -> bytes:
        if self.line_noise_dbfs is None:
            return b"\x00\x00" * SIM_FRAME_BYTES
        rms = _FULL_SCALE_PCM16 * 10.0 ** (self.line_noise_dbfs / 20.0)
        noise = np.rint(self._rng.normal(0.0, rms, SIM_FRAME_BYTES))
        return np.clip(noise, -32768, 32767).astype("<i2").tobytes()

    def _say(self, speech: bytes, utterance: SpokenUtterance) -> None:
        self._speech = speech
        self._current = utterance
        self.utterances.append(utterance)

    def next_frame(self, view: CallerView) -> bytes | None:
        """See :meth:`ReactiveCaller.next_frame`."""
        self._frames += 1
        if self._frames <= self._lead_in_frames:
            return self._noise()
        if not self.utterances:
            self._say(self.opening, SpokenUtterance("opening", None, view.now_ms))
        current = self._current
        if current is not None and self._speech:
            frame, self._speech = self._speech[:_PCM16_FRAME], self._speech[_PCM16_FRAME:]
            level = frame_levels_dbfs(frame.ljust(_PCM16_FRAME, b"\x00"))[0]
            if current.onset_ms is None and level > ONSET_LEVEL_DBFS:
                current.onset_ms = view.now_ms
            if len(frame) < _PCM16_FRAME:
                frame += self._noise()[len(frame) :]
            if not self._speech:
                current.end_ms = view.now_ms + SIM_FRAME_MS
            return frame
        return self._between_utterances(view)

    def _between_utterances(self, view: CallerView) -> bytes | None:
        now = view.now_ms
        if self._hang_up_at is not None:
            return None if now >= self._hang_up_at else self._noise()
        last = self.utterances[-1]
        ended = last.end_ms if last.end_ms is not None else now
        since = view.playing_since_ms
        new_reply = since is not None and since >= ended
        if new_reply and since is not None:
            if self._next >= len(self.barge_ins):
                self._hang_up_at = now + self.tail_ms
            elif now - since >= self.barge_ins[self._next].after_ms:
                barge = self.barge_ins[self._next]
                self._say(
                    barge.speech,
                    SpokenUtterance("barge_in", self._next, now, reply_played_ms=now - since),
                )
                self._next += 1
                return self._first_frame(view)
            return self._noise()
        if since is None:
            heard = view.heard_until_ms if view.heard_until_ms is not None else ended
            quiet_from = max(ended, heard)
            if now >= quiet_from + self.recovery_ms:
                if self._next >= len(self.barge_ins) or self._recoveries >= self.max_recoveries:
                    self._hang_up_at = now + self.tail_ms
                else:
                    self._recoveries += 1
                    self._say(self.opening, SpokenUtterance("recovery", None, now))
                    return self._first_frame(view)
        return self._noise()

    def _first_frame(self, view: CallerView) -> bytes | None:
        """The first frame of the utterance just begun (the frame count is not advanced)."""
        self._frames -= 1
        return self.next_frame(view)
