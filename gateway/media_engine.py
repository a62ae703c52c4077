"""The per-call media engine: everything a call does with audio, sans-I/O (time passed in).

One :class:`MediaEngine` per call holds the inbound and outbound transforms,
the reflex loop (VAD, echo gate, turn-taking, barge-in, played ledger), the
playout buffer, the pacer, and the mark and clear policy. The reflex loop
hears both directions as narrowband frames tapped on the wire side of the
resamplers (:mod:`media.narrowband`): the caller as decoded from the wire,
before the resampler's delay (2.6 ms with the default polyphase filter, 30 ms
with soxr's) and before the 24 kHz framing, and the assistant as it goes onto
the wire, the very audio whose echo can come back. It reads no clock
and touches no socket, in the manner of h11's ``Connection``: the driver
feeds it what happened, with the time, and carries out the commands it
returns.

- :meth:`MediaEngine.on_ingress` takes a provider event (caller audio, a
  keypad digit, a mark echo) and returns what goes to the brain
  (:class:`BrainAudio` frames, ``speech_started`` / ``speech_stopped``,
  ``dtmf``), in order.
- :meth:`MediaEngine.on_brain` takes a brain event (assistant audio,
  ``audio_clear``, the brain's ``hello``) and returns notices for the driver
  (:class:`PlayoutOverflow`) and any tap events the reflex loop decided on.
- :meth:`MediaEngine.poll` runs the pacer: it returns the provider commands
  due by ``now`` (``clear`` first when one is pending, then audio frames and
  marks). Each 20 ms frame the pacer releases leaves as exactly 20 ms of wire
  audio (the outbound transform's resampler holds 2.6 ms and never bursts), so
  what the pacer counts is what the provider holds.
- :meth:`MediaEngine.next_deadline` says when :meth:`poll` must run next
  absent new input, and :attr:`MediaEngine.wants_poll` says an input moved that
  deadline to *now* (new audio, a clear, a resume), so the driver wakes its pacer.

``gateway.call.Call`` is the production driver (asyncio); the virtual-time
rig (``tests/support/engine_rig.py``), the reflex tests and ``bench/reflex.py``
drive this same object.

**What a brain declares** (its ``hello``; docs/TAP_PROTOCOL.md): a brain
that is not ``interruptible`` is never cut or paused by caller speech, which
then only drives turns (as ``RUTSTER_BARGE_IN=off`` does for every call). A
brain that owns ``turns`` (a full-duplex speech-to-speech brain) gets every
caller frame and no ``speech_started`` / ``speech_stopped``; the core obeys
its ``audio_clear`` at once, and keeps only the echo gate (fed both
directions, so its estimates stay current) and its safety limits (bounded
playout, cut items' audio dropped, spend).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Protocol, runtime_checkable

from rutster.gateway.reflex import (
    ClearProvider,
    EchoJudge,
    Publish,
    ReflexAction,
    ReflexConfig,
    ReflexLoop,
    SpeechDetector,
    WakePacer,
)
from rutster.media.formats import MediaFormat
from rutster.media.ingress_budget import CallerAudioBudget
from rutster.media.narrowband import NarrowbandTap
from rutster.media.pacer import DEFAULT_LEAD_MS, DEFAULT_START_MS, Pacer
from rutster.media.playout import DEFAULT_MAX_MS, PlayoutBuffer
from rutster.media.transform import InboundTransform, OutboundTransform
from rutster.protocols.ingress import (
    AudioReceived,
    ClearPlayback,
    DtmfReceived,
    IngressCommand,
    IngressEvent,
    MarkPlayed,
    PlaceMark,
    PlayAudio,
)
from rutster.protocols.tap import (
    AudioClear,
    AudioOut,
    BrainEvent,
    BrainHello,
    Dtmf,
    SpeechStarted,
    SpeechStopped,
    TurnOwner,
)

__all__ = [
    "DEFAULT_MARK_EVERY_FRAMES",
    "BadInput",
    "BrainAudio",
    "BrainCommand",
    "EngineCommand",
    "MediaEngine",
    "MediaEngineConfig",
    "PlayoutOverflow",
]

#: Send a provider ``mark`` every N outbound frames (10 x 20 ms = 200 ms): enough to
#: know what the caller has heard without doubling the message rate. Seed decision.
DEFAULT_MARK_EVERY_FRAMES = 10


@dataclass(frozen=True, slots=True)
class MediaEngineConfig:
    """The per-call media settings (each default a named constant with its source)."""

    reflex: ReflexConfig = field(default_factory=ReflexConfig)
    playout_max_ms: int = DEFAULT_MAX_MS
    pacer_lead_ms: float = DEFAULT_LEAD_MS
    pacer_start_ms: float = DEFAULT_START_MS
    mark_every_frames: int = DEFAULT_MARK_EVERY_FRAMES


@dataclass(frozen=True, slots=True)
class BrainAudio:
    """Command: send one canonical caller frame to the brain (tap ``audio_in``)."""

    frame: bytes


@dataclass(frozen=True, slots=True)
class PlayoutOverflow:
    """Notice: the brain sent audio faster than playout drains; the oldest was dropped."""

    dropped_samples: int
    #: True for the call's first overflow (the driver logs that one).
    first: bool


@dataclass(frozen=True, slots=True)
class BadInput:
    """Notice: a provider input was dropped (counted); ``reason`` is a stable label."""

    reason: str


#: What goes to the brain, in order.
BrainCommand = BrainAudio | SpeechStarted | SpeechStopped | Dtmf
#: Everything the engine asks of its driver.
EngineCommand = BrainCommand | IngressCommand | PlayoutOverflow | BadInput


@runtime_checkable
class ClosableEcho(Protocol):
    """An echo judge with per-call state worth freeing when the call ends."""

    def close(self) -> None:
        """Free the call's state; the judge is not used again."""


class MediaEngine:
    """One call's media, sans-I/O. Feed it events with the time; do what it returns."""

    def __init__(
        self,
        media_format: MediaFormat,
        *,
        detector: SpeechDetector,
        echo: EchoJudge,
        publish: Publish,
        speech_threshold: float,
        config: MediaEngineConfig = MediaEngineConfig(),
    ) -> None:
        self.config = config
        self.inbound = InboundTransform(media_format)
        #: What the caller may deliver: real time plus a burst (media.ingress_budget).
        self.caller_budget = CallerAudioBudget()
        self.outbound = OutboundTransform(media_format)
        # What the reflex loop hears, each way: the wire's audio, on the wire side of
        # the resamplers, so that it waits for neither (media.narrowband).
        self.caller_band = NarrowbandTap(media_format.sample_rate)
        self.render_band = NarrowbandTap(media_format.sample_rate)
        self.playout = PlayoutBuffer(max_ms=config.playout_max_ms)
        self.pacer = Pacer(
            self.playout, lead_ms=config.pacer_lead_ms, start_ms=config.pacer_start_ms
        )
        self.echo = echo
        self.reflex = ReflexLoop(
            playout=self.playout,
            pacer=self.pacer,
            detector=detector,
            echo=echo,
            publish=publish,
            speech_threshold=speech_threshold,
            config=config.reflex,
        )
        self._publish = publish
        self._mark_every = config.mark_every_frames
        #: The brain owns turn-taking (its hello said ``turns: "brain"``).
        self.brain_turns = False
        #: The brain may be cut by caller speech (its hello did not say otherwise).
        self.brain_interruptible = True
        self._clear_pending = False
        self._now = 0.0
        #: An input moved the next deadline to now: the driver should poll at once.
        self.wants_poll = False
        # Counters (the driver reports them as metrics; tests read them).
        self.frames_in = 0
        self.frames_out = 0
        self.marks_sent = 0
        self.last_mark_played: str | None = None
        #: :meth:`close` ran: every input is ignored from then on.
        self.closed = False

    def close(self) -> None:
        """The call is over: free its DSP state now and ignore every later input.

        A call's objects sit in reference cycles (callbacks, the bus, cancelled tasks'
        tracebacks), so they are freed only by the cyclic GC's full collections, seconds
        to minutes later; under call churn the dead calls' audio history (~0.55 MiB each
        in the echo gate) piled up (the hostile campaign's RSS plateau, bench/
        hostile_campaign.py). Counters stay readable.
        """
        self.closed = True
        self.wants_poll = False
        if isinstance(self.echo, ClosableEcho):
            self.echo.close()

    # ---- provider -> engine --------------------------------------------------

    def on_ingress(self, event: IngressEvent, now_ms: float) -> list[EngineCommand]:
        """One provider event at ``now_ms``; returns brain commands and notices, in order.

        Stream lifecycle events (connected, start, stop) are the driver's and
        return nothing here.
        """
        if self.closed:
            return []
        self._now = now_ms
        if isinstance(event, AudioReceived):
            return self._on_audio(event.payload, now_ms)
        if isinstance(event, DtmfReceived):
            out: list[EngineCommand] = [Dtmf(event.digit)]
            self._apply(self.reflex.on_dtmf(now_ms), out)
            return out
        if isinstance(event, MarkPlayed):
            self.last_mark_played = event.name
            if event.name.isdigit():  # our marks are named by the frame count sent
                self.reflex.on_mark(int(event.name) - 1, now_ms)
        return []

    def _on_audio(self, payload: bytes, now_ms: float) -> list[EngineCommand]:
        duration_ms = self.inbound.wire_format.duration_ms(len(payload))
        if not self.caller_budget.admit(duration_ms, now_ms):
            # More than real time plus a burst: refused whole before any per-frame work,
            # so one peer cannot take the event loop from the other calls.
            return [BadInput("over_real_time")]
        try:
            pcm = self.inbound.decode(payload)
            bands = self.caller_band.push(pcm)
        except ValueError:
            return [BadInput("bad_audio")]
        frames = self.inbound.frames(pcm)
        self.frames_in += len(frames)
        out: list[EngineCommand] = [BrainAudio(frame) for frame in frames]
        if self.brain_turns:
            # The brain listens while it speaks: every frame goes to it, and the
            # echo gate keeps learning from both directions.
            echo = self.echo
            for band in bands:
                echo.capture(band, now_ms)
            return out
        reflex = self.reflex
        for band in bands:
            actions = reflex.on_caller_frame(band, now_ms)
            if actions:
                self._apply(actions, out)
        return out

    def set_brain_connected(self, connected: bool) -> None:
        """The brain connection came up or went down (the call stays up either way)."""
        if self.closed:
            return
        if connected:
            self.reflex.on_brain_up()
        else:
            self.reflex.on_brain_down()

    # ---- brain -> engine -----------------------------------------------------

    def on_brain(self, event: BrainEvent, now_ms: float) -> list[EngineCommand]:
        """One brain event at ``now_ms``; returns tap events and notices for the driver.

        Events that are not about media (tools, usage, errors) return nothing.
        """
        if self.closed:
            return []
        self._now = now_ms
        if isinstance(event, AudioOut):
            out: list[EngineCommand] = []
            accepted, actions = self.reflex.accept_assistant_audio(event.item, now_ms)
            if actions:
                self._apply(actions, out)
            if not accepted:
                return out
            dropped = self.playout.push(event.pcm, event.item)
            if dropped:
                out.append(PlayoutOverflow(dropped, self.playout.overflow_events == 1))
            self.wants_poll = True
            return out
        if isinstance(event, AudioClear):
            out = []
            self._apply(self.reflex.on_audio_clear(now_ms), out)
            return out
        if isinstance(event, BrainHello):
            self._declare(event)
        return []

    def _declare(self, hello: BrainHello) -> None:
        """Take what the brain says it is (each hello: a reconnect may change it)."""
        self.brain_turns = hello.turns is TurnOwner.BRAIN
        self.brain_interruptible = hello.interruptible
        reflex = self.reflex
        barge_in = (
            self.config.reflex.barge_in and hello.interruptible and hello.turns is TurnOwner.CORE
        )
        if reflex.config.barge_in != barge_in:
            reflex.config = replace(reflex.config, barge_in=barge_in)
        self._publish(
            "reflex",
            "brain_declared",
            {"turns": hello.turns.value, "interruptible": hello.interruptible},
        )

    # ---- reflex actions --------------------------------------------------------

    def _apply(self, actions: list[ReflexAction], out: list[EngineCommand]) -> None:
        for action in actions:
            if isinstance(action, ClearProvider):
                self.outbound.reset()  # drop the resampler's held tail of the cut audio
                self.render_band.reset()
                self._clear_pending = True
                self.wants_poll = True
            elif isinstance(action, WakePacer):
                self.wants_poll = True
            elif not self.brain_turns:
                out.append(action)

    # ---- the pacer -----------------------------------------------------------

    def poll(self, now_ms: float) -> list[IngressCommand]:
        """The provider commands due by ``now_ms``: a pending clear, frames, marks."""
        if self.closed:
            return []
        self._now = now_ms
        self.wants_poll = False
        out: list[IngressCommand] = []
        if self._clear_pending:
            self._clear_pending = False
            out.append(ClearPlayback())
        reflex = self.reflex
        if reflex.paused:
            return out
        pacer = self.pacer
        frames = pacer.poll(now_ms)
        for shed in pacer.last_shed:
            reflex.ledger.skipped(shed)
        if frames:
            outbound = self.outbound
            mark_every = self._mark_every
            for frame in frames:
                reflex.on_frame_sent(frame, now_ms)
                wire = outbound.resample(frame.pcm)
                if wire:
                    self._render(wire, now_ms)
                    out.append(PlayAudio(outbound.encode(wire)))
                self.frames_out += 1
                if self.frames_out % mark_every == 0:
                    self.marks_sent += 1
                    out.append(PlaceMark(str(self.frames_out)))
        return out

    def _render(self, wire: bytes, now_ms: float) -> None:
        """Tell the echo judge what went onto the wire at ``now_ms`` (the echo it can cause)."""
        echo = self.echo
        for band in self.render_band.push(wire):
            echo.render(band, now_ms)

    def next_deadline(self) -> float | None:
        """When :meth:`poll` must next run absent new input (``None``: not until some).

        A time at or before the last one given means at once.
        """
        if self.closed:
            return None
        now = self._now
        if self._clear_pending:
            return now
        if self.reflex.paused:
            return None
        return self.pacer.next_poll_ms(now)
