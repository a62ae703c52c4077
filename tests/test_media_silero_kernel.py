"""Silero's compiled 8 kHz network (media/_silero.c, media/silero_kernel.py) against onnxruntime."""

from __future__ import annotations

import contextlib
import wave
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rutster.media import silero_kernel, vad
from rutster.media.formats import NARROWBAND_FRAME_BYTES
from rutster.media.vad import SPEECH_THRESHOLD, SileroDetector

pytestmark = pytest.mark.skipif(
    silero_kernel.KERNEL is None,
    reason="the compiled Silero kernel was not built here, or this CPU lacks AVX2/FMA",
)

AUDIO = Path(__file__).parent / "fixtures" / "audio"
#: Largest difference from onnxruntime's probability allowed (measured up to 1.8e-6 on
#: the speech fixture: the kernel sums in another order, with fused multiply-adds).
PROBABILITY_TOLERANCE = 1e-5
#: The same for the recurrent state after a whole recording (measured up to 4e-5: the
#: cell state is unbounded and carries every window's rounding).
STATE_TOLERANCE = 1e-3
WINDOW = 288
STATE = 256


def _recording_frames(name: str) -> list[bytes]:
    with wave.open(str(AUDIO / name), "rb") as wav:
        pcm = wav.readframes(wav.getnframes())
        rate = wav.getframerate()
    if rate != 8_000:  # the espeak fixture: every other sample is enough for a probe
        samples = np.frombuffer(pcm, dtype="<i2")[:: rate // 8_000]
        pcm = samples.astype("<i2").tobytes()
    step = NARROWBAND_FRAME_BYTES
    return [pcm[i : i + step] for i in range(0, len(pcm) - step + 1, step)]


@pytest.mark.parametrize("recording", ["caller_speech_8k.wav", "espeak_speech_16k.wav"])
def test_the_kernel_scores_recorded_speech_as_onnxruntime_does(recording: str) -> None:
    frames = _recording_frames(recording)
    compiled, reference = SileroDetector("compiled"), SileroDetector("onnxruntime")
    got = np.array([compiled.process(f) for f in frames])
    expected = np.array([reference.process(f) for f in frames])
    np.testing.assert_allclose(got, expected, rtol=0, atol=PROBABILITY_TOLERANCE)
    # The same frames are speech, and there is speech and non-speech to tell apart.
    np.testing.assert_array_equal(got >= SPEECH_THRESHOLD, expected >= SPEECH_THRESHOLD)
    assert 0.2 < np.mean(expected >= SPEECH_THRESHOLD) < 0.9
    np.testing.assert_allclose(compiled._state, reference._state, rtol=0, atol=STATE_TOLERANCE)


def test_the_kernel_matches_onnxruntime_from_any_state() -> None:
    # A state the recordings never reach (large cell values), and loud full-scale input.
    rng = np.random.default_rng(3)
    session = vad._silero_session()
    weights = vad._silero_packed_weights()
    kernel = silero_kernel.KERNEL
    assert kernel is not None
    for _ in range(20):
        window = rng.uniform(-1, 1, (1, WINDOW)).astype(np.float32)
        state = (rng.standard_normal((2, 1, 128)) * 3).astype(np.float32)
        out, state_out = session.run(
            None, {"input": window, "state": state, "sr": np.array(8_000, dtype=np.int64)}
        )
        mine = state.copy()
        p = kernel.window_probability(weights, window, mine)
        assert abs(p - float(out[0, 0])) <= PROBABILITY_TOLERANCE
        np.testing.assert_allclose(mine, state_out, rtol=0, atol=1e-4)


def _arrays() -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    weights = vad._silero_packed_weights()
    return weights, np.zeros(WINDOW, np.float32), np.zeros(STATE, np.float32)


def test_the_kernel_refuses_wrong_buffers_with_a_clear_error() -> None:
    kernel = silero_kernel.KERNEL
    assert kernel is not None
    weights, window, state = _arrays()
    assert 0.0 < kernel.window_probability(weights, window, state) < 1.0
    with pytest.raises(ValueError, match="window must be 288 contiguous float32"):
        kernel.window_probability(weights, np.zeros(WINDOW - 1, np.float32), state)
    with pytest.raises(ValueError, match="window must be 288 contiguous float32"):
        kernel.window_probability(weights, np.zeros(WINDOW, np.float64), state)
    with pytest.raises(ValueError, match="state must be 256"):
        kernel.window_probability(weights, window, np.zeros(STATE + 1, np.float32))
    with pytest.raises(ValueError, match="weights must be"):
        kernel.window_probability(weights[:-1], window, state)
    # numpy refuses to export these buffers (ValueError; BufferError from other exporters).
    with pytest.raises((BufferError, ValueError)):  # non-contiguous
        kernel.window_probability(weights, np.zeros(2 * WINDOW, np.float32)[::2], state)
    read_only = np.zeros(STATE, np.float32)
    read_only.setflags(write=False)
    with pytest.raises((BufferError, ValueError)):  # the state is written
        kernel.window_probability(weights, window, read_only)
    with pytest.raises(TypeError, match="takes 3 arguments"):
        kernel.window_probability(weights, window)


def _model(weights: dict[str, npt.NDArray[np.float32]]) -> bytes:
    """A model holding only ``weights`` as initializers (all pack_weights reads)."""
    inits = [
        helper.make_tensor(
            f"{silero_kernel.BRANCH_PREFIX}{name}", TensorProto.FLOAT, a.shape, a.ravel()
        )
        for name, a in weights.items()
    ]
    graph = helper.make_graph([], "weights", [], [], inits)
    serialized: bytes = helper.make_model(graph).SerializeToString()
    return serialized


def test_packing_checks_every_weight_it_reads() -> None:
    weights = {name: np.zeros(shape, np.float32) for name, shape in silero_kernel.WEIGHT_SHAPES}
    packed = silero_kernel.pack_weights(_model(weights))
    kernel = silero_kernel.KERNEL
    assert kernel is not None
    assert packed.size == kernel.packed_floats()
    missing = dict(weights)
    del missing["decoder.rnn.weight_hh"]
    with pytest.raises(ValueError, match=r"no model_8k\.decoder\.rnn\.weight_hh"):
        silero_kernel.pack_weights(_model(missing))
    reshaped = dict(weights)
    reshaped["encoder.1.reparam_conv.weight"] = np.zeros((64, 128, 5), np.float32)
    with pytest.raises(ValueError, match=r"encoder.1.reparam_conv.weight has shape \(64, 128, 5\)"):
        silero_kernel.pack_weights(_model(reshaped))


def test_packing_lays_each_matrix_out_in_blocks_of_eight_outputs() -> None:
    # [output][input] -> [output / 8][input][8]: output o, input k at (o // 8, k, o % 8).
    matrix = np.arange(16 * 3, dtype=np.float32).reshape(16, 3)
    blocked = silero_kernel._blocked(matrix).reshape(2, 3, 8)
    for o in range(16):
        for k in range(3):
            assert blocked[o // 8, k, o % 8] == matrix[o, k]
    padded = silero_kernel._blocked(matrix[:13], rows=16).reshape(2, 3, 8)
    assert not padded[1, :, 5:].any()


# ---- the weight reader (silero_kernel.float_initializers) -------------------------------


def test_the_weight_reader_reads_every_float_tensor_as_onnx_does() -> None:
    model = vad._silero_model()
    expected = {
        init.name: numpy_helper.to_array(init)
        for init in onnx.load_from_string(model).graph.initializer
        if init.data_type == TensorProto.FLOAT
    }
    got = silero_kernel.float_initializers(model)
    assert set(got) == set(expected)
    assert len([n for n in got if n.startswith(silero_kernel.BRANCH_PREFIX)]) == 15
    for name, array in expected.items():
        assert got[name].dtype == np.float32
        np.testing.assert_array_equal(got[name], array, err_msg=name)


def test_the_weight_reader_refuses_a_malformed_model_with_a_clear_error() -> None:
    weights = {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}
    model = _model(weights)
    assert silero_kernel.float_initializers(model, silero_kernel.BRANCH_PREFIX)[
        "model_8k.w"
    ].shape == (2, 3)
    with pytest.raises(ValueError, match="truncated or malformed"):
        silero_kernel.float_initializers(model[:-3])
    with pytest.raises(ValueError, match="wire type 3"):
        silero_kernel.float_initializers(bytes([(7 << 3) | 3]))
    # Raw data that does not fill the dims.
    short = TensorProto(
        name="model_8k.w", data_type=TensorProto.FLOAT, dims=[2, 3], raw_data=bytes(20)
    )
    graph = helper.make_graph([], "g", [], [], [short])
    with pytest.raises(ValueError, match="holds 20 bytes for dims \\[2, 3\\]"):
        silero_kernel.float_initializers(helper.make_model(graph).SerializeToString())
    # Kept in an external file: not read.
    external = helper.make_tensor("model_8k.w", TensorProto.FLOAT, (1,), [1.0])
    external.data_location = TensorProto.EXTERNAL
    graph = helper.make_graph([], "g", [], [], [external])
    with pytest.raises(ValueError, match="external file"):
        silero_kernel.float_initializers(helper.make_model(graph).SerializeToString())


def test_the_weight_reader_survives_random_bytes() -> None:
    rng = np.random.default_rng(11)
    model = vad._silero_model()
    for _ in range(300):
        if rng.random() < 0.5:
            data = rng.bytes(int(rng.integers(0, 400)))
        else:  # the real model with a few bytes flipped
            flipped = bytearray(model[:20_000])
            for at in rng.integers(0, len(flipped), 5):
                flipped[at] = int(rng.integers(0, 256))
            data = bytes(flipped)
        with contextlib.suppress(ValueError):  # a clear error, or tensors: nothing else
            silero_kernel.float_initializers(data)
