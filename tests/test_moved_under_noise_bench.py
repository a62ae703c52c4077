"""bench/moved_under_noise.py: its runs, its table, and the fault it found (issue 12)."""

from __future__ import annotations

import sys

import pytest

from bench import moved_under_noise
from bench.eval_corpus import noise_bursts
from bench.reflex import split_voices


def _voice(name: str) -> bytes:
    return dict(split_voices("tune"))[name]


def test_a_path_moving_louder_under_a_passing_bus_is_not_cut() -> None:
    """The mock voice; 30 dB at 100 ms moving to 6 dB at 200 ms a second into the bus.

    Cut before the echo gate checked long near-end runs again for a copy at another lag.
    """
    bus = next(b for b in noise_bursts("tune") if b.kind == "traffic")
    pauses, cuts = moved_under_noise.run(
        _voice("mock"), (100.0, 30.0), (200.0, 6.0), bus, -1.0, -30.0
    )
    assert cuts == 0
    assert pauses <= 1


def test_the_quick_run_prints_every_kind_and_the_total(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["moved_under_noise", "--split", "tune", "--quick"])
    moved_under_noise.main()
    out = capsys.readouterr().out
    assert "split 'tune': 2 assistant voices x 2 path pairs x 8 noise recordings" in out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line[:1].isalpha()}
    kinds = {b.kind for b in noise_bursts("tune")}
    assert kinds <= set(rows)
    assert rows["all"][0] == str(2 * 2 * len(noise_bursts("tune")))
    assert "goal (issue 12, noise alone): 0 cuts" in out
