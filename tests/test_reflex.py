"""The reflex loop on a virtual clock: real speech over assistant playout, echo, noise."""

from __future__ import annotations

import numpy as np
import pytest

from brains.realtime.mock_voice import synthesize_reply
from brains.tap import SpeechStarted, SpeechStopped
from gateway.reflex import ClearProvider, ReflexConfig, ReflexState, WakePacer
from gateway.reflex_rig import FRAME_MS, RATE, ReflexRig
from media.resample import StreamResampler
from tests.conftest import SPEECH_WAV
from trunk.twilio.simulator import read_wav_8k

#: Fluent speech in the fixture (no noise bursts): 9-14 s.
CALLER_FROM_S = 9.0


def speech_24k(start_s: float, seconds: float) -> bytes:
    pcm = read_wav_8k(SPEECH_WAV)
    a = int(start_s * 8000) * 2
    chunk = pcm[a : a + int(seconds * 8000) * 2]
    up = StreamResampler(8_000, RATE)
    return up.process(chunk) + up.flush()


def onset_s(pcm24: bytes, at_s: float) -> float:
    """When speech in ``pcm24`` (placed at ``at_s``) first exceeds -40 dBFS over 20 ms."""
    x = np.frombuffer(pcm24, dtype="<i2").astype(np.float64)
    for i in range(0, x.size - 480, 480):
        if np.sqrt(np.mean(x[i : i + 480] ** 2)) > 32768 * 10 ** (-40 / 20):
            return at_s + i / RATE
    raise AssertionError("no speech found")


def last_loud_ms(pcm24: bytes) -> float:
    """End of the last 20 ms of ``pcm24`` above -40 dBFS (ms from its start)."""
    x = np.frombuffer(pcm24, dtype="<i2").astype(np.float64)
    last = 0
    for i in range(0, x.size - 480, 480):
        if np.sqrt(np.mean(x[i : i + 480] ** 2)) > 32768 * 10 ** (-40 / 20):
            last = i + 480
    return last / RATE * 1000


REPLY = synthesize_reply(4_000)


def test_barge_in_pauses_fast_confirms_and_reports_what_was_heard() -> None:
    caller = speech_24k(CALLER_FROM_S, 1.5)
    rig = ReflexRig(seconds=4.0, echo_delay_ms=200, echo_loss_db=15)
    rig.say(REPLY, "item_1", at_s=0.2)
    rig.caller_audio(caller, at_s=1.5)
    rig.run()
    onset = onset_s(caller, 1.5)
    pause = rig.first(ClearProvider)
    assert pause is not None, "never paused"
    # Pause within 150 ms of the true onset (the P95 goal), never before it.
    assert onset * 1000 <= pause.at_ms <= onset * 1000 + 150
    (confirm_step, started) = rig.actions_of(SpeechStarted)[0]
    assert isinstance(started, SpeechStarted) and started.interrupted
    assert started.item == "item_1"
    # Confirmed once 350 ms of speech accumulated since the pause.
    assert pause.at_ms + 350 - FRAME_MS <= confirm_step.at_ms <= pause.at_ms + 600
    # played_ms: the reply started at ~0.2 s + the 40 ms start allowance; the caller
    # heard it until the pause. Within 40 ms (the bound).
    assert rig.states()[:2] == ["listening", "speaking"]
    expected = pause.at_ms - 200 - 40
    assert started.played_ms is not None and abs(started.played_ms - expected) <= 40
    assert rig.states()[2:4] == ["interrupted", "listening"]
    assert rig.playout.buffered_samples == 0  # flushed


def test_state_sequence_speaking_interrupted_listening_then_end_of_turn() -> None:
    caller = speech_24k(CALLER_FROM_S, 1.2)
    rig = ReflexRig(seconds=4.5, echo_loss_db=20)
    rig.say(REPLY, "item_1", at_s=0.1)
    rig.caller_audio(caller, at_s=1.0)
    rig.run()
    assert rig.states()[:5] == ["listening", "speaking", "interrupted", "listening", "thinking"]
    stopped = rig.first(SpeechStopped)
    assert stopped is not None
    # The turn ends the trailing silence (500 ms) after the caller's speech ends,
    # give or take the VAD's release (Silero's tail after speech is 40-180 ms).
    speech_end_ms = 1000 + last_loud_ms(caller)
    assert speech_end_ms + 500 <= stopped.at_ms <= speech_end_ms + 500 + 200


@pytest.mark.parametrize(("delay_ms", "loss_db"), [(80, 6), (200, 10), (300, 15), (400, 25)])
def test_echo_alone_never_interrupts(delay_ms: float, loss_db: float) -> None:
    assistant = speech_24k(3.0, 6.0)  # real speech as the assistant's voice
    rig = ReflexRig(seconds=7.0, echo_delay_ms=delay_ms, echo_loss_db=loss_db)
    rig.say(assistant, "item_1", at_s=0.2)
    rig.run()
    assert rig.first(ClearProvider) is None, rig.of_type("barge_in_paused")
    assert not rig.actions_of(SpeechStarted)
    assert "interrupted" not in rig.states()


def test_a_noise_burst_pauses_at_most_and_playout_resumes_where_it_paused() -> None:
    rng = np.random.default_rng(3)
    burst = (rng.normal(0, 32768 * 10 ** (-20 / 20), int(0.15 * RATE))).astype("<i2").tobytes()
    rig = ReflexRig(seconds=5.0, echo_loss_db=20)
    rig.say(REPLY, "item_1", at_s=0.2)
    rig.caller_audio(burst, at_s=1.5)
    rig.run()
    assert not rig.actions_of(SpeechStarted)
    if rig.first(ClearProvider) is not None:
        assert rig.first(WakePacer) is not None
        assert rig.of_type("barge_in_resumed")
    # Every sample of the reply was heard exactly once: nothing lost, nothing doubled.
    assert rig.reflex.played_ms("item_1", 5_000) == 4_000
    assert rig.states()[-1] == "listening"


def test_silence_does_nothing() -> None:
    rig = ReflexRig(seconds=2.0, echo_loss_db=None)
    rig.run()
    assert all(not s.actions for s in rig.steps)
    assert rig.reflex.state is ReflexState.LISTENING


def test_a_turn_without_assistant_audio() -> None:
    caller = speech_24k(CALLER_FROM_S, 1.5)
    rig = ReflexRig(seconds=3.0, echo_loss_db=None)
    rig.caller_audio(caller, at_s=0.5)
    rig.run()
    (start_step, started) = rig.actions_of(SpeechStarted)[0]
    assert isinstance(started, SpeechStarted) and not started.interrupted
    assert 500 <= start_step.at_ms <= 500 + 400
    stop = rig.first(SpeechStopped)
    assert stop is not None and stop.at_ms > 2000
    assert rig.states() == ["listening", "thinking"]


def test_a_click_is_not_a_turn() -> None:
    click = (np.ones(int(0.06 * RATE)) * 20000).astype("<i2").tobytes()
    rig = ReflexRig(seconds=1.5, echo_loss_db=None)
    rig.caller_audio(click, at_s=0.5)
    rig.run()
    assert not rig.actions_of(SpeechStarted)


def test_cancellation_is_idempotent_and_later_audio_of_the_cut_item_is_dropped() -> None:
    caller = speech_24k(CALLER_FROM_S, 1.5)
    rig = ReflexRig(seconds=4.0, echo_loss_db=20)
    two_seconds = 2 * RATE * 2  # bytes
    rig.say(REPLY[:two_seconds], "item_1", at_s=0.2)
    rig.caller_audio(caller, at_s=1.0)
    rig.say(REPLY[two_seconds:], "item_1", at_s=2.5)  # in flight when the brain cancelled
    rig.run()
    interrupted = [a for _, a in rig.actions_of(SpeechStarted) if a.interrupted]  # type: ignore[union-attr]
    assert len(interrupted) == 1
    assert rig.reflex.counters.dropped_cancelled_audio == 1
    assert rig.playout.buffered_samples == 0


def test_an_answer_arriving_while_the_caller_talks_is_cut_at_zero() -> None:
    caller = speech_24k(CALLER_FROM_S, 2.0)
    rig = ReflexRig(seconds=3.5, echo_loss_db=None)
    rig.caller_audio(caller, at_s=0.3)
    rig.say(REPLY, "late_answer", at_s=1.5)
    rig.run()
    cut = [a for _, a in rig.actions_of(SpeechStarted) if a.interrupted]  # type: ignore[union-attr]
    assert cut == [SpeechStarted(interrupted=True, item="late_answer", played_ms=0)]
    assert rig.reflex.ledger.frames_sent == 0


def test_barge_in_off_only_drives_turns() -> None:
    caller = speech_24k(CALLER_FROM_S, 1.5)
    rig = ReflexRig(seconds=4.0, echo_loss_db=20, config=ReflexConfig(barge_in=False))
    rig.say(REPLY, "item_1", at_s=0.2)
    rig.caller_audio(caller, at_s=1.0)
    rig.run()
    assert rig.first(ClearProvider) is None
    started = [a for _, a in rig.actions_of(SpeechStarted)]
    assert started and not any(a.interrupted for a in started)  # type: ignore[union-attr]
    assert (
        rig.reflex.played_ms("item_1", 4_000) == 3_780
        or rig.reflex.played_ms("item_1", 4_000) > 3_500
    )


def test_dtmf_barge_in_when_enabled() -> None:
    rig = ReflexRig(seconds=1.0, echo_loss_db=None, config=ReflexConfig(dtmf_barge_in=True))
    rig.say(REPLY, "item_1", at_s=0.0)
    rig.run()
    actions = rig.reflex.on_dtmf(1_000.0)
    assert isinstance(actions[0], ClearProvider)
    assert isinstance(actions[-1], SpeechStarted) and actions[-1].interrupted
    assert actions[-1].item == "item_1"
    assert rig.reflex.on_dtmf(1_020.0) == []  # already listening: nothing to cut


def test_dtmf_does_not_barge_in_by_default() -> None:
    rig = ReflexRig(seconds=1.0, echo_loss_db=None)
    rig.say(REPLY, "item_1", at_s=0.0)
    rig.run()
    assert rig.reflex.on_dtmf(1_000.0) == []


def test_exact_frames_of_pause_clear_flush_and_speech_started() -> None:
    """Deterministic case: energy VAD, no echo, a voiced caller starting on a frame boundary."""
    caller = synthesize_reply(1_000, seed=5)
    rig = ReflexRig(seconds=2.0, echo_loss_db=None, detector="energy")
    rig.say(REPLY, "item_1", at_s=0.0)
    rig.caller_audio(caller, at_s=1.0, gain_db=6.0)
    rig.run()
    onset_index = 50  # the caller frame covering 1000-1020 ms
    pause = rig.first(ClearProvider)
    assert pause is not None
    # Two loud near-end frames in a row (PAUSE_MS = 40): the second one pauses.
    assert pause.index == onset_index + 1
    paused = rig.of_type("barge_in_paused")[0]
    # The rig polls the pacer at the start of each 20 ms step (60 ms ahead, to
    # 1080 ms); at the pause (1040 ms) the provider still held 1040-1080: 40 ms,
    # back into the buffer, to be played again if the pause is undone.
    assert paused["requeued_ms"] == 40
    (confirm_step, started) = rig.actions_of(SpeechStarted)[0]
    # CONFIRM_MS = 350: 18 speech frames counted from the pause's own frames.
    assert confirm_step.index == onset_index + 17
    assert isinstance(started, SpeechStarted) and started.interrupted
    # Heard: the whole reply was buffered at 0 ms, so playout started at once (the start
    # allowance is met by what is buffered) and the caller heard it until the pause.
    assert started.played_ms == 1_040
    assert rig.playout.buffered_samples == 0
    assert [s.state for s in rig.steps[pause.index : confirm_step.index + 1]] == (
        ["interrupted"] * (confirm_step.index - pause.index) + ["listening"]
    )
