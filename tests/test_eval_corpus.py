"""The eval corpus loads, its splits are disjoint, and its level helpers work."""

from __future__ import annotations

import numpy as np
import pytest

from bench.eval_corpus import (
    FILE_SPLIT,
    MAX_UTTERANCE_S,
    MIN_UTTERANCE_S,
    SYNTHETIC_SPEAKERS,
    active_level_dbfs,
    noise_bursts,
    scale_to_dbfs,
    utterances,
)

KINDS = {"cough", "door", "keyboard", "traffic", "babble"}


def test_heldout_speakers_are_real_and_disjoint_from_tune() -> None:
    tune = {u.speaker for u in utterances("tune")}
    heldout = {u.speaker for u in utterances("heldout")} - SYNTHETIC_SPEAKERS
    assert {"aepyx", "espeak"} <= tune
    assert len(heldout) >= 4
    assert not heldout & tune


def test_utterance_lengths() -> None:
    for split in ("tune", "heldout"):
        for u in utterances(split):
            assert u.split == split
            assert MIN_UTTERANCE_S <= u.seconds <= MAX_UTTERANCE_S, u.source


def test_noise_kinds_and_recordings_disjoint() -> None:
    tune, heldout = noise_bursts("tune"), noise_bursts("heldout")
    assert {n.kind for n in heldout} >= KINDS
    assert {n.kind for n in tune} >= KINDS
    assert not {n.source for n in tune} & {n.source for n in heldout}
    assert all(len(n.pcm24) > 0 and n.split == "heldout" for n in heldout)
    assert set(FILE_SPLIT.values()) == {"tune", "heldout"}


def test_bad_split_rejected() -> None:
    with pytest.raises(ValueError):
        utterances("train")


def test_scale_to_dbfs() -> None:
    u = utterances("heldout")[0]
    for target in (-36.0, -26.0, -16.0):
        assert active_level_dbfs(scale_to_dbfs(u.pcm24, target)) == pytest.approx(target, abs=0.5)
    loud = scale_to_dbfs(u.pcm24, 0.0)  # more than the peak allows: capped, not clipped
    peak = int(np.max(np.abs(np.frombuffer(loud, dtype="<i2").astype(np.int32))))
    assert peak <= 32767
    assert active_level_dbfs(loud) < 0.0


def test_active_level_of_known_tone() -> None:
    t = np.arange(24000) / 24000
    tone = (0.5 * 32767 * np.sin(2 * np.pi * 440 * t)).astype("<i2").tobytes()
    # a sine at amplitude 0.5 full scale: 20*log10(0.5/sqrt(2)) = -9.03 dBFS
    assert active_level_dbfs(tone) == pytest.approx(-9.03, abs=0.05)
    assert active_level_dbfs(bytes(4800)) < -100
