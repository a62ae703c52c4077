"""The per-call media engine: what a brain declares, full-duplex brains, the driver contract.

The rig (``tests/support/engine_rig.py``) drives the same ``MediaEngine`` that
``Call`` drives; the last test drives it through the gateway under uvicorn,
with a full-duplex brain that interrupts itself over a real WebSocket.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tracemalloc

import numpy as np
import numpy.typing as npt
import pytest
import soxr
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from rutster.gateway.media_engine import BadInput, BrainAudio, MediaEngine
from rutster.media.echo_gate import EchoGate
from rutster.media.formats import (
    CANONICAL_FRAME_BYTES,
    FRAME_MS,
    TWILIO_MULAW_8K,
    Encoding,
    MediaFormat,
)
from rutster.media.g711 import ulaw_encode
from rutster.media.pacer import DEFAULT_LEAD_MS
from rutster.media.vad import SPEECH_THRESHOLD, make_detector
from rutster.protocols.ingress import AudioReceived, ClearPlayback, MarkPlayed, PlaceMark, PlayAudio
from rutster.protocols.tap import (
    AudioClear,
    AudioIn,
    AudioOut,
    BrainHello,
    Direction,
    Hello,
    SpeechStarted,
    SpeechStopped,
    TapDecoder,
    TapEncoder,
    TurnOwner,
)
from rutster.tools.realtime_mock_voice import synthesize_reply
from rutster.tools.twilio_simulator import media_message
from tests.conftest import eventually, gateway_config, serve_gateway
from tests.support.engine_rig import LINE_RATE, RATE, ReflexRig
from tests.test_gateway_calls import start_stream

REPLY = synthesize_reply(4_000)
CALLER = synthesize_reply(1_500, seed=5)
DUPLEX = BrainHello("duplex", "1", turns=TurnOwner.BRAIN)
UNINTERRUPTIBLE = BrainHello("announcer", "1", interruptible=False)


def new_engine() -> MediaEngine:
    return MediaEngine(
        TWILIO_MULAW_8K,
        detector=make_detector("energy"),
        echo=EchoGate(),
        publish=lambda *_: None,
        speech_threshold=SPEECH_THRESHOLD,
    )


def test_a_brain_that_must_not_be_interrupted_is_never_cut() -> None:
    rig = ReflexRig(seconds=5.0, echo_loss_db=None, hello=UNINTERRUPTIBLE)
    rig.say(REPLY, "announcement", at_s=0.2)
    rig.caller_audio(CALLER, at_s=1.0)
    rig.run()
    assert rig.first(ClearPlayback) is None
    assert rig.reflex.counters.pauses == 0
    started = [a for _, a in rig.actions_of(SpeechStarted)]
    # Caller speech still drives turns, but never as an interruption.
    assert started and not any(a.interrupted for a in started)
    assert rig.heard_ms("announcement", 5_000) >= 3_900


def test_the_same_call_without_the_declaration_is_cut() -> None:
    rig = ReflexRig(seconds=5.0, echo_loss_db=None)
    rig.say(REPLY, "answer", at_s=0.2)
    rig.caller_audio(CALLER, at_s=1.0)
    rig.run()
    assert rig.first(ClearPlayback) is not None
    assert rig.heard_ms("answer", 5_000) < 1_200


def test_a_full_duplex_brain_that_interrupts_itself() -> None:
    """turns: brain — every frame forwarded, no speech events, audio_clear obeyed at once."""
    rig = ReflexRig(seconds=5.0, echo_loss_db=None, hello=DUPLEX)
    rig.say(REPLY, "first", at_s=0.2)
    rig.caller_audio(CALLER, at_s=1.0)  # talks over the brain: the core does nothing
    rig.brain_event(AudioClear(), at_s=1.6)  # the brain heard it and stops itself
    rig.say(REPLY[: RATE * 2], "second", at_s=2.8)  # ...then answers (1 s)
    rig.run()
    assert not rig.actions_of(SpeechStarted) and not rig.actions_of(SpeechStopped)
    assert rig.reflex.counters.pauses == 0
    assert rig.clears_ms == [1_600]
    # Every canonical frame the inbound resampler made (248 of 250: its warm-up).
    assert rig.brain_frames == rig.engine.frames_in >= 248
    # Nothing of the first item after the clear; the second plays in full.
    assert 1_360 - 40 <= rig.heard_ms("first", 5_000) <= 1_400
    assert rig.heard_ms("second", 5_000) >= 950
    assert rig.playout.buffered_samples == 0


def test_a_reconnected_brain_may_change_what_it_declares() -> None:
    engine = new_engine()
    engine.on_brain(DUPLEX, 0.0)
    assert engine.brain_turns and not engine.reflex.config.barge_in
    engine.on_brain(BrainHello("plain", "2"), 10.0)
    assert not engine.brain_turns and engine.reflex.config.barge_in


def test_bad_caller_audio_is_a_counted_drop() -> None:
    engine = MediaEngine(
        MediaFormat(Encoding.L16, 8_000),
        detector=make_detector("energy"),
        echo=EchoGate(),
        publish=lambda *_: None,
        speech_threshold=SPEECH_THRESHOLD,
    )
    assert engine.on_ingress(AudioReceived(b"\x00\x01\x02", None), 0.0) == [BadInput("bad_audio")]
    assert engine.frames_in == 0


def test_driver_contract_deadlines_marks_and_polls() -> None:
    engine = new_engine()
    engine.set_brain_connected(True)
    assert engine.next_deadline() is None and not engine.wants_poll
    frames = engine.on_ingress(AudioReceived(ulaw_encode(bytes(960)), None), 20.0)
    assert {type(c) for c in frames} == {BrainAudio} and engine.frames_in == len(frames) >= 1
    engine.on_brain(AudioOut(REPLY[: RATE * 2], "a"), 20.0)  # 1 s of assistant audio
    assert engine.wants_poll and engine.next_deadline() == 20.0
    sent: list[object] = []
    now = 20.0
    deadline: float | None = now
    while deadline is not None:
        assert deadline < 1_200.0
        now = max(now, deadline)
        sent += engine.poll(now)
        deadline = engine.next_deadline()
    audio = [c for c in sent if isinstance(c, PlayAudio)]
    marks = [c for c in sent if isinstance(c, PlaceMark)]
    assert len(audio) >= 50 and [m.name for m in marks] == [str(10 * n) for n in range(1, 6)]
    # Marks come back as playback reaches them; the ledger takes the later time.
    engine.on_ingress(MarkPlayed("10"), 400.0)
    assert engine.last_mark_played == "10"
    assert engine.reflex.ledger.marks_applied == 1


class DuplexBrain:
    """A tap brain over a real WebSocket that owns turns and interrupts itself.

    It declares ``turns: "brain"``, sends a 4 s answer at once, and, after
    hearing ``cut_after`` caller frames of speech-level audio, sends
    ``audio_clear`` (it decided to stop talking), then a short new answer.
    """

    def __init__(self, cut_after: int = 10) -> None:
        self.cut_after = cut_after
        self.events: list[object] = []
        self.url = ""

    async def handle(self, ws: ServerConnection) -> None:
        decoder = TapDecoder(Direction.CORE_TO_BRAIN)
        encoder = TapEncoder(start_ms=0.0)
        loud = 0
        cut = False
        with contextlib.suppress(ConnectionClosed):
            async for message in ws:
                event = decoder.decode(message)
                self.events.append(event)
                if isinstance(event, Hello):
                    await ws.send(encoder.encode(DUPLEX, 0.0))
                    for a in range(0, len(REPLY), RATE * 2):
                        await ws.send(encoder.encode(AudioOut(REPLY[a : a + RATE * 2], "one"), 0.0))
                elif isinstance(event, AudioIn) and not cut:
                    x = np.frombuffer(event.pcm, dtype="<i2").astype(np.float64)
                    loud += float(np.sqrt(np.mean(x * x))) > 1_000
                    if loud >= self.cut_after:
                        cut = True
                        await ws.send(encoder.encode(AudioClear(), 0.0))
                        short = REPLY[: RATE * 2]
                        await ws.send(encoder.encode(AudioOut(short, "two"), 0.0))


async def test_full_duplex_brain_over_the_gateway_interrupts_itself() -> None:
    brain = DuplexBrain()
    async with serve(brain.handle, "127.0.0.1", 0, compression=None) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        brain.url = f"ws://127.0.0.1:{port}/duplex"
        async with serve_gateway(gateway_config(brain.url)) as gateway:
            ws, stream_sid, _ = await start_stream(gateway)
            events: list[str] = []

            async def read() -> None:
                with contextlib.suppress(ConnectionClosed):
                    async for raw in ws:
                        events.append(json.loads(raw)["event"])

            reader = asyncio.create_task(read())
            await eventually(lambda: "media" in events)
            # The caller talks over the answer (speech-level voiced audio, 8 kHz).
            voice = np.frombuffer(synthesize_reply(1_500, seed=9), dtype="<i2")[::3]
            mulaw = ulaw_encode(voice.astype("<i2").tobytes())
            for seq, n in enumerate(range(0, len(mulaw), 160), start=2):
                await ws.send(media_message(stream_sid, seq, seq, n // 8, mulaw[n : n + 160]))
                await asyncio.sleep(0.02)
            await eventually(lambda: "clear" in events, 5.0)
            await asyncio.sleep(1.0)
            await ws.close()
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            await eventually(lambda: not gateway.state.calls)
    # The brain heard every caller frame and got no turn events from the core.
    assert not [e for e in brain.events if isinstance(e, SpeechStarted | SpeechStopped)]
    assert len([e for e in brain.events if isinstance(e, AudioIn)]) >= 70
    # Twilio got exactly one clear, the brain's, and the new answer played after it.
    assert events.count("clear") == 1
    assert events[events.index("clear") :].count("media") >= 40


def test_a_real_time_stream_with_jitter_keeps_a_bounded_delay() -> None:
    """An echo-like brain: 20 ms of audio every 20 ms, every 7th frame 15 ms late.

    Each late frame lets the provider's queue nearly run dry, so the pacer sends
    a bridge (40 ms of silence, media/pacer.py). That audio is counted in the
    pacer and the ledger; uncounted (when the engine released soxr's held tail
    with silence), every later jitter drained again and the stream's delay grew
    by 40 ms each time, for the rest of the call.
    """
    engine = new_engine()
    engine.set_brain_connected(True)
    provider_end = 0.0
    delays: list[float] = []
    frame = REPLY[:960]
    now = 0.0
    for n in range(1_500):  # 30 s
        arrival = n * 20.0 + (15.0 if n % 7 == 6 else 0.0)
        # Poll at every deadline before this frame arrives, as the driver does.
        while (deadline := engine.next_deadline()) is not None and deadline < arrival:
            now = max(now, deadline)
            for command in engine.poll(now):
                if isinstance(command, PlayAudio):
                    provider_end = max(provider_end, now) + len(command.payload) / 8
        now = arrival
        engine.on_brain(AudioOut(frame, "echo"), now)
        for command in engine.poll(now):
            if isinstance(command, PlayAudio):
                provider_end = max(provider_end, now) + len(command.payload) / 8
        delays.append(provider_end - now)  # what this frame waits behind at the provider
    assert max(delays[-500:]) <= max(delays[:500]) + 20, (max(delays[:500]), max(delays[-500:]))
    assert max(delays) <= 140


def _heard_delay_ms(rig: ReflexRig, reply8: npt.NDArray[np.float64], at_s: float) -> float:
    """When 1 s of the reply, due at ``at_s`` on the brain's own timeline (0.2 s + its
    offset), plays on the caller's line, minus ``at_s``: the delay the caller hears."""
    a = int(at_s * LINE_RATE)
    segment = reply8[a - int(0.2 * LINE_RATE) : a - int(0.2 * LINE_RATE) + LINE_RATE]
    window = rig.played[a : a + 2 * LINE_RATE]
    return float(np.argmax(np.correlate(window, segment, mode="valid"))) * 1000 / LINE_RATE


@pytest.mark.parametrize("late_ms", [30.0, 300.0])
def test_a_brain_late_mid_reply_is_won_back_within_3_s(late_ms: float, speech_pcm: bytes) -> None:
    """Issue 14: a brain whose audio stalls mid-reply, then comes with its backlog at once,
    costs the caller one gap, not a latency step for the rest of the call."""
    speech = np.frombuffer(speech_pcm[: 9 * 8000 * 2], dtype="<i2").astype(np.float64)
    reply = soxr.resample(speech, 8000, RATE).clip(-32768, 32767).astype("<i2").tobytes()
    rig = ReflexRig(seconds=10.0, echo_loss_db=None, hello=UNINTERRUPTIBLE)
    stall_s = 3.0
    for k, a in enumerate(range(0, len(reply), CANONICAL_FRAME_BYTES)):
        due_s = 0.2 + k * FRAME_MS / 1000
        at_s = max(due_s, stall_s + late_ms / 1000) if due_s >= stall_s else due_s
        rig.say(reply[a : a + CANONICAL_FRAME_BYTES], "answer", at_s=at_s)
    rig.run()
    reply8 = soxr.resample(np.frombuffer(reply, dtype="<i2").astype(np.float64), RATE, LINE_RATE)
    before = _heard_delay_ms(rig, reply8, 2.0)
    after = [_heard_delay_ms(rig, reply8, stall_s + late_ms / 1000 + s) for s in (3.0, 4.0, 5.0)]
    assert all(abs(d - before) <= 1.0 for d in after), (before, after)
    assert rig.pacer.delay_debt_ms < FRAME_MS
    assert rig.pacer.shed_ms >= late_ms - DEFAULT_LEAD_MS  # the queued lead covered the rest
    assert rig.pacer.lead_ms_now(rig.now) <= DEFAULT_LEAD_MS


def test_a_closed_engine_frees_its_audio_history_at_once_and_ignores_what_comes_after() -> None:
    # A call's objects sit in reference cycles, so without close() the echo gate's
    # buffers waited for the cyclic GC's next full pass: under call churn the dead
    # calls' ~0.8 MiB each (~0.55 MiB since the line canceller keeps only the capture
    # one alignment reads) piled up (the hostile campaign's RSS plateau).
    tracemalloc.start()
    try:
        engine = new_engine()
        for i in range(50):
            engine.on_ingress(AudioReceived(bytes(160), None), i * 20.0)
            engine.poll(i * 20.0)
        held = tracemalloc.get_traced_memory()[0]
        engine.close()
        freed = held - tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert freed >= 500 * 1024, f"freed only {freed} bytes"
    frames_in = engine.frames_in
    assert engine.on_ingress(AudioReceived(bytes(160), None), 2000.0) == []
    assert engine.poll(2000.0) == []
    assert engine.next_deadline() is None
    assert engine.frames_in == frames_in
