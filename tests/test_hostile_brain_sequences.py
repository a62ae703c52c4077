"""Seeded sequences of hostile brain behaviour against the per-call engine (issue 14, finding 4).

A hostile brain once made the gateway queue 1.6-2.9 s of audio at the caller's
provider, where each kind of flood alone kept the lead at 60 ms: it was a
sequence. Here each seed draws one: bursts of up to a second per message,
floods of tiny messages (1-30 samples) at once or trickled, clears, real-time
streams with jitter, hellos again, and the connection dropping and coming
back, over 20 s of virtual time on the engine the gateway runs
(``tests/support/engine_rig.py``, whose provider plays what it is sent in real time
as Twilio does). Whatever the sequence, the audio waiting at the provider
never exceeds the pacer's lead.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from rutster.media.pacer import DEFAULT_LEAD_MS
from rutster.protocols.tap import AudioClear, AudioOut, BrainHello
from tests.support.engine_rig import LINE_RATE, ReflexRig

#: Seeds drawn (each one call of SEQUENCE_S); fixed so a failure repeats.
SEEDS = range(40)
SEQUENCE_S = 20.0
HOSTILE = BrainHello("hostile", "1", interruptible=False)
#: A second of a loud tone at 24 kHz: what the bursts are cut from.
TONE = (np.sin(np.arange(24_000) * 0.05) * 8_000).astype("<i2").tobytes()


class QueueWatchingRig(ReflexRig):
    """The rig, noting how much audio waits at the provider after every send."""

    max_queue_ms: float = 0.0

    def _provider_play(self, payload: bytes, item: str | None) -> None:
        super()._provider_play(payload, item)
        arrival = round(self.now * LINE_RATE / 1000)
        queued_ms = (self._provider_end - arrival) * 1000 / LINE_RATE
        self.max_queue_ms = max(self.max_queue_ms, queued_ms)


def hostile_sequence(rig: ReflexRig, rng: random.Random, seconds: float) -> list[str]:
    """Schedule one drawn sequence on ``rig``; returns the kinds drawn, in order."""
    kinds: list[str] = []
    t = 0.3
    connected = True
    while t < seconds - 1:
        kind = rng.choice(["burst", "burst", "tiny", "clear", "stream", "hello", "link"])
        kinds.append(kind)
        item = rng.choice("abc")
        if kind == "burst":
            samples = rng.randint(1, 24_000)
            for _ in range(rng.randint(1, 5)):
                rig.brain_event(AudioOut(TONE[: 2 * samples], item), t)
        elif kind == "tiny":
            spacing_s = rng.choice([0.0, 0.0005, 0.002])
            for k in range(rng.randint(10, 400)):
                rig.brain_event(AudioOut(TONE[: 2 * rng.randint(1, 30)], item), t + k * spacing_s)
        elif kind == "clear":
            rig.brain_event(AudioClear(), t)
        elif kind == "stream":
            for k in range(rng.randint(5, 100)):
                rig.brain_event(AudioOut(TONE[:960], item), t + k * 0.02 + rng.uniform(0, 0.03))
        elif kind == "hello":
            rig.brain_event(HOSTILE, t)
        else:
            connected = not connected
            rig.brain_link(connected, t)
            if connected:
                rig.brain_event(HOSTILE, t)
        t += rng.uniform(0.0, 0.6)
    return kinds


@pytest.mark.parametrize("seed", SEEDS)
def test_no_sequence_of_brain_messages_queues_more_than_the_lead(seed: int) -> None:
    rig = QueueWatchingRig(seconds=SEQUENCE_S, echo_loss_db=None, hello=HOSTILE)
    kinds = hostile_sequence(rig, random.Random(seed), SEQUENCE_S)
    rig.run()
    assert rig.engine.frames_out > 0
    assert rig.max_queue_ms <= DEFAULT_LEAD_MS, (rig.max_queue_ms, kinds)
