"""Held-out-capable evaluation corpus of real recordings for the barge-in benchmark.

The recordings live in ``tests/fixtures/audio/eval/`` (sources, licences and the
regeneration recipe are in its README). This module turns them into
interruption *utterances* (real speech cut at pauses into 0.4-5 s pieces) and
*noise bursts* (coughs, doors, keyboards, traffic, babble, ...), all as 24 kHz
s16le mono, the gateway's internal rate.

Every file belongs to exactly one split, fixed in :data:`FILE_SPLIT`: ``tune``
holds what thresholds may be tuned on (including the project's two older
fixtures, ``caller_speech_8k.wav`` and ``espeak_speech_16k.wav``), ``heldout``
holds speakers and noise recordings that never appear in ``tune``, so a
benchmark can report a number that was not fitted to its own data.

Level helpers: :func:`active_level_dbfs` (a simplified ITU-T P.56 active speech
level) and :func:`scale_to_dbfs`.
"""

from __future__ import annotations

import functools
import math
import wave
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt
import soxr

__all__ = [
    "FILE_SPLIT",
    "SPLITS",
    "SYNTHETIC_SPEAKERS",
    "NoiseBurst",
    "Utterance",
    "active_level_dbfs",
    "noise_bursts",
    "scale_to_dbfs",
    "segment_pauses",
    "utterances",
]

_AUDIO_DIR: Final = Path(__file__).resolve().parent.parent / "tests/fixtures/audio"
#: Folder of the eval corpus, relative to the repository.
EVAL_DIR: Final = _AUDIO_DIR / "eval"

#: The two splits: ``tune`` (thresholds may be fitted on it) and ``heldout``.
SPLITS: Final = ("tune", "heldout")

#: Output rate: the gateway's internal media rate (24 kHz s16le mono).
RATE: Final = 24000
#: Bytes per s16le sample.
_SAMPLE_BYTES: Final = 2
#: PCM16 full scale, the 0 dBFS reference for every level here (a full-scale
#: square wave is 0 dBFS, a full-scale sine -3.01 dBFS).
_FULL_SCALE: Final = 32768.0
#: Analysis frame for levels and pauses: 10 ms, the frame ITU-T P.56 and most
#: VADs use; fine enough to place a cut to within 10 ms.
FRAME_MS: Final = 10
_FRAME: Final = RATE * FRAME_MS // 1000

#: A frame quieter than this is a pause. -45 dBFS sits ~25 dB under the active
#: level of these recordings (-18 to -26 dBFS, see the README) and ~15 dB above
#: their noise floor between words (below -60 dBFS in the IVR prompts, the
#: ARCTIC and game-voice files; the concatenation gaps are digital silence).
PAUSE_DBFS: Final = -45.0
#: On a noisy recording (the phone-band ``caller_speech_8k.wav`` has a floor
#: of -47 to -40 dBFS between words) -45 dBFS never sees a pause, so the
#: threshold is raised to the file's noise floor plus this margin: 12 dB is
#: clear of the floor's frame-to-frame spread (about +-5 dB) and still well
#: under that file's active level (-25 dBFS).
NOISE_MARGIN_DB: Final = 12.0
#: The noise floor is this percentile of the file's 10 ms frame levels: every
#: corpus file is at least 10 % pauses (gaps between prompts or phrases).
NOISE_FLOOR_PERCENTILE: Final = 10.0
#: A pause must last at least this long to cut there: 250 ms is longer than
#: the stop closures and short inter-word gaps inside a phrase (typically below
#: 150-200 ms) and shorter than the breath pauses between phrases.
MIN_PAUSE_MS: Final = 250
#: Kept utterance length: 0.4 s is about one short word ("yes", "stop"), the
#: shortest plausible barge-in; 5 s is a long interjection sentence. Pieces
#: outside the window are dropped, not cut further.
MIN_UTTERANCE_S: Final = 0.4
MAX_UTTERANCE_S: Final = 5.0

#: ITU-T P.56 margin M: frames within 15.9 dB of the active level count as
#: active (P.56 method B uses this margin on its envelope).
P56_MARGIN_DB: Final = 15.9
#: First-pass floor of the active level: -70 dBFS is below any speech but
#: above the dither / digital-silence floor of the fixtures.
ACTIVE_FLOOR_DBFS: Final = -70.0
#: Level returned for a signal with no frame above the floor.
SILENCE_DBFS: Final = -120.0
#: Refinement passes of the active level (P.56 iterates to a fixed point; two
#: passes move it by < 0.1 dB on these recordings).
_P56_PASSES: Final = 2
_INT16_MAX: Final = 32767
_INT16_MIN: Final = -32768

#: Every corpus file and its split. Speech files are ``speech_<speaker>_<rate>k.wav``
#: (one speaker each), noise files ``noise_<kind>_<recording>_<rate>k.wav``.
#: New speakers: 5 of 14 in tune (about 1/3), 9 heldout; each noise kind has
#: one recording in tune and the others heldout.
FILE_SPLIT: Final[dict[str, str]] = {
    # -- project fixtures the thresholds were already tuned on -----------------
    "../caller_speech_8k.wav": "tune",  # speaker "aepyx" (silero-vad sample)
    "../espeak_speech_16k.wav": "tune",  # speaker "espeak", synthetic supplement
    # -- speech, tune ----------------------------------------------------------
    "speech_alsa_voice_16k.wav": "tune",
    "speech_arctic_slt_16k.wav": "tune",
    "speech_ast_ru_ivrvoice_8k.wav": "tune",
    "speech_ast_fr_armelle_8k.wav": "tune",
    "speech_fillets_nl_v_16k.wav": "tune",
    # -- speech, heldout -------------------------------------------------------
    "speech_ast_en_allison_8k.wav": "heldout",
    "speech_ast_fr_june_8k.wav": "heldout",
    "speech_ast_it_carlo_8k.wav": "heldout",
    "speech_ast_it_menardi_8k.wav": "heldout",
    "speech_ast_es_co_july_8k.wav": "heldout",
    "speech_arctic_awb_16k.wav": "heldout",
    "speech_fillets_cs_v_16k.wav": "heldout",
    "speech_fillets_cs_m_16k.wav": "heldout",
    "speech_fillets_nl_m_16k.wav": "heldout",
    # -- noise, tune -----------------------------------------------------------
    "noise_cough_hedgewars_default_16k.wav": "tune",
    "noise_door_minetest_wood_open_16k.wav": "tune",
    "noise_keyboard_tuxpaint_click_16k.wav": "tune",
    "noise_traffic_opensfx_old_bus_16k.wav": "tune",
    "noise_babble_mix_tune_8k.wav": "tune",
    "noise_crowd_opensfx_oooh_16k.wav": "tune",
    "noise_footsteps_minetest_wood_16k.wav": "tune",
    "noise_glass_minetest_break1_16k.wav": "tune",
    # -- noise, heldout --------------------------------------------------------
    "noise_cough_hedgewars_hillbilly_16k.wav": "heldout",
    "noise_cough_hedgewars_default_pl_16k.wav": "heldout",
    "noise_cough_hedgewars_default_es_16k.wav": "heldout",
    "noise_door_minetest_wood_close_16k.wav": "heldout",
    "noise_door_minetest_steel_close_16k.wav": "heldout",
    "noise_door_minetest_fencegate_close_16k.wav": "heldout",
    "noise_keyboard_tuxpaint_return_16k.wav": "heldout",
    "noise_keyboard_tuxpaint_typing_16k.wav": "heldout",
    "noise_traffic_opensfx_london_bus_16k.wav": "heldout",
    "noise_traffic_opensfx_truck_start_16k.wav": "heldout",
    "noise_traffic_opensfx_car_horn_16k.wav": "heldout",
    "noise_babble_mix_heldout_8k.wav": "heldout",
    "noise_crowd_opensfx_applause_16k.wav": "heldout",
    "noise_footsteps_minetest_hard_16k.wav": "heldout",
    "noise_glass_minetest_break2_16k.wav": "heldout",
}

#: Speaker ids of the older fixtures (their file names carry no speaker id).
_FIXTURE_SPEAKERS: Final[dict[str, str]] = {
    "../caller_speech_8k.wav": "aepyx",
    "../espeak_speech_16k.wav": "espeak",
}
#: Speakers that are synthesised, not recorded: a supplement, never counted
#: as a real speaker.
SYNTHETIC_SPEAKERS: Final = frozenset({"espeak"})


@dataclass(frozen=True)
class Utterance:
    """One real (or, for ``espeak``, synthetic) utterance, 24 kHz s16le mono."""

    speaker: str
    split: str
    pcm24: bytes
    source: str

    @property
    def seconds(self) -> float:
        """Length in seconds."""
        return len(self.pcm24) / (_SAMPLE_BYTES * RATE)


@dataclass(frozen=True)
class NoiseBurst:
    """One noise recording (``kind`` e.g. "cough", "door", "babble"), 24 kHz s16le mono."""

    kind: str
    split: str
    pcm24: bytes
    source: str

    @property
    def seconds(self) -> float:
        """Length in seconds."""
        return len(self.pcm24) / (_SAMPLE_BYTES * RATE)


def _read_wav_24k(name: str) -> bytes:
    """Read a mono 16-bit corpus WAV and resample it to 24 kHz (soxr HQ, float)."""
    with wave.open(str(EVAL_DIR / name), "rb") as w:
        if w.getnchannels() != 1 or w.getsampwidth() != _SAMPLE_BYTES:
            raise ValueError(f"{name}: expected mono 16-bit PCM")
        rate = w.getframerate()
        x = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    if rate == RATE:
        return x.tobytes()
    y = soxr.resample(x.astype(np.float32), rate, RATE, quality="HQ")
    return _to_pcm16(np.asarray(y, dtype=np.float64))


def _to_pcm16(y: npt.NDArray[np.float64]) -> bytes:
    """Round and saturate to s16le bytes."""
    return np.clip(np.rint(y), _INT16_MIN, _INT16_MAX).astype("<i2").tobytes()


def _samples(pcm24: bytes) -> npt.NDArray[np.float64]:
    return np.frombuffer(pcm24, dtype="<i2").astype(np.float64)


def _frame_power(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Mean square per whole 10 ms frame (a trailing partial frame is ignored)."""
    n = len(x) // _FRAME
    frames = x[: n * _FRAME].reshape(n, _FRAME)
    power: npt.NDArray[np.float64] = np.mean(frames * frames, axis=1)
    return power


def _dbfs(power: float) -> float:
    return 10.0 * math.log10(power / (_FULL_SCALE * _FULL_SCALE)) if power > 0 else SILENCE_DBFS


def active_level_dbfs(pcm24: bytes) -> float:
    """Active level of 24 kHz s16le audio in dBFS, a simplified ITU-T P.56.

    RMS over the 10 ms frames that are active: first those above
    :data:`ACTIVE_FLOOR_DBFS`, then (twice) those within :data:`P56_MARGIN_DB`
    of the level found so far, so pauses do not dilute the level. P.56 uses a
    smoothed envelope and a hangover instead of frames; for recordings like
    these the two agree to within about 1 dB. Returns :data:`SILENCE_DBFS`
    when nothing is above the floor.
    """
    power = _frame_power(_samples(pcm24))
    floor = ACTIVE_FLOOR_DBFS
    level = SILENCE_DBFS
    for _ in range(_P56_PASSES + 1):
        active = power[power > (_FULL_SCALE**2) * 10.0 ** (floor / 10.0)]
        if not len(active):
            return level
        level = _dbfs(float(np.mean(active)))
        floor = level - P56_MARGIN_DB
    return level


def scale_to_dbfs(pcm24: bytes, target_dbfs: float) -> bytes:
    """Scale so that :func:`active_level_dbfs` is ``target_dbfs``, without clipping.

    The gain is capped so the peak stays within int16 (a loud target on a
    peaky signal then lands below the target instead of clipping); silence is
    returned unchanged.
    """
    x = _samples(pcm24)
    level = active_level_dbfs(pcm24)
    if level <= SILENCE_DBFS or not len(x):
        return pcm24
    gain = 10.0 ** ((target_dbfs - level) / 20.0)
    peak = float(np.max(np.abs(x)))
    if peak * gain > _INT16_MAX:
        gain = _INT16_MAX / peak
    return _to_pcm16(x * gain)


def segment_pauses(pcm24: bytes) -> list[bytes]:
    """Cut 24 kHz s16le speech at pauses; keep the 0.4-5 s pieces, in order.

    A pause is a run of at least :data:`MIN_PAUSE_MS` of 10 ms frames below
    :data:`PAUSE_DBFS`, or below the noise floor (the
    :data:`NOISE_FLOOR_PERCENTILE` frame level) plus :data:`NOISE_MARGIN_DB`
    when that is higher; each piece runs from its first to its last loud frame.
    Deterministic: the same bytes always give the same pieces.
    """
    x = _samples(pcm24)
    power = _frame_power(x)
    if not len(power):
        return []
    floor = _dbfs(float(np.percentile(power, NOISE_FLOOR_PERCENTILE)))
    threshold = max(PAUSE_DBFS, floor + NOISE_MARGIN_DB)
    loud = power >= (_FULL_SCALE**2) * 10.0 ** (threshold / 10.0)
    min_gap = MIN_PAUSE_MS // FRAME_MS
    pieces: list[bytes] = []
    idx = np.flatnonzero(loud)
    if not len(idx):
        return pieces
    start = prev = int(idx[0])
    for i in [*(int(j) for j in idx[1:]), None]:
        if i is not None and i - prev - 1 < min_gap:
            prev = i
            continue
        seconds = (prev + 1 - start) * FRAME_MS / 1000.0
        if MIN_UTTERANCE_S <= seconds <= MAX_UTTERANCE_S:
            pieces.append(
                pcm24[start * _FRAME * _SAMPLE_BYTES : (prev + 1) * _FRAME * _SAMPLE_BYTES]
            )
        if i is not None:
            start = prev = i
    return pieces


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, not {split!r}")


def _speaker_of(name: str) -> str:
    if name in _FIXTURE_SPEAKERS:
        return _FIXTURE_SPEAKERS[name]
    stem = name.removeprefix("speech_").removesuffix(".wav")
    return stem.rsplit("_", 1)[0]  # drop the "<rate>k" suffix


def _kind_of(name: str) -> str:
    return name.removeprefix("noise_").split("_", 1)[0]


@functools.cache
def _utterances(split: str) -> tuple[Utterance, ...]:
    out: list[Utterance] = []
    for name, s in FILE_SPLIT.items():
        if s != split or not (name.startswith("speech_") or name in _FIXTURE_SPEAKERS):
            continue
        speaker = _speaker_of(name)
        for k, piece in enumerate(segment_pauses(_read_wav_24k(name))):
            out.append(Utterance(speaker, split, piece, f"{Path(name).name}#{k}"))
    return tuple(out)


@functools.cache
def _noise_bursts(split: str) -> tuple[NoiseBurst, ...]:
    return tuple(
        NoiseBurst(_kind_of(name), split, _read_wav_24k(name), name)
        for name, s in FILE_SPLIT.items()
        if s == split and name.startswith("noise_")
    )


def utterances(split: str) -> list[Utterance]:
    """All utterances of ``split`` ("tune" or "heldout"), in table order."""
    _check_split(split)
    return list(_utterances(split))


def noise_bursts(split: str) -> list[NoiseBurst]:
    """All noise bursts of ``split`` ("tune" or "heldout"), in table order."""
    _check_split(split)
    return list(_noise_bursts(split))
