"""Voice-activity detectors (media/vad.py): behaviour on speech, silence and noise; API."""

from __future__ import annotations

import wave
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
import soxr

from rutster.media import silero_kernel, vad
from rutster.media.endpointing import EnergyEndpointer, FrameLengthError
from rutster.media.formats import (
    CANONICAL_FRAME_BYTES,
    NARROWBAND_FRAME_BYTES,
    NARROWBAND_FRAME_SAMPLES,
    NARROWBAND_SAMPLE_RATE,
)
from rutster.media.vad import (
    CASCADE_GATE_CONFIG,
    DEFAULT_DETECTOR,
    DETECTOR_NAMES,
    SPEECH_THRESHOLD,
    CascadeDetector,
    EnergyDetector,
    ModelUnavailableError,
    SileroDetector,
    SpeechDetector,
    WebRtcDetector,
    make_detector,
    preload,
)

AUDIO = Path(__file__).parent / "fixtures" / "audio"
SPEECH_WAV = AUDIO / "caller_speech_8k.wav"
ESPEAK_WAV = AUDIO / "espeak_speech_16k.wav"
#: A fluent stretch of the speech fixture, in frames (3.0-8.0 s; see
#: bench/vad_compare.py FIXTURE_SPEECH_S, whose first stretch is 2.50-8.22 s).
FLUENT = slice(150, 400)
#: Frames in one second.
SECOND = 50
SILENCE = bytes(NARROWBAND_FRAME_BYTES)


def _frames(pcm: bytes) -> list[bytes]:
    """8 kHz PCM as the narrowband frames the detectors take (media.narrowband)."""
    return [
        pcm[i : i + NARROWBAND_FRAME_BYTES]
        for i in range(0, len(pcm) - NARROWBAND_FRAME_BYTES + 1, NARROWBAND_FRAME_BYTES)
    ]


def _pcm(x: npt.NDArray[np.float64]) -> bytes:
    return np.clip(np.rint(x), -32768, 32767).astype("<i2").tobytes()


@pytest.fixture(scope="module")
def fixture_frames() -> list[bytes]:
    """The 30 s speech fixture (8 kHz) as narrowband frames, as calls hear it."""
    with wave.open(str(SPEECH_WAV), "rb") as wav:
        pcm8 = wav.readframes(wav.getnframes())
    return _frames(pcm8)


@pytest.fixture(scope="module")
def espeak_utterances() -> list[list[bytes]]:
    """Each espeak-ng utterance of the generated fixture as narrowband frames."""
    with wave.open(str(ESPEAK_WAV), "rb") as wav:
        rate = wav.getframerate()
        x = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2").astype(np.float64)
    loud = np.flatnonzero(np.abs(x) > 64)
    # Utterances are separated by 1 s of digital silence (tests/fixtures/audio/README.md).
    breaks = np.flatnonzero(np.diff(loud) > rate // 2)
    starts = np.concatenate(([loud[0]], loud[breaks + 1]))
    ends = np.concatenate((loud[breaks], [loud[-1]])) + 1
    return [
        _frames(_pcm(np.asarray(soxr.resample(x[s:e], rate, NARROWBAND_SAMPLE_RATE, "HQ"))))
        for s, e in zip(starts, ends, strict=True)
    ]


def _white(seconds: float, rms: float, seed: int = 7) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return _frames(_pcm(rng.standard_normal(round(seconds * NARROWBAND_SAMPLE_RATE)) * rms))


def _hum(seconds: float, amplitude: float) -> list[bytes]:
    t = np.arange(round(seconds * NARROWBAND_SAMPLE_RATE)) / NARROWBAND_SAMPLE_RATE
    return _frames(
        _pcm(amplitude * (np.sin(2 * np.pi * 60 * t) + 0.5 * np.sin(2 * np.pi * 120 * t)))
    )


def _run(detector: SpeechDetector, frames: Sequence[bytes]) -> npt.NDArray[np.float64]:
    return np.array([detector.process(f) for f in frames])


@pytest.fixture(params=DETECTOR_NAMES)
def name(request: pytest.FixtureRequest) -> Iterator[str]:
    yield str(request.param)


# ---- every detector ---------------------------------------------------------------


def test_silence_is_not_speech(name: str) -> None:
    probabilities = _run(make_detector(name), [SILENCE] * SECOND)
    assert np.all((probabilities >= 0.0) & (probabilities < SPEECH_THRESHOLD))


def test_fluent_speech_is_speech_on_most_frames(name: str, fixture_frames: list[bytes]) -> None:
    probabilities = _run(make_detector(name), fixture_frames[FLUENT])
    assert np.all((probabilities >= 0.0) & (probabilities <= 1.0))
    # Measured: energy 66 %, webrtc 88 %, silero and cascade 94 %; the dips
    # between words are part of the stretch.
    floor = 0.6 if name == "energy" else 0.85
    assert np.mean(probabilities >= SPEECH_THRESHOLD) >= floor


@pytest.mark.parametrize(
    "length", [0, 2, NARROWBAND_FRAME_BYTES - 2, NARROWBAND_FRAME_BYTES + 2, CANONICAL_FRAME_BYTES]
)
def test_wrong_frame_length_raises_and_changes_nothing(
    name: str, length: int, fixture_frames: list[bytes]
) -> None:
    frames = fixture_frames[FLUENT][:30]
    detector = make_detector(name)
    head = _run(detector, frames[:15])
    with pytest.raises(FrameLengthError) as excinfo:
        detector.process(bytes(length))
    assert excinfo.value.reason == "bad_frame_length"
    tail = _run(detector, frames[15:])
    np.testing.assert_array_equal(np.concatenate((head, tail)), _run(make_detector(name), frames))


def test_deterministic(name: str, fixture_frames: list[bytes]) -> None:
    frames = fixture_frames[100:300]
    np.testing.assert_array_equal(
        _run(make_detector(name), frames), _run(make_detector(name), frames)
    )


def test_reset_forgets_everything(name: str, fixture_frames: list[bytes]) -> None:
    detector = make_detector(name)
    _run(detector, fixture_frames[:250])
    detector.reset()
    frames = fixture_frames[250:400]
    np.testing.assert_array_equal(_run(detector, frames), _run(make_detector(name), frames))


def test_each_call_has_its_own_state(name: str, fixture_frames: list[bytes]) -> None:
    speech = fixture_frames[FLUENT][:100]
    noise = _white(2.0, 3000.0)
    a, b = make_detector(name), make_detector(name)
    interleaved = [(a.process(s), b.process(n)) for s, n in zip(speech, noise, strict=True)]
    np.testing.assert_array_equal([p for p, _ in interleaved], _run(make_detector(name), speech))
    np.testing.assert_array_equal([p for _, p in interleaved], _run(make_detector(name), noise))


# ---- the neural ones ---------------------------------------------------------------

NEURAL = ["silero", "cascade"]


@pytest.mark.parametrize("neural", NEURAL)
@pytest.mark.parametrize(
    "noise",
    [
        pytest.param(lambda: _white(3.0, 1000.0), id="white-30dBFS"),
        pytest.param(lambda: _white(3.0, 10_000.0), id="white-10dBFS"),
        pytest.param(lambda: _hum(3.0, 5000.0), id="hum"),
    ],
)
def test_noise_after_silence_is_not_speech(neural: str, noise: Callable[[], list[bytes]]) -> None:
    # After silence the energy gate opens on the noise, so the cascade does
    # run Silero here, and Silero must turn it down.
    frames = [SILENCE] * SECOND + list(noise())
    detector = make_detector(neural)
    probabilities = _run(detector, frames)
    assert np.mean(probabilities >= SPEECH_THRESHOLD) <= 0.02
    assert probabilities.max() < 0.9


@pytest.mark.parametrize("neural", NEURAL)
def test_every_espeak_utterance_is_found(neural: str, espeak_utterances: list[list[bytes]]) -> None:
    for utterance in espeak_utterances:
        detector = make_detector(neural)
        probabilities = _run(detector, [SILENCE] * SECOND + utterance)[SECOND:]
        assert np.mean(probabilities >= SPEECH_THRESHOLD) >= 0.6


#: How far each Silero engine's probabilities may lie from onnxruntime's own run of the
#: model: onnxruntime's bound session the same to rounding; the compiled kernel sums in
#: another order (measured up to 1.8e-6 on the speech fixture).
ENGINE_TOLERANCE = {"onnxruntime": 1e-6, "compiled": 1e-5}


@pytest.fixture(params=vad.SILERO_ENGINES)
def silero_engine(request: pytest.FixtureRequest) -> str:
    """Each Silero engine; the compiled one skips, saying why, where it is not available."""
    engine = str(request.param)
    if engine == "compiled" and silero_kernel.KERNEL is None:
        pytest.skip("the compiled Silero kernel was not built here, or this CPU lacks AVX2/FMA")
    return engine


def test_silero_buffers_like_the_reference_wrapper(
    fixture_frames: list[bytes], silero_engine: str
) -> None:
    # silero-vad's OnnxWrapper at 8 kHz, written out: the whole stream cut into
    # 256-sample windows, each with the last 32 samples of the one before.
    frames = fixture_frames[100:250]
    chunks = [np.frombuffer(f, dtype="<i2").astype(np.float32) / 32768.0 for f in frames]
    audio = np.concatenate(chunks)
    ends = np.cumsum([len(c) for c in chunks])
    session = vad._silero_session()
    state = np.zeros((2, 1, 128), dtype=np.float32)
    context = np.zeros(32, dtype=np.float32)
    window_probabilities = []
    for start in range(0, len(audio) - 255, 256):
        x = np.concatenate((context, audio[start : start + 256]))[None, :]
        out, state = session.run(
            None, {"input": x, "state": state, "sr": np.array(8_000, dtype=np.int64)}
        )
        window_probabilities.append(float(out[0, 0]))
        context = x[0, -32:]
    expected = [window_probabilities[e // 256 - 1] if e >= 256 else 0.0 for e in ends]
    np.testing.assert_allclose(
        _run(SileroDetector(silero_engine), frames),
        expected,
        rtol=0,
        atol=ENGINE_TOLERANCE[silero_engine],
    )
    assert max(expected) > SPEECH_THRESHOLD


def _windows_to_frames(windows: int) -> int:
    """Frames holding exactly ``windows`` model windows (8 frames = 5 windows of 256)."""
    assert windows % 5 == 0
    return windows // 5 * 8


def test_silero_state_starts_afresh_in_a_quiet_stretch_after_a_long_run(
    fixture_frames: list[bytes],
) -> None:
    # More than SILERO_RESET_EVERY_WINDOWS windows of the fixture, then digital
    # silence: at the SILERO_RESET_QUIET_WINDOWS-th quiet window the state is reset,
    # so what follows scores exactly as on a new call's detector.
    history = _windows_to_frames(vad.SILERO_RESET_EVERY_WINDOWS)
    assert history <= 2 * len(fixture_frames)
    loud = (fixture_frames * 2)[:history]
    quiet = _windows_to_frames(10)  # 16 frames: the reset falls on their last window
    assert vad.SILERO_RESET_QUIET_WINDOWS == 10
    after = fixture_frames[FLUENT]
    long_run = SileroDetector()
    _run(long_run, loud + [SILENCE] * quiet)
    fresh = SileroDetector()
    # From the first window on (before it a new detector reports 0.0; the other, the
    # quiet window it heard last).
    np.testing.assert_array_equal(_run(long_run, after)[1:], _run(fresh, after)[1:])
    # Without the reset, the state carried from the long run scores otherwise.
    carried = SileroDetector()
    _run(carried, loud[: history - quiet] + [SILENCE] * quiet)
    assert not np.array_equal(_run(carried, after), _run(SileroDetector(), after))


def test_silero_state_is_never_reset_inside_speech(
    fixture_frames: list[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Fluent speech for longer than the reset interval: with no quiet stretch there
    # is no reset (scores as a detector that never resets).
    speech = (fixture_frames[FLUENT] * 8)[: _windows_to_frames(vad.SILERO_RESET_EVERY_WINDOWS)]
    speech += fixture_frames[FLUENT]
    expected = _run(SileroDetector(), speech)
    monkeypatch.setattr(vad, "SILERO_RESET_EVERY_WINDOWS", 10**9)
    np.testing.assert_array_equal(_run(SileroDetector(), speech), expected)


def test_silero_shares_one_model_session() -> None:
    first, second = SileroDetector("onnxruntime"), SileroDetector("onnxruntime")
    assert first._session is not None
    assert first._session is second._session


@pytest.mark.skipif(
    silero_kernel.KERNEL is None,
    reason="the compiled Silero kernel was not built here, or this CPU lacks AVX2/FMA",
)
def test_silero_shares_one_copy_of_the_packed_weights() -> None:
    first, second = SileroDetector("compiled"), SileroDetector("compiled")
    assert first._weights is not None
    assert first._weights is second._weights
    assert not first._weights.flags.writeable


def test_silero_engine_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="unknown Silero engine 'torch'"):
        SileroDetector("torch")
    # Asked for by name where it is not available: a clear error, not onnxruntime.
    monkeypatch.setattr(silero_kernel, "KERNEL", None)
    vad._silero_packed_weights.cache_clear()
    try:
        with pytest.raises(ModelUnavailableError, match="compiled Silero kernel"):
            SileroDetector("compiled")
    finally:
        monkeypatch.undo()
        vad._silero_packed_weights.cache_clear()


def _clear_silero_caches() -> None:
    for cached in (vad._silero_model, vad._silero_session, vad._silero_packed_weights):
        cached.cache_clear()


def test_silero_model_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear_silero_caches()
    try:
        monkeypatch.setattr(vad, "SILERO_MODEL_SHA256", "0" * 64)
        with pytest.raises(ModelUnavailableError, match="SHA-256") as excinfo:
            SileroDetector()
        assert excinfo.value.reason == "vad_model_unavailable"
        monkeypatch.setattr(vad, "SILERO_MODEL_PACKAGE", "no_such_vad_model_package")
        with pytest.raises(ModelUnavailableError, match="not installed"):
            make_detector("cascade")
        with pytest.raises(ModelUnavailableError, match="not installed"):
            SileroDetector("onnxruntime")
    finally:
        monkeypatch.undo()
        _clear_silero_caches()
    preload("silero")


# ---- energy -------------------------------------------------------------------------


def test_energy_detector_is_the_endpointer_rule(fixture_frames: list[bytes]) -> None:
    detector, endpointer = EnergyDetector(), EnergyEndpointer()
    for i, frame in enumerate(fixture_frames):
        endpointer.process(frame, (i + 1) * 20.0)
        assert (detector.process(frame) >= SPEECH_THRESHOLD) == endpointer.frame_is_speech


def test_energy_detector_ignores_steady_noise_from_the_start() -> None:
    probabilities = _run(EnergyDetector(), _white(3.0, 3000.0))
    assert probabilities.max() < SPEECH_THRESHOLD


# ---- WebRTC -------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [-1, 4])
def test_webrtc_mode_checked(mode: int) -> None:
    with pytest.raises(ValueError, match=r"0\.\.3"):
        WebRtcDetector(mode)


def test_webrtc_answers_zero_or_one(fixture_frames: list[bytes]) -> None:
    probabilities = _run(WebRtcDetector(), fixture_frames[:200])
    assert set(probabilities.tolist()) == {0.0, 1.0}


# ---- cascade ------------------------------------------------------------------------


class _Scripted:
    """A gate that answers from a script."""

    def __init__(self, script: Sequence[float]) -> None:
        self.script = list(script)
        self.i = 0

    def process(self, frame: bytes, near_end: bool = True) -> float:
        if len(frame) != NARROWBAND_FRAME_BYTES:
            raise FrameLengthError(len(frame))
        self.i += 1
        return self.script[self.i - 1]

    def reset(self) -> None:
        self.i = 0


class _Recorder:
    """A neural stand-in that records what it is fed."""

    def __init__(self) -> None:
        self.fed: list[bytes] = []
        self.resets = 0

    def process(self, frame: bytes, near_end: bool = True) -> float:
        self.fed.append(frame)
        return 0.75

    def reset(self) -> None:
        self.resets += 1


def _numbered(n: int) -> list[bytes]:
    return [i.to_bytes(2, "little") * NARROWBAND_FRAME_SAMPLES for i in range(n)]


def test_cascade_runs_the_neural_detector_only_while_the_gate_is_open() -> None:
    frames = _numbered(40)
    script = [0.0] * 10 + [1.0] + [0.0] * 29
    gate, neural = _Scripted(script), _Recorder()
    cascade = CascadeDetector(gate, neural, hangover_frames=5, preroll_frames=3)
    out = []
    active = []
    for f in frames:
        out.append(cascade.process(f))
        active.append(cascade.active)
    # Idle before the gate fires; frame 10 opens it, frames 11-15 are the
    # hangover, from frame 16 the neural detector rests again.
    assert out == [0.0] * 10 + [0.75] * 6 + [0.0] * 24
    assert active == [False] * 10 + [True] * 6 + [False] * 24
    assert neural.resets == 0
    # Fed the three frames before the one that opened the gate first.
    assert neural.fed == frames[7:16]


def test_cascade_keeps_running_through_short_gate_dips() -> None:
    script = [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    neural = _Recorder()
    cascade = CascadeDetector(_Scripted(script), neural, hangover_frames=2, preroll_frames=0)
    out = _run(cascade, _numbered(len(script)))
    assert out.tolist() == [0.75] * 6 + [0.0] * 2
    assert neural.resets == 0


def test_cascade_feeds_the_preroll_at_every_opening_and_never_resets() -> None:
    frames = _numbered(20)
    script = [1.0] + [0.0] * 9 + [1.0] + [0.0] * 9
    neural = _Recorder()
    cascade = CascadeDetector(_Scripted(script), neural, hangover_frames=1, preroll_frames=2)
    out = _run(cascade, frames)
    assert out.tolist() == [0.75] * 2 + [0.0] * 8 + [0.75] * 2 + [0.0] * 8
    assert neural.fed == frames[0:2] + frames[8:12]
    assert neural.resets == 0
    cascade.reset()
    assert neural.resets == 1
    assert not cascade.active


def test_cascade_never_feeds_a_frame_twice() -> None:
    # The gate reopens one frame after the hangover ran out: of the preroll,
    # only that one skipped frame is new to the neural detector.
    frames = _numbered(8)
    script = [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    neural = _Recorder()
    cascade = CascadeDetector(_Scripted(script), neural, hangover_frames=1, preroll_frames=5)
    out = _run(cascade, frames)
    assert out.tolist() == [0.75, 0.75, 0.0, 0.75, 0.75, 0.0, 0.0, 0.0]
    assert neural.fed == frames[0:5]


def test_cascade_is_silero_while_the_gate_stays_open(fixture_frames: list[bytes]) -> None:
    # The fixture never pauses longer than the hangover, and the preroll
    # covers the frames before the gate first opens: Silero hears every frame.
    frames = fixture_frames[:400]
    cascade = CascadeDetector()
    out = _run(cascade, frames)
    alone = _run(SileroDetector(), frames)
    opened = int(np.flatnonzero(out)[0])
    assert opened <= vad.CASCADE_PREROLL_FRAMES
    np.testing.assert_array_equal(out[opened:], alone[opened:])


def test_cascade_is_idle_on_a_quiet_line() -> None:
    neural = _Recorder()
    cascade = CascadeDetector(EnergyDetector(CASCADE_GATE_CONFIG), neural)
    assert _run(cascade, [SILENCE] * SECOND + _white(2.0, 10.0)).max() == 0.0
    assert neural.fed == []


def test_cascade_wrong_length_changes_nothing() -> None:
    neural = _Recorder()
    cascade = CascadeDetector(_Scripted([1.0] * 3), neural, preroll_frames=2)
    cascade.process(SILENCE)
    with pytest.raises(FrameLengthError):
        cascade.process(b"\x00\x00")
    cascade.process(SILENCE)
    assert len(neural.fed) == 2


@pytest.mark.parametrize("kwargs", [{"hangover_frames": -1}, {"preroll_frames": -1}])
def test_cascade_rejects_negative_counts(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        CascadeDetector(_Scripted([]), _Recorder(), **kwargs)


# ---- choice -------------------------------------------------------------------------


def test_make_detector_names() -> None:
    assert DETECTOR_NAMES == ("energy", "webrtc", "silero", "cascade")
    assert DEFAULT_DETECTOR in DETECTOR_NAMES
    kinds = {
        "energy": EnergyDetector,
        "webrtc": WebRtcDetector,
        "silero": SileroDetector,
        "cascade": CascadeDetector,
    }
    for n, kind in kinds.items():
        assert type(make_detector(n)) is kind
    assert type(make_detector()) is kinds[DEFAULT_DETECTOR]
    assert make_detector("energy") is not make_detector("energy")


def test_make_detector_unknown_name() -> None:
    with pytest.raises(ValueError, match="valid names: energy, webrtc, silero, cascade"):
        make_detector("silero-v4")


def test_cascade_spends_nothing_on_frames_the_echo_judge_calls_echo() -> None:
    frames = _numbered(20)
    gate, neural = _Scripted([1.0] * 20), _Recorder()  # the line is loud: assistant echo
    cascade = CascadeDetector(gate, neural, hangover_frames=0, preroll_frames=0)
    out = [cascade.process(f, near_end=n >= 15) for n, f in enumerate(frames)]
    assert out == [0.0] * 15 + [0.75] * 5
    assert neural.fed == frames[15:]
