"""bench/realtime_latency.py's end-of-turn replay: the gateway's own engine, not the setting."""

from __future__ import annotations

from bench.realtime_latency import SPEECH_FROM_S, SPEECH_S, SPEECH_WAV, end_of_turn_ms
from rutster.tools.twilio_simulator import SIM_SAMPLE_RATE, conversation_script, read_wav_8k


def test_a_turn_ending_in_speech_ends_on_the_last_silent_frame_of_the_setting() -> None:
    speech = read_wav_8k(SPEECH_WAV)
    script = conversation_script(
        speech, turns=3, speech_s=SPEECH_S, reply_window_s=2.5, speech_from_s=SPEECH_FROM_S
    )
    # The fixture's first three slices from 9 s end mid-word: the 25th silent
    # frame after the last sound ends the turn at 500 ms, 480 ms after it.
    assert end_of_turn_ms(script, {"RUTSTER_TURN_SILENCE_MS": "500"}) == [480.0] * 3
    assert end_of_turn_ms(script, {"RUTSTER_TURN_SILENCE_MS": "300"}) == [280.0] * 3


def test_a_silent_turn_is_never_ended() -> None:
    silence = bytes(2 * SIM_SAMPLE_RATE * 4)
    script = conversation_script(silence, turns=1, speech_s=SPEECH_S, reply_window_s=2.5)
    assert end_of_turn_ms(script, {}) == [None]
