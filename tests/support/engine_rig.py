"""A virtual-time rig for the per-call media engine: a caller, a brain, a phone line.

Used by the tests (``tests/test_reflex.py``, ``tests/test_media_engine.py``)
and the benchmark (``bench/reflex.py``); not used by the gateway itself.

It drives the production :class:`~gateway.media_engine.MediaEngine` (the
object ``Call`` drives) with a fake clock, as a discrete-event simulation:
caller frames every 20 ms, the engine's own deadlines, brain messages, and
mark echoes, each at its time. The provider side plays what a Twilio Media
Stream does with the μ-law it receives: queued back to back from arrival in
real time, ``clear`` drops the queue (and echoes pending marks at once),
each ``mark`` comes back when playback reaches it. What the caller's line
carries back is built from what the provider actually played: that 8 kHz
audio delayed and attenuated (the echo path, which may change mid-call),
plus the near-end audio placed on the caller's timeline, plus line noise,
μ-law encoded in 20 ms frames like Twilio's ``media`` messages.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar, cast

import numpy as np
import numpy.typing as npt
import soxr

from rutster.gateway.media_engine import BrainAudio, EngineCommand, MediaEngine, MediaEngineConfig
from rutster.gateway.reflex import ReflexConfig, SpeechDetector
from rutster.media.echo_gate import EchoGate, EchoGateConfig, EchoVerdict
from rutster.media.formats import TWILIO_MULAW_8K
from rutster.media.g711 import ulaw_decode, ulaw_encode
from rutster.media.vad import DEFAULT_DETECTOR, SPEECH_THRESHOLD, make_detector
from rutster.protocols.ingress import (
    AudioReceived,
    ClearPlayback,
    IngressCommand,
    IngressEvent,
    MarkPlayed,
    PlaceMark,
    PlayAudio,
)
from rutster.protocols.tap import AudioOut, BrainEvent, BrainHello, SpeechStarted, SpeechStopped

_T = TypeVar("_T")

#: Canonical rate (what the brain sends and the tests place as near-end audio).
RATE = 24_000
#: Canonical frame: 20 ms at 24 kHz.
FRAME = 480
FRAME_MS = 20
#: The phone line's rate and frame (Twilio Media Streams: 8 kHz μ-law, 20 ms frames).
LINE_RATE = 8_000
LINE_FRAME = 160
#: Largest ``audio_out`` chunk a brain may send (docs/TAP_PROTOCOL.md: 24,000 samples).
MAX_AUDIO_OUT_SAMPLES = 24_000
#: Shortest dry spell in the provider's queue inside an item that is counted as a
#: hole the caller hears (10 ms: half a frame; the rig's timing is exact, so any
#: real hole is at least that).
HOLE_MIN_SAMPLES = LINE_RATE // 100
#: Seed of the line noise (any fixed value: runs must be reproducible).
NOISE_SEED = 7
#: Lower edge of the phone line's passband (ITU-T G.712: 300-3400 Hz for a PCM
#: channel). What the caller's side puts on the line is high-passed here, as
#: the network does: some recordings open with a DC step (GSM-decoded prompts)
#: that no phone line carries, and that would otherwise count as speech onset.
LINE_HIGHPASS_HZ = 300.0
#: Order of that high-pass (a Butterworth magnitude, applied with zero phase).
LINE_HIGHPASS_ORDER = 4


def line_highpass(samples: npt.NDArray[np.float64], rate: int) -> npt.NDArray[np.float64]:
    """``samples`` (any rate) through the line's high-pass, with zero phase (FFT)."""
    if not samples.size:
        return samples
    spectrum = np.fft.rfft(samples)
    freqs = np.fft.rfftfreq(samples.size, 1.0 / rate)
    with np.errstate(divide="ignore"):
        ratio = np.where(freqs > 0, LINE_HIGHPASS_HZ / np.maximum(freqs, 1e-9), np.inf)
    gain = 1.0 / np.sqrt(1.0 + ratio ** (2 * LINE_HIGHPASS_ORDER))
    out: npt.NDArray[np.float64] = np.fft.irfft(spectrum * gain, samples.size)
    return out


def on_the_line(pcm24: bytes) -> bytes:
    """Canonical PCM as the line carries it (high-passed): what onsets are measured on."""
    x = np.frombuffer(pcm24, dtype="<i2").astype(np.float64)
    y = line_highpass(x, RATE)
    return np.clip(np.rint(y), -32768, 32767).astype("<i2").tobytes()


class _RecordingJudge:
    """The echo gate, its verdicts kept (``verdicts[i]``: the i-th narrowband caller frame's)."""

    def __init__(self, gate: EchoGate, verdicts: list[EchoVerdict], times: list[float]) -> None:
        self._gate = gate
        self._verdicts = verdicts
        self._times = times

    def render(self, frame: bytes, sent_ms: float) -> None:
        self._gate.render(frame, sent_ms)

    def capture(self, frame: bytes, now_ms: float) -> EchoVerdict:
        verdict = self._gate.capture(frame, now_ms)
        self._verdicts.append(verdict)
        self._times.append(now_ms)
        return verdict

    def unplayed(self, frames: int) -> None:
        self._gate.unplayed(frames)


@dataclass(frozen=True)
class EchoPath:
    """The echo path from ``at_s`` on: round-trip delay and echo return loss (None: no echo)."""

    at_s: float
    delay_ms: float
    loss_db: float | None


@dataclass
class Step:
    """What happened at one caller frame (or one brain message): the commands that mattered.

    ``actions`` holds the tap events for the brain (``SpeechStarted``,
    ``SpeechStopped``, ``Dtmf``) and the provider ``ClearPlayback``; the
    caller audio, frames and marks are left out.
    """

    index: int
    at_ms: float
    actions: list[object]
    state: str


@dataclass
class ScriptedBrain:
    """A brain that answers every end of turn like the mock Realtime brain.

    ``think_ms`` after each ``speech_stopped`` it sends the next of
    ``replies`` (cycled) as one burst, under a new item id; an interrupting
    ``speech_started`` for an item stops what it had not sent yet.
    """

    replies: Sequence[bytes]
    think_ms: float = 300.0
    items: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Interruption:
    """One utterance the caller speaks over a reply, ``offset_ms`` after it starts playing."""

    pcm24: bytes
    offset_ms: float


@dataclass
class InterruptingCaller:
    """A caller who talks over every reply: the next utterance, each time one starts playing.

    ``placed`` records, per interruption, the reply item and where the
    utterance went on the caller's timeline (seconds), for reading the run.
    A reply that starts while the caller is still talking is not interrupted
    again. A missed interruption is no turn, so nothing answers it: when the
    line has been quiet for ``recovery_ms`` (nothing playing, the caller
    silent) with interruptions still to come, the caller says ``recovery``
    (when given) as a plain turn, recorded in ``recoveries`` (seconds).
    """

    interruptions: Sequence[Interruption]
    recovery: bytes | None = None
    recovery_ms: float = 1_500.0
    #: End the run this long after the last interruption's utterance ends (None: run
    #: for the rig's whole ``seconds``, which is then only the cap).
    done_after_ms: float | None = None
    placed: list[tuple[str, float, bytes]] = field(default_factory=list)
    recoveries: list[float] = field(default_factory=list)

    def done_by(self, now_ms: float) -> bool:
        """Whether every interruption was spoken and ``done_after_ms`` has passed since."""
        if self.done_after_ms is None or len(self.placed) < len(self.interruptions):
            return False
        _, at_s, pcm = self.placed[-1]
        return now_ms >= (at_s + len(pcm) / 2 / RATE) * 1000 + self.done_after_ms


@dataclass
class ReflexRig:
    """The rig. Near-end audio with :meth:`caller_audio`, brain audio with :meth:`say`."""

    seconds: float
    echo_delay_ms: float = 200.0
    echo_loss_db: float | None = 15.0  # None: no echo at all
    config: ReflexConfig = field(default_factory=ReflexConfig)
    detector: str | None = None
    #: A detector object instead of a named one (tests that script the VAD).
    vad: SpeechDetector | None = None
    noise_dbfs: float = -65.0
    #: Later echo paths (a caller switching to speakerphone, a new route).
    echo_changes: Sequence[EchoPath] = ()
    brain: ScriptedBrain | None = None
    #: What the brain says of itself (``None``: a brain that sends no hello fields).
    hello: BrainHello | None = None
    caller: InterruptingCaller | None = None
    #: WebRTC AEC3 in front of the echo gate (RUTSTER_ECHO_CANCELLER=on).
    echo_canceller: bool = False

    def __post_init__(self) -> None:
        n = int(self.seconds * LINE_RATE)
        self.near = np.zeros(n)  # near-end audio at the line rate
        self.played = np.zeros(n + LINE_RATE)  # what the provider played, caller's clock
        self.played_item: list[str | None] = [None] * (n + LINE_RATE)
        self.events: list[tuple[str, str, dict[str, object]]] = []
        #: The call's echo gate, and its verdict on every narrowband caller frame.
        self.echo = EchoGate(EchoGateConfig(canceller=self.echo_canceller))
        self.verdicts: list[EchoVerdict] = []
        #: When each of those frames reached the engine (ms).
        self.verdict_times_ms: list[float] = []
        self.engine = MediaEngine(
            TWILIO_MULAW_8K,
            detector=self.vad or make_detector(self.detector or DEFAULT_DETECTOR),
            echo=_RecordingJudge(self.echo, self.verdicts, self.verdict_times_ms),
            publish=lambda stage, kind, payload: self.events.append((stage, kind, dict(payload))),
            speech_threshold=SPEECH_THRESHOLD,
            config=MediaEngineConfig(reflex=self.config),
        )
        self.reflex = self.engine.reflex
        self.playout = self.engine.playout
        self.pacer = self.engine.pacer
        self.engine.set_brain_connected(True)
        if self.hello is not None:
            self.engine.on_brain(self.hello, 0.0)
        self.steps: list[Step] = []
        self.now = 0.0
        rng = np.random.default_rng(NOISE_SEED)
        self.line_noise = rng.normal(0, 32768 * 10 ** (self.noise_dbfs / 20), n)
        self.paths = [EchoPath(0.0, self.echo_delay_ms, self.echo_loss_db), *self.echo_changes]
        #: Every ClearPlayback the provider got, with its time (ms).
        self.clears_ms: list[float] = []
        #: Holes the caller heard without a clear: the provider's queue ran dry in the
        #: middle of an item (time and length, ms). A clear's own gap is not counted.
        self.holes_ms: list[tuple[float, float]] = []
        self._cleared = False
        #: When the simulated call ended (s): ``seconds``, or earlier when the caller
        #: was done (:meth:`InterruptingCaller.done_by`).
        self.ended_s = self.seconds
        #: ns spent inside the engine (every call: caller frames, polls, brain audio).
        self.reflex_ns = 0
        self.engine_calls = 0
        #: Caller frames the engine sent to the brain.
        self.brain_frames = 0
        self._queue: list[tuple[float, int, str, object]] = []
        self._seq = itertools.count()
        self._provider_end = 0  # line sample where the provider's queue runs dry
        self._pending_marks: list[str] = []  # placed, not yet played (in order)
        self._frame_index = 0
        self._replies = itertools.cycle(self.brain.replies) if self.brain else None
        self._last_played_item: str | None = None
        self._caller_busy_until_s = 0.0

    # ---- placing audio -----------------------------------------------------

    def caller_audio(self, pcm: bytes, at_s: float, gain_db: float = 0.0, rate: int = RATE) -> None:
        """Place near-end audio (s16le mono at ``rate``) at ``at_s`` on the caller's timeline.

        It goes through the line's high-pass (:data:`LINE_HIGHPASS_HZ`) first.
        """
        samples = np.frombuffer(pcm, dtype="<i2").astype(np.float64) * 10 ** (gain_db / 20)
        if rate != LINE_RATE:
            samples = soxr.resample(samples, rate, LINE_RATE, quality="HQ")
        samples = line_highpass(np.asarray(samples, dtype=np.float64), LINE_RATE)
        start = int(at_s * LINE_RATE)
        end = min(self.near.size, start + samples.size)
        if end > start:
            self.near[start:end] += samples[: end - start]

    def say(self, pcm24: bytes, item: str, at_s: float) -> None:
        """The brain sends ``pcm24`` for ``item`` at ``at_s`` (at once, like a burst)."""
        self._push(at_s * 1000, "brain", (item, pcm24))

    def brain_event(self, event: BrainEvent, at_s: float) -> None:
        """The brain sends any other tap event (``audio_clear``, a ``hello``) at ``at_s``."""
        self._push(at_s * 1000, "brain_event", event)

    def brain_link(self, connected: bool, at_s: float) -> None:
        """The brain connection goes down (or comes back up) at ``at_s``."""
        self._push(at_s * 1000, "brain_link", connected)

    def _push(self, at_ms: float, kind: str, payload: object) -> None:
        heapq.heappush(self._queue, (at_ms, next(self._seq), kind, payload))

    # ---- running -------------------------------------------------------------

    def run(self) -> ReflexRig:
        """Simulate the whole timeline; returns the rig for reading."""
        total = int(self.seconds * 1000 / FRAME_MS)
        for index in range(total):
            self._push((index + 1) * FRAME_MS, "caller", index)
        caller = self.caller
        while self._queue:
            at_ms, _, kind, payload = self._queue[0]
            if caller is not None and caller.done_by(at_ms):
                self.ended_s = at_ms / 1000
                break
            deadline = self.engine.next_deadline()
            if deadline is not None and deadline < at_ms:
                self.now = max(self.now, deadline)
                self._poll()
                continue
            heapq.heappop(self._queue)
            self.now = at_ms
            if kind == "caller":
                assert isinstance(payload, int)
                self._caller_frame(payload)
            elif kind == "brain":
                item, pcm = cast(tuple[str, bytes], payload)
                self._brain_audio(item, pcm)
            elif kind == "brain_event":
                self._record(self._engine_brain(cast(BrainEvent, payload)))
            elif kind == "brain_link":
                self.engine.set_brain_connected(bool(payload))
                if self.engine.wants_poll:
                    self._record(self._poll())
            elif kind == "mark":
                assert isinstance(payload, str)
                self._pending_marks.remove(payload)
                self._engine_ingress(MarkPlayed(payload))
        return self

    def _engine_ingress(self, event: IngressEvent) -> list[EngineCommand]:
        t0 = time.perf_counter_ns()
        out = self.engine.on_ingress(event, self.now)
        self.reflex_ns += time.perf_counter_ns() - t0
        self.engine_calls += 1
        return out

    def _engine_brain(self, event: BrainEvent) -> list[EngineCommand]:
        t0 = time.perf_counter_ns()
        out = self.engine.on_brain(event, self.now)
        self.reflex_ns += time.perf_counter_ns() - t0
        self.engine_calls += 1
        if self.engine.wants_poll:
            out = [*out, *self._poll()]
        return out

    def _poll(self) -> list[IngressCommand]:
        t0 = time.perf_counter_ns()
        before = self.engine.frames_out
        commands = self.engine.poll(self.now)
        self.reflex_ns += time.perf_counter_ns() - t0
        self.engine_calls += 1
        sent = self.reflex.ledger.recent(self.engine.frames_out - before)
        items = iter([entry.frame.item for entry in sent])
        for command in commands:
            if isinstance(command, PlayAudio):
                self._provider_play(command.payload, next(items, None))
            elif isinstance(command, PlaceMark):
                self._pending_marks.append(command.name)
                self._push(self._provider_end * 1000 / LINE_RATE, "mark", command.name)
            elif isinstance(command, ClearPlayback):
                self._provider_clear()
        return commands

    def _brain_audio(self, item: str, pcm: bytes) -> None:
        out: list[EngineCommand] = []
        step = MAX_AUDIO_OUT_SAMPLES * 2
        for a in range(0, len(pcm), step):
            out += self._engine_brain(AudioOut(pcm[a : a + step], item))
        self._record(out)

    def _caller_frame(self, index: int) -> None:
        self._frame_index = index
        self._maybe_recover()
        a, b = index * LINE_FRAME, (index + 1) * LINE_FRAME
        if b > self.near.size:
            return
        mixed = self.near[a:b] + self._echo(a, b) + self.line_noise[a:b]
        pcm = np.clip(np.rint(mixed), -32768, 32767).astype("<i2").tobytes()
        received = self._engine_ingress(AudioReceived(ulaw_encode(pcm), None))
        commands: list[object] = [c for c in received if not isinstance(c, BrainAudio)]
        self.brain_frames += len(received) - len(commands)
        if self.engine.wants_poll:
            commands += self._poll()
        kept = [c for c in commands if not isinstance(c, PlayAudio | PlaceMark)]
        self.steps.append(Step(index, self.now, kept, self.reflex.state.value))
        self._brain_reacts(kept)

    def _record(self, commands: Sequence[object]) -> None:
        kept = [c for c in commands if not isinstance(c, PlayAudio | PlaceMark | BrainAudio)]
        if kept:
            self.steps.append(Step(self._frame_index, self.now, kept, self.reflex.state.value))
            self._brain_reacts(kept)

    def _brain_reacts(self, commands: Sequence[object]) -> None:
        brain = self.brain
        if brain is None or self._replies is None:
            return
        for command in commands:
            if isinstance(command, SpeechStopped):
                item = f"reply_{len(brain.items) + 1}"
                brain.items.append(item)
                self.say(next(self._replies), item, (self.now + brain.think_ms) / 1000)
            elif isinstance(command, SpeechStarted) and command.interrupted:
                # The brain stops sending what it had not sent of the cut item.
                self._queue = [
                    e
                    for e in self._queue
                    if not (e[2] == "brain" and cast(tuple[str, bytes], e[3])[0] == command.item)
                ]
                heapq.heapify(self._queue)

    # ---- the provider and the line -----------------------------------------

    def _provider_play(self, payload: bytes, item: str | None) -> None:
        pcm = np.frombuffer(ulaw_decode(payload), dtype="<i2").astype(np.float64)
        arrival = round(self.now * LINE_RATE / 1000)
        start = max(arrival, self._provider_end)
        gap = arrival - self._provider_end
        if (
            item is not None
            and item == self._last_played_item
            and not self._cleared
            and gap >= HOLE_MIN_SAMPLES
        ):
            self.holes_ms.append((self._provider_end * 1000 / LINE_RATE, gap * 1000 / LINE_RATE))
        self._cleared = False
        if item is not None and item != self._last_played_item:
            self._last_played_item = item
            self._reply_started(item, start / LINE_RATE)
        end = max(start, min(self.played.size, start + pcm.size))  # past the rig's end: kept out
        self.played[start:end] = pcm[: end - start]
        self.played_item[start:end] = [item] * (end - start)
        self._provider_end = start + pcm.size

    def _provider_clear(self) -> None:
        at = round(self.now * LINE_RATE / 1000)
        self.clears_ms.append(self.now)
        self._cleared = True
        self.played[at:] = 0.0
        self.played_item[at:] = [None] * (len(self.played_item) - at)
        self._provider_end = at
        # Twilio echoes the marks still pending at once when it clears.
        pending = list(self._pending_marks)
        self._pending_marks.clear()
        self._queue = [e for e in self._queue if not (e[2] == "mark" and e[3] in pending)]
        heapq.heapify(self._queue)
        for name in pending:
            self._engine_ingress(MarkPlayed(name))

    def _maybe_recover(self) -> None:
        """The caller speaks again when a missed interruption left the call silent."""
        caller = self.caller
        if caller is None or caller.recovery is None:
            return
        if len(caller.placed) >= len(caller.interruptions) or not caller.placed:
            return
        now_s = self.now / 1000
        quiet_since = max(self._caller_busy_until_s, self._provider_end / LINE_RATE)
        if now_s < quiet_since + caller.recovery_ms / 1000 or self.playout.buffered_samples:
            return
        if any(e[2] == "brain" for e in self._queue):
            return
        self.caller_audio(caller.recovery, at_s=now_s)
        caller.recoveries.append(now_s)
        self._caller_busy_until_s = now_s + len(caller.recovery) / 2 / RATE

    def _reply_started(self, item: str, at_s: float) -> None:
        caller = self.caller
        if caller is None or len(caller.placed) >= len(caller.interruptions):
            return
        if at_s < self._caller_busy_until_s:
            return
        nxt = caller.interruptions[len(caller.placed)]
        start_s = at_s + nxt.offset_ms / 1000
        self.caller_audio(nxt.pcm24, at_s=start_s)
        caller.placed.append((item, start_s, nxt.pcm24))
        self._caller_busy_until_s = start_s + len(nxt.pcm24) / 2 / RATE

    def _echo(self, a: int, b: int) -> npt.NDArray[np.float64]:
        out = np.zeros(b - a)
        t_s = a / LINE_RATE
        path = [p for p in self.paths if p.at_s <= t_s][-1]
        if path.loss_db is None:
            return out
        delay = int(path.delay_ms * LINE_RATE / 1000)
        lo, hi = a - delay, b - delay
        if hi <= 0:
            return out
        src = self.played[max(0, lo) : hi]
        out[out.size - src.size :] = src * 10 ** (-path.loss_db / 20)
        return out

    # ---- reading the run ----------------------------------------------------

    def first(self, kind: type) -> Step | None:
        """The first step whose actions include one of ``kind``."""
        for step in self.steps:
            if any(isinstance(a, kind) for a in step.actions):
                return step
        return None

    def actions_of(self, kind: type[_T]) -> list[tuple[Step, _T]]:
        """Every action of ``kind`` with the step it came from."""
        return [(s, a) for s in self.steps for a in s.actions if isinstance(a, kind)]

    def states(self) -> list[str]:
        """The sequence of states entered (consecutive repeats folded)."""
        return [str(p["to"]) for _, kind, p in self.events if kind == "state"]

    def of_type(self, kind: str) -> list[dict[str, object]]:
        """Payloads of the bus events of one type."""
        return [p for _, k, p in self.events if k == kind]

    @property
    def audible_pauses(self) -> int:
        """Pauses the caller heard: every provider clear, and every hole without one."""
        return len(self.clears_ms) + len(self.holes_ms)

    def reached_core_ms(self, after_ms: float, floor_dbfs: float) -> float | None:
        """When the first narrowband caller frame at or above ``floor_dbfs`` after
        ``after_ms`` reached the engine (None: none did)."""
        for at, verdict in zip(self.verdict_times_ms, self.verdicts, strict=True):
            if at >= after_ms and verdict.capture_dbfs >= floor_dbfs:
                return at
        return None

    def heard_ms(self, item: str, until_ms: float) -> float:
        """How much of ``item`` the provider actually played by ``until_ms`` (ms)."""
        end = min(len(self.played_item), int(until_ms * LINE_RATE / 1000))
        return sum(1 for i in self.played_item[:end] if i == item) * 1000 / LINE_RATE

    def audio_stopped_ms(self, after_ms: float, quiet_ms: float = 40.0) -> float | None:
        """First time after ``after_ms`` the caller hears nothing for ``quiet_ms`` (None: never)."""
        start = int(after_ms * LINE_RATE / 1000)
        run = int(quiet_ms * LINE_RATE / 1000)
        silent = np.abs(self.played[start:]) < 1.0
        if not silent.any():
            return None
        # First index of a run of `run` silent samples.
        window = np.convolve(silent.astype(np.int32), np.ones(run, dtype=np.int32), "valid")
        hits = np.flatnonzero(window >= run)
        return None if hits.size == 0 else (start + int(hits[0])) * 1000 / LINE_RATE
