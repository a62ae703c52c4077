"""bench/echo_alone.py: its grid, and the moved echo path it found (issue 12)."""

from __future__ import annotations

import pytest

from bench.echo_alone import PATHS, Condition, conditions, echo_alone, festival_voices
from bench.eval_corpus import RATE, Utterance, active_level_dbfs, utterances
from bench.reflex import REPLY_MS, assistant_voices


def test_the_grid_covers_levels_noisy_lines_and_every_move() -> None:
    grid = conditions()
    groups = {c.group for c in grid}
    assert groups == {"levels", "noisy", "moved"}
    moves = {(c.delay_ms, c.loss_db, c.moves_to) for c in grid if c.group == "moved"}
    assert len(moves) == len(PATHS) * (len(PATHS) - 1)
    assert [c.group for c in conditions(quick=True)] == ["levels", "noisy", "moved"]


def test_an_echo_path_moving_mid_answer_neither_pauses_nor_cuts() -> None:
    """A tune-split voice over a 6 dB echo at 200 ms that moves to 10 dB at 450 ms.

    Found by this benchmark's tune split: one pause and one cut before the echo gate
    looked for the moved echo in the frame as heard (its line canceller's residual
    after the move is a copy of neither path).
    """
    speakers: dict[str, list[Utterance]] = {}
    for u in utterances("tune"):
        speakers.setdefault(u.speaker, []).append(u)
    voice = dict(assistant_voices(speakers))["aepyx"]
    moved = Condition("moved", -18.0, 200.0, 6.0, moves_to=(450.0, 10.0))
    assert echo_alone(voice, moved) == (0, 0)


def test_festivals_voices_are_six_brain_voices_of_a_reply_each() -> None:
    voices = festival_voices()
    assert [name for name, _ in voices] == [
        "hy_fi_mv_diphone",
        "kal_diphone",
        "ked_diphone",
        "lp_diphone",
        "pc_diphone",
        "suo_fi_lj_diphone",
    ]
    for name, pcm in voices:
        assert len(pcm) == REPLY_MS * RATE // 1000 * 2, name
        assert active_level_dbfs(pcm) == pytest.approx(-18.0, abs=0.5), name


def test_a_line_canceller_slip_at_a_loud_onset_does_not_pause() -> None:
    """Festival's Finnish voice over 10 dB of echo at 80 ms, on a quiet line.

    Found by this benchmark's Festival voices (tune): at one loud onset the trusted
    line canceller left two frames of its own error 22 dB under the frame, enough to
    be called the caller, and the VAD scored that residual of the assistant's voice
    0.55: one pause, before the echo gate fitted the residual to the render
    (media/echo_gate.py RESIDUAL_FOLLOWS_SHARE).
    """
    voice = dict(festival_voices())["suo_fi_lj_diphone"]
    assert echo_alone(voice, Condition("levels", -18.0, 80.0, 10.0)) == (0, 0)
