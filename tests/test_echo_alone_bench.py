"""bench/echo_alone.py: its grid, and the moved echo path it found (issue 12)."""

from __future__ import annotations

from bench.echo_alone import PATHS, Condition, conditions, echo_alone
from bench.eval_corpus import Utterance, utterances
from bench.reflex import assistant_voices


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
