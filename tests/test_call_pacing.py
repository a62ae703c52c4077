"""The call's pacing glue: brain audio leaves in the turn of the event loop it came in.

``Call`` drives the media engine's pacer from one task that parks until the engine's
next deadline. Brain audio that arrives while it is parked is polled for at once, in
the brain's task (``Call._pace_brain_audio``): waking the pacer task instead sent it a
whole loop turn later, 16-34 ms on a loaded gateway (docs/BENCHMARKS.md, "Where the lag
P99 comes from"). These tests drive a real ``Call`` with a recording provider edge and
no brain (its tap keeps redialling a closed port).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import numpy as np

from rutster.gateway.call import Call
from rutster.gateway.config import GatewayConfig
from rutster.gateway.metrics import GatewayMetrics
from rutster.protocols.ingress import IngressCommand, PlayAudio, StreamStarted
from rutster.protocols.tap import AudioOut, SessionEndReason
from rutster.tools.launcher import LOOPBACK, free_port
from rutster.tools.twilio_simulator import connected_message, start_message
from rutster.trunk.twilio.codec import TwilioStreamCodec

#: 20 ms of canonical audio (24 kHz s16le), loud enough never to be shed.
FRAME_SAMPLES = 480


def _voice(frames: int) -> bytes:
    t = np.arange(frames * FRAME_SAMPLES)
    return (3000 * np.sin(2 * np.pi * 440 * t / 24_000)).astype("<i2").tobytes()


class RecordingEdge:
    """A provider edge that records what it is sent, optionally slow to send."""

    def __init__(self, send_delay_s: float = 0.0) -> None:
        self.sent: list[IngressCommand] = []
        self.send_delay_s = send_delay_s
        self.sending = 0
        self.most_at_once = 0

    async def send(self, command: IngressCommand) -> None:
        self.sending += 1
        self.most_at_once = max(self.most_at_once, self.sending)
        try:
            if self.send_delay_s:
                await asyncio.sleep(self.send_delay_s)
            self.sent.append(command)
        finally:
            self.sending -= 1

    async def close(self, reason: str) -> None:
        """Nothing to close: no socket."""

    def audio(self) -> int:
        return sum(isinstance(c, PlayAudio) for c in self.sent)


def _started() -> StreamStarted:
    codec = TwilioStreamCodec()
    codec.receive(connected_message())
    event = codec.receive(start_message("MZ1", "CA1", "AC1", {}))
    assert isinstance(event, StreamStarted)
    return event


@contextlib.asynccontextmanager
async def _call(edge: RecordingEdge, metrics: GatewayMetrics) -> AsyncIterator[Call]:
    call = Call(
        _started(),
        tap_url=f"ws://{LOOPBACK}:{free_port()}/nobody",
        config=GatewayConfig(brain_grace_ms=0),
        metrics=metrics,
        edge=edge,
    )
    await call.start()
    try:
        yield call
    finally:
        await call.end(SessionEndReason.CALLER_HANGUP)


async def _parked(call: Call) -> None:
    for _ in range(200):
        if call._waiter is not None and not call._waiter.done():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("the pacer task never parked")


def _polls(metrics: GatewayMetrics) -> float:
    return metrics.pacer_polls._value.get()  # type: ignore[no-any-return]


async def test_brain_audio_is_sent_before_the_handler_returns() -> None:
    edge = RecordingEdge()
    metrics = GatewayMetrics()
    async with _call(edge, metrics) as call:
        await _parked(call)
        waiter = call._waiter
        polls = _polls(metrics)
        await call._on_brain_event(AudioOut(_voice(5), item="a"))
        # No turn of the loop has passed: the frames the lead allows are already out,
        # by one poll in this task, and the pacer task was not woken for it.
        assert edge.audio() == 3  # the 60 ms lead
        assert _polls(metrics) == polls + 1
        assert call._waiter is waiter and waiter is not None and not waiter.done()
        # The parked task's timer was re-armed: the rest leaves at real time.
        await asyncio.sleep(0.2)
        assert call.pacer.frames_sent == 5  # (then bridge frames, of silence)


async def test_one_sender_at_a_time_when_sends_yield() -> None:
    """Sends that yield to the loop (a provider socket under flow control) while the
    brain's audio keeps coming: the pacer task and the brain's polls never send at
    once, and every frame leaves."""
    edge = RecordingEdge(send_delay_s=0.004)
    metrics = GatewayMetrics()
    async with _call(edge, metrics) as call:
        await _parked(call)
        for _ in range(30):
            await call._on_brain_event(AudioOut(_voice(1), item="a"))
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)
        assert edge.most_at_once == 1
        assert call.pacer.frames_sent == 30  # every frame of audio (bridges apart)
