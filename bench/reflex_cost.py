"""Where the per-call engine's CPU goes: ``python -m bench.reflex_cost``.

The reflex benchmark (``bench/reflex.py``) prints one figure for the engine's
cost, measured while the rig simulates the call around it, on a VM whose speed
moves by a third from one hour to the next. This script splits that figure by
component and by kind of call, and measures each by **replay**, the steadier
way:

1. a call is simulated once on the virtual-time rig (``tests/support/engine_rig.py``)
   with heldout material of ``bench/eval_corpus.py`` (the last call, the capacity
   benchmarks' echo-brain load, with their own caller fixture), and every input the
   production per-call engine (``gateway/media_engine.py`` ``MediaEngine``, the
   object ``Call`` drives) got is recorded, with its time;
2. the inputs are replayed into a fresh engine, built as ``Call`` builds one
   (default VAD, echo gate, reflex settings), with nothing else running: the
   **engine** figure. A recording replay also keeps what the engine handed each
   component (the echo gate's render and capture frames, the VAD's frames, the
   transforms' audio);
3. each component is replayed alone on those inputs: **echo gate** (render and
   capture, the line canceller inside), **VAD** (the default cascade: energy
   gate, Silero while it is open), **inbound** (μ-law decode, 8 -> 24 kHz for
   the brain, the reflex loop's narrowband tap), **outbound** (24 -> 8 kHz,
   μ-law encode, the render tap). *Rest* is the engine less those four: the
   reflex state machine, playout, pacer, ledger, marks and the engine's glue.

Every figure is the least of ``--repeats`` replays (the least is the run the
VM disturbed least), in µs per 20 ms caller frame of the call, and the engine's
as % of one core per call. Replays give the same verdicts as the recording
(checked: each input's count of engine outputs, against the simulated call's).

Usage: ``python -m bench.reflex_cost [--repeats N] [--split heldout|tune]`` (from the checkout)
"""

from __future__ import annotations

import argparse
import time
import wave
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import soxr

from bench.eval_corpus import Utterance, scale_to_dbfs, utterances
from bench.vs_pipecat import SPEECH_WAV
from rutster.gateway.media_engine import MediaEngine, MediaEngineConfig
from rutster.gateway.reflex import ReflexConfig
from rutster.gateway.server import limit_numeric_threads
from rutster.media import compiled
from rutster.media.echo_gate import EchoGate, EchoVerdict
from rutster.media.formats import TWILIO_MULAW_8K
from rutster.media.narrowband import NarrowbandTap
from rutster.media.transform import InboundTransform, OutboundTransform
from rutster.media.vad import DEFAULT_DETECTOR, SPEECH_THRESHOLD, SpeechDetector, make_detector
from rutster.protocols.ingress import AudioReceived, IngressEvent
from rutster.protocols.tap import BrainEvent, BrainHello
from rutster.tools.realtime_mock_voice import synthesize_reply
from tests.support.engine_rig import (
    RATE,
    InterruptingCaller,
    Interruption,
    ReflexRig,
    ScriptedBrain,
)

#: Replays per figure; the least is printed (seed decision: 5 was within a few % of 9).
REPEATS = 5
#: Simulated length of the calls without interruptions (s).
CALL_S = 30.0
#: The interruption calls: as bench/reflex.py's (levels, offsets, reply, think time).
INTERRUPTIONS = 12
CALLER_LEVELS_DBFS = (-35.0, -28.0, -22.0, -16.0, -12.0, -25.0, -31.0, -19.0)
OFFSETS_MS = (300.0, 750.0, 450.0, 900.0, 600.0, 350.0, 800.0, 500.0)
REPLY_MS = 8_000
THINK_MS = 300.0
#: Caller level of the calls where the caller talks alone (dBFS, the issue's ordinary phone level).
CALLER_DBFS = -22.0
#: The echo of the echo scenarios: 10 dB return loss at 200 ms (a bench/reflex.py line).
ECHO = (200.0, 10.0)
FRAMES_PER_S = 50
#: How late the echo brain's copy of each caller frame starts playing in the echo-brain
#: call (ms): a frame's trip to the brain and back on loopback plus the playout's start
#: (seed decision; the capacity benchmarks hear their echo 48-50 ms late at light load).
ECHO_BRAIN_MS = 50.0

Input = tuple[str, object, float]


class _RecordingEngine:
    """The rig's engine, every input it gets recorded (name, event, time) before it runs."""

    def __init__(self, engine: MediaEngine, log: list[Input]) -> None:
        self._engine = engine
        self._log = log
        #: How many commands each input gave in the simulated call (what replays must give).
        self.counts: list[int] = []

    def on_ingress(self, event: IngressEvent, now_ms: float) -> object:
        self._log.append(("ingress", event, now_ms))
        out = self._engine.on_ingress(event, now_ms)
        self.counts.append(len(out))
        return out

    def on_brain(self, event: BrainEvent, now_ms: float) -> object:
        self._log.append(("brain", event, now_ms))
        out = self._engine.on_brain(event, now_ms)
        self.counts.append(len(out))
        return out

    def poll(self, now_ms: float) -> object:
        self._log.append(("poll", None, now_ms))
        out = self._engine.poll(now_ms)
        self.counts.append(len(out))
        return out

    def set_brain_connected(self, connected: bool) -> None:
        self._log.append(("link", connected, 0.0))
        self._engine.set_brain_connected(connected)

    def __getattr__(self, name: str) -> object:
        return getattr(self._engine, name)


@dataclass
class _Taps:
    """What a recording replay handed each component."""

    echo: list[tuple[str, object, float]] = field(default_factory=list)
    vad: list[tuple[bytes, bool]] = field(default_factory=list)
    outbound: list[bytes] = field(default_factory=list)


class _TappedEcho:
    def __init__(self, gate: EchoGate, taps: _Taps) -> None:
        self._gate = gate
        self._taps = taps

    def render(self, frame: bytes, sent_ms: float) -> None:
        self._taps.echo.append(("render", frame, sent_ms))
        self._gate.render(frame, sent_ms)

    def capture(self, frame: bytes, now_ms: float) -> EchoVerdict:
        self._taps.echo.append(("capture", frame, now_ms))
        return self._gate.capture(frame, now_ms)

    def unplayed(self, frames: int) -> None:
        self._taps.echo.append(("unplayed", frames, 0.0))
        self._gate.unplayed(frames)


class _TappedDetector:
    def __init__(self, detector: SpeechDetector, taps: _Taps) -> None:
        self._detector = detector
        self._taps = taps

    def process(self, frame: bytes, near_end: bool = True) -> float:
        self._taps.vad.append((frame, near_end))
        return self._detector.process(frame, near_end)

    def reset(self) -> None:
        self._detector.reset()


class _TappedOutbound:
    def __init__(self, transform: OutboundTransform, taps: _Taps) -> None:
        self._transform = transform
        self._taps = taps

    def resample(self, pcm: bytes) -> bytes:
        self._taps.outbound.append(pcm)
        return self._transform.resample(pcm)

    def encode(self, pcm: bytes) -> bytes:
        return self._transform.encode(pcm)

    def reset(self) -> None:
        self._taps.outbound.append(b"")  # a clear: the resampler's tail is dropped
        self._transform.reset()


def _engine(echo: object | None = None, detector: SpeechDetector | None = None) -> MediaEngine:
    """A fresh engine as ``Call`` builds one (default VAD and echo gate)."""
    return MediaEngine(
        TWILIO_MULAW_8K,
        detector=detector if detector is not None else make_detector(DEFAULT_DETECTOR),
        echo=echo if echo is not None else EchoGate(),  # type: ignore[arg-type]
        publish=lambda stage, kind, payload: None,
        speech_threshold=SPEECH_THRESHOLD,
        config=MediaEngineConfig(reflex=ReflexConfig()),
    )


def _replay(engine: MediaEngine, inputs: list[Input]) -> tuple[int, list[int]]:
    """Feed ``inputs``; returns the ns it took and the number of outputs of each input."""
    counts: list[int] = []
    on_ingress, on_brain, poll = engine.on_ingress, engine.on_brain, engine.poll
    started = time.perf_counter_ns()
    for kind, event, now in inputs:
        if kind == "ingress":
            counts.append(len(on_ingress(event, now)))  # type: ignore[arg-type]
        elif kind == "brain":
            counts.append(len(on_brain(event, now)))  # type: ignore[arg-type]
        elif kind == "poll":
            counts.append(len(poll(now)))
        else:
            engine.set_brain_connected(bool(event))
    return time.perf_counter_ns() - started, counts


def _least(repeats: int, run: Callable[[], int]) -> int:
    return min(run() for _ in range(repeats))


@dataclass
class Cost:
    """One kind of call's figures: ns over the call's caller frames."""

    name: str
    frames: int
    engine_ns: int
    echo_ns: int
    vad_ns: int
    inbound_ns: int
    outbound_ns: int
    silero_windows: int

    def per_frame(self, ns: int) -> float:
        return ns / 1e3 / self.frames


def measure(name: str, rig: ReflexRig, repeats: int) -> Cost:
    """Simulate ``rig`` once, recording the engine's inputs; replay them (module doc)."""
    # The rig connected the brain (and gave the engine the brain's hello, if it has one)
    # as it was built, before the recording began.
    inputs: list[Input] = [("link", True, 0.0)]
    if rig.hello is not None:
        inputs.append(("brain", rig.hello, 0.0))
    before = sum(1 for kind, _, _ in inputs if kind != "link")  # replayed, not recorded
    recording = _RecordingEngine(rig.engine, inputs)
    rig.engine = recording  # type: ignore[assignment]
    rig.run()
    taps = _Taps()
    recorded_engine = _engine(_TappedEcho(EchoGate(), taps), _TappedDetector(make_detector(), taps))
    recorded_engine.outbound = _TappedOutbound(recorded_engine.outbound, taps)  # type: ignore[assignment]
    _, reference = _replay(recorded_engine, inputs)
    if reference[before:] != recording.counts:
        raise AssertionError(f"{name}: the replay's outputs differ from the simulated call's")

    def engine_run() -> int:
        ns, counts = _replay(_engine(), inputs)
        if counts != reference:
            raise AssertionError(f"{name}: a replay's outputs differ from the recording's")
        return ns

    def echo_run() -> int:
        gate = EchoGate()
        started = time.perf_counter_ns()
        for kind, arg, now in taps.echo:
            if kind == "render":
                gate.render(arg, now)  # type: ignore[arg-type]
            elif kind == "capture":
                gate.capture(arg, now)  # type: ignore[arg-type]
            else:
                gate.unplayed(arg)  # type: ignore[arg-type]
        return time.perf_counter_ns() - started

    def vad_run() -> int:
        detector = make_detector()
        process = detector.process
        started = time.perf_counter_ns()
        for frame, near_end in taps.vad:
            process(frame, near_end)
        return time.perf_counter_ns() - started

    payloads = [
        e.payload for kind, e, _ in inputs if kind == "ingress" and isinstance(e, AudioReceived)
    ]

    def inbound_run() -> int:
        transform = InboundTransform(TWILIO_MULAW_8K)
        tap = NarrowbandTap(TWILIO_MULAW_8K.sample_rate)
        started = time.perf_counter_ns()
        for payload in payloads:
            pcm = transform.decode(payload)
            tap.push(pcm)
            transform.frames(pcm)
        return time.perf_counter_ns() - started

    def outbound_run() -> int:
        transform = OutboundTransform(TWILIO_MULAW_8K)
        tap = NarrowbandTap(TWILIO_MULAW_8K.sample_rate)
        started = time.perf_counter_ns()
        for pcm in taps.outbound:
            if not pcm:
                transform.reset()
                tap.reset()
                continue
            wire = transform.resample(pcm)
            if wire:
                tap.push(wire)
                transform.encode(wire)
        return time.perf_counter_ns() - started

    # Frames on which the cascade ran Silero (its ``active`` after each frame).
    cascade = make_detector()
    windows = 0
    for frame, near_end in taps.vad:
        cascade.process(frame, near_end)
        windows += int(bool(getattr(cascade, "active", False)))
    return Cost(
        name=name,
        frames=len(taps.vad),
        engine_ns=_least(repeats, engine_run),
        echo_ns=_least(repeats, echo_run),
        vad_ns=_least(repeats, vad_run),
        inbound_ns=_least(repeats, inbound_run),
        outbound_ns=_least(repeats, outbound_run),
        silero_windows=windows,
    )


def _caller_speech(speech: list[Utterance], seconds: float) -> list[tuple[bytes, float]]:
    """Utterances one after another, 300 ms apart, cycled until ``seconds`` is full."""
    placed: list[tuple[bytes, float]] = []
    at = 0.5
    for i in range(10_000):
        u = speech[i % len(speech)]
        length = len(u.pcm24) / 2 / RATE
        if at + length > seconds - 0.5:
            break
        placed.append((scale_to_dbfs(u.pcm24, CALLER_DBFS), at))
        at += length + 0.3
    return placed


def scenarios(split: str) -> list[tuple[str, Callable[[], ReflexRig]]]:
    """The kinds of call measured, each a rig factory."""
    speakers: dict[str, list[Utterance]] = {}
    for u in utterances(split):
        speakers.setdefault(u.speaker, []).append(u)
    names = sorted(speakers)
    # The caller alone: every speaker of the split in turn; the interrupter: the
    # second speaker by name (the first may have one utterance only).
    caller = [u for name in names for u in speakers[name]]
    other = speakers[names[1]]
    voice = synthesize_reply(REPLY_MS)

    def idle() -> ReflexRig:
        return ReflexRig(seconds=CALL_S, noise_dbfs=-65.0)

    def caller_alone() -> ReflexRig:
        rig = ReflexRig(seconds=CALL_S, noise_dbfs=-65.0)
        for pcm, at in _caller_speech(caller, CALL_S):
            rig.caller_audio(pcm, at_s=at)
        return rig

    def assistant_alone() -> ReflexRig:
        rig = ReflexRig(seconds=CALL_S, echo_delay_ms=ECHO[0], echo_loss_db=ECHO[1])
        reply = synthesize_reply(int((CALL_S - 1.0) * 1000))
        rig.say(reply, "reply", at_s=0.5)
        return rig

    def interruptions(echo: bool) -> Callable[[], ReflexRig]:
        def build() -> ReflexRig:
            chosen = [other[i % len(other)] for i in range(INTERRUPTIONS + 1)]
            scaled = [
                scale_to_dbfs(u.pcm24, CALLER_LEVELS_DBFS[i % len(CALLER_LEVELS_DBFS)])
                for i, u in enumerate(chosen)
            ]
            plan = [
                Interruption(pcm, OFFSETS_MS[i % len(OFFSETS_MS)])
                for i, pcm in enumerate(scaled[1:])
            ]
            seconds = 2.0 + sum(len(p) / 2 / RATE * 2 + REPLY_MS / 1000 + 5.0 for p in scaled)
            rig = ReflexRig(
                seconds=seconds,
                echo_delay_ms=ECHO[0],
                echo_loss_db=ECHO[1] if echo else None,
                brain=ScriptedBrain([voice], think_ms=THINK_MS),
                caller=InterruptingCaller(plan, recovery=scaled[0], done_after_ms=3_500.0),
            )
            rig.caller_audio(scaled[0], at_s=0.5)
            return rig

        return build

    def echo_brain() -> ReflexRig:
        # The capacity benchmarks' load (bench/vs_pipecat.py): their caller fixture (one
        # recording talking the whole call, at its own level) over the echo brain, which
        # declares itself not interruptible and says back each caller frame as it comes
        # (one item, ECHO_BRAIN_MS late); the line has no echo, so the gate never finds
        # a delay. Not the split's material: the load's own, for comparing with it.
        rig = ReflexRig(
            seconds=CALL_S,
            echo_loss_db=None,
            hello=BrainHello("echo", "bench", interruptible=False),
        )
        with wave.open(str(SPEECH_WAV)) as recording:
            line = np.frombuffer(recording.readframes(recording.getnframes()), dtype="<i2")
        pcm = np.clip(np.rint(soxr.resample(line.astype(np.float64), 8_000, RATE)), -32768, 32767)
        speech = pcm.astype("<i2").tobytes()
        rig.caller_audio(speech, at_s=0.5)
        timeline = bytearray(int(CALL_S * RATE) * 2)
        start = int(0.5 * RATE) * 2
        timeline[start:] = speech[: len(timeline) - start]
        # Every frame comes back, the pauses' silence too, as the echo brain sends it.
        frame = RATE * 2 // FRAMES_PER_S
        for a in range(0, len(timeline), frame):
            rig.say(bytes(timeline[a : a + frame]), "echo", a / 2 / RATE + ECHO_BRAIN_MS / 1000)
        return rig

    return [
        ("idle line (-65 dBFS noise)", idle),
        (f"caller talking alone ({CALLER_DBFS:.0f} dBFS)", caller_alone),
        ("assistant alone, echo 10 dB 200 ms", assistant_alone),
        ("12 interruptions, clean line", interruptions(False)),
        ("12 interruptions, echo 10 dB 200 ms", interruptions(True)),
        ("echo brain load (its caller fixture)", echo_brain),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--split", choices=("heldout", "tune"), default="heldout")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    limit_numeric_threads()  # as rutster serve runs the engine
    print(
        f"per-call engine cost by replay ({args.split} split material; least of {args.repeats} "
        f"replays; µs per 20 ms caller frame; media kernels: {compiled.describe()})"
    )
    print(
        f"{'call':38} {'engine':>7} {'% core':>7} {'echo gate':>9} {'VAD':>6} "
        f"{'inbound':>7} {'outbound':>8} {'rest':>6} {'Silero on':>9}"
    )
    for name, build in scenarios(args.split):
        cost = measure(name, build(), args.repeats)
        parts = cost.echo_ns + cost.vad_ns + cost.inbound_ns + cost.outbound_ns
        share = cost.silero_windows / max(cost.frames, 1) * 100
        print(
            f"{name:38} {cost.per_frame(cost.engine_ns):7.1f} "
            f"{cost.engine_ns / 1e9 / (cost.frames / FRAMES_PER_S) * 100:6.3f}% "
            f"{cost.per_frame(cost.echo_ns):9.1f} {cost.per_frame(cost.vad_ns):6.1f} "
            f"{cost.per_frame(cost.inbound_ns):7.1f} {cost.per_frame(cost.outbound_ns):8.1f} "
            f"{cost.per_frame(max(0, cost.engine_ns - parts)):6.1f} {share:8.0f}%"
        )
    print(
        "engine: everything MediaEngine does (goal <= 0.2 % of a core per call, 40 µs a frame); "
        "rest: engine less the four parts; Silero on: share of frames the VAD cascade ran Silero"
    )


if __name__ == "__main__":
    main()
