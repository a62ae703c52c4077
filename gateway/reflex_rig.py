"""A virtual-time rig for the reflex loop: a caller, an assistant, a phone line with echo.

Used by the tests (``tests/test_reflex.py``) and the benchmark
(``bench/reflex.py``); not used by the gateway itself.

Drives :class:`gateway.reflex.ReflexLoop` frame by frame exactly as the call's
glue does (pacer poll, frames sent, caller frame in, actions out), with a fake
clock. What the caller's line carries back is built from what the provider
actually played (the ledger's timeline, so a ``clear`` really stops it):
delayed, attenuated and passed through the 8 kHz μ-law path like a real echo,
plus whatever near-end audio the test places on the caller's timeline.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from brains.tap import SpeechStarted, SpeechStopped
from gateway.reflex import ClearProvider, ReflexAction, ReflexConfig, ReflexLoop, WakePacer
from media.echo_gate import EchoGate
from media.g711 import ulaw_decode, ulaw_encode
from media.pacer import Pacer
from media.playout import PlayoutBuffer
from media.resample import StreamResampler
from media.vad import SPEECH_THRESHOLD, make_detector

RATE = 24_000
FRAME = 480
FRAME_MS = 20


def phone_path(pcm24: np.ndarray) -> np.ndarray:
    """24 kHz → 8 kHz μ-law → 24 kHz, as audio crossing a phone line (float64 out)."""
    down = StreamResampler(RATE, 8_000)
    up = StreamResampler(8_000, RATE)
    raw = pcm24.astype("<i2").tobytes()
    narrow = down.process(raw) + down.flush()
    back = up.process(ulaw_decode(ulaw_encode(narrow))) + up.flush()
    out = np.frombuffer(back, dtype="<i2").astype(np.float64)
    return np.pad(out, (0, max(0, pcm24.size - out.size)))[: pcm24.size]


@dataclass
class Step:
    """What happened at one caller frame."""

    index: int
    at_ms: float
    actions: list[ReflexAction]
    state: str


@dataclass
class ReflexRig:
    """The rig. Place near-end audio with :meth:`caller_audio`, assistant audio with :meth:`say`."""

    seconds: float
    echo_delay_ms: float = 200.0
    echo_loss_db: float | None = 15.0  # None: no echo at all
    config: ReflexConfig = field(default_factory=ReflexConfig)
    detector: str | None = None
    noise_dbfs: float = -65.0

    def __post_init__(self) -> None:
        n = int(self.seconds * RATE)
        self.near = np.zeros(n)
        self.played = np.zeros(n + RATE)  # what the provider played, on the caller's clock
        self.events: list[tuple[str, str, dict[str, object]]] = []
        self.playout = PlayoutBuffer()
        self.pacer = Pacer(self.playout)
        self.reflex = ReflexLoop(
            playout=self.playout,
            pacer=self.pacer,
            detector=make_detector(self.detector) if self.detector else make_detector(),
            echo=EchoGate(),
            publish=lambda stage, kind, payload: self.events.append((stage, kind, dict(payload))),
            speech_threshold=SPEECH_THRESHOLD,
            config=self.config,
        )
        self.reflex.on_brain_up()
        self.steps: list[Step] = []
        self.now = 0.0
        rng = np.random.default_rng(7)
        self.line_noise = rng.normal(0, 32768 * 10 ** (self.noise_dbfs / 20), n)
        self.pending_say: list[tuple[float, bytes, str]] = []
        self.reflex_ns = 0

    def caller_audio(self, pcm24: bytes, at_s: float, gain_db: float = 0.0) -> None:
        """Place near-end audio (24 kHz s16) at ``at_s`` on the caller's timeline."""
        samples = np.frombuffer(pcm24, dtype="<i2").astype(np.float64) * 10 ** (gain_db / 20)
        start = int(at_s * RATE)
        end = min(self.near.size, start + samples.size)
        self.near[start:end] += samples[: end - start]

    def say(self, pcm24: bytes, item: str, at_s: float) -> None:
        """The brain sends ``pcm24`` for ``item`` at ``at_s`` (all at once, like a burst)."""
        self.pending_say.append((at_s, pcm24, item))

    def run(self) -> ReflexRig:
        """Step through the whole timeline, 20 ms at a time.

        ``reflex_ns`` accumulates the time spent inside ``on_caller_frame`` (VAD,
        echo judge and state machine): the reflex cost per caller frame.
        """
        total = int(self.seconds * 1000 / FRAME_MS)
        echo_gain = None if self.echo_loss_db is None else 10 ** (-self.echo_loss_db / 20)
        delay = int(self.echo_delay_ms * RATE / 1000)
        line = np.zeros(self.near.size)
        for index in range(total):
            self.now = index * FRAME_MS
            for entry in list(self.pending_say):
                if entry[0] * 1000 <= self.now:
                    self.pending_say.remove(entry)
                    accepted, acts = self.reflex.accept_assistant_audio(entry[2], self.now)
                    if accepted:
                        self.playout.push(entry[1], entry[2])
                    self._apply(acts)
                    if acts:
                        self.steps.append(Step(index, self.now, acts, self.reflex.state.value))
            if not self.reflex.paused:
                for frame in self.pacer.poll(self.now):
                    sent = self.reflex.on_frame_sent(frame, self.now)
                    a = int(sent.play_start_ms * RATE / 1000)
                    pcm = np.frombuffer(frame.pcm, dtype="<i2").astype(np.float64)
                    self.played[a : a + FRAME] = pcm
            # The caller frame that ends now: near-end + echo of what played + noise.
            a, b = (index) * FRAME, (index + 1) * FRAME
            if b > self.near.size:
                break
            if echo_gain is not None and a - delay >= 0:
                line[a:b] = self.played[a - delay : b - delay] * echo_gain
            mixed = self.near[a:b] + line[a:b] + self.line_noise[a:b]
            frame_pcm = np.clip(mixed, -32768, 32767).astype("<i2").tobytes()
            t0 = time.perf_counter_ns()
            acts = self.reflex.on_caller_frame(frame_pcm, self.now + FRAME_MS)
            self.reflex_ns += time.perf_counter_ns() - t0
            self._apply(acts)
            self.steps.append(Step(index, self.now + FRAME_MS, acts, self.reflex.state.value))
        return self

    def _apply(self, actions: list[ReflexAction]) -> None:
        for action in actions:
            if isinstance(action, ClearProvider):
                # The provider dropped its queue: nothing it had not played yet plays.
                a = int(self.now * RATE / 1000)
                self.played[a:] = 0.0
            elif isinstance(action, WakePacer | SpeechStarted | SpeechStopped):
                pass

    # ---- reading the run ----------------------------------------------------

    def first(self, kind: type) -> Step | None:
        """The first step whose actions include one of ``kind``."""
        for step in self.steps:
            if any(isinstance(a, kind) for a in step.actions):
                return step
        return None

    def actions_of(self, kind: type) -> list[tuple[Step, ReflexAction]]:
        """Every action of ``kind`` with the step it came from."""
        return [(s, a) for s in self.steps for a in s.actions if isinstance(a, kind)]

    def states(self) -> list[str]:
        """The sequence of states entered (consecutive repeats folded)."""
        out: list[str] = []
        for _, kind, payload in self.events:
            if kind == "state":
                out.append(str(payload["to"]))
        return out

    def of_type(self, kind: str) -> list[dict[str, object]]:
        """Payloads of the bus events of one type."""
        return [p for _, k, p in self.events if k == kind]
