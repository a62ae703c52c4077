"""bench/echo_alone.py: its grid."""

from __future__ import annotations

from bench.echo_alone import PATHS, conditions


def test_the_grid_covers_levels_noisy_lines_and_every_move() -> None:
    grid = conditions()
    groups = {c.group for c in grid}
    assert groups == {"levels", "noisy", "moved"}
    moves = {(c.delay_ms, c.loss_db, c.moves_to) for c in grid if c.group == "moved"}
    assert len(moves) == len(PATHS) * (len(PATHS) - 1)
    assert [c.group for c in conditions(quick=True)] == ["levels", "noisy", "moved"]
