"""Silero VAD's 8 kHz network run by the compiled kernel (``media/_silero.c``).

:class:`media.vad.SileroDetector` runs Silero VAD v6 one 32 ms window at a time. In
onnxruntime that costs ~70 µs a window on the dev VM, most of it the runtime's
per-node dispatch, not the network's ~0.38 M multiply-adds; the kernel runs the same
network in ~24 µs (the C file says why it is written by hand). This module reads the
network's weights from the same hash-checked model file and packs them into the layout
the kernel reads.

The weights are read by :func:`float_initializers`, a reader of the few protobuf fields
that hold an ONNX model's float tensors, not by the ``onnx`` package: importing ``onnx``
cost 0.7-1.0 s at every gateway start (measured: ``python -X importtime``, most of it its
``ml_dtypes`` dependency) to read 15 tensors of one pinned file. The protobuf wire format
is small and fixed (protobuf.dev, "Encoding"); ``tests/test_media_silero_kernel.py``
holds the reader to ``onnx.numpy_helper`` (a development dependency) on the model.

The kernel's probabilities are onnxruntime's within about 1e-6 (sums run in another
order); ``tests/test_media_silero_kernel.py`` holds them to that on recorded speech.
Where the kernel was not built (no C compiler at install) or the CPU lacks AVX2 and
FMA, :data:`KERNEL` is None and the detector runs the model in onnxruntime.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from types import ModuleType

import numpy as np
import numpy.typing as npt

__all__ = ["KERNEL", "LANES", "float_initializers", "pack_weights"]

#: Outputs per block in the kernel's weight layout ([output / LANES][input][LANES]:
#: one AVX vector of float32).
LANES = 8
#: Rows of the STFT's weights in the kernel: its 130 filters and zero rows up to a
#: multiple of the kernel's 32 outputs a pass (``SPEC_ROWS`` in the C file).
SPEC_ROWS = 160
#: Float32 values after the decoder's bias (one value) that pad it to a vector.
DECODER_BIAS_FLOATS = 8
#: Prefix of the 8 kHz branch's initializers in silero_vad_op18_ifless.onnx.
BRANCH_PREFIX = "model_8k."
#: The 8 kHz branch's weights, in the kernel's order, with their shapes in the model.
WEIGHT_SHAPES: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("stft.forward_basis_buffer", (130, 1, 128)),
    ("encoder.0.reparam_conv.weight", (128, 65, 3)),
    ("encoder.0.reparam_conv.bias", (128,)),
    ("encoder.1.reparam_conv.weight", (64, 128, 3)),
    ("encoder.1.reparam_conv.bias", (64,)),
    ("encoder.2.reparam_conv.weight", (64, 64, 3)),
    ("encoder.2.reparam_conv.bias", (64,)),
    ("encoder.3.reparam_conv.weight", (128, 64, 3)),
    ("encoder.3.reparam_conv.bias", (128,)),
    ("decoder.rnn.weight_ih", (512, 128)),
    ("decoder.rnn.weight_hh", (512, 128)),
    ("decoder.rnn.bias_ih", (512,)),
    ("decoder.rnn.bias_hh", (512,)),
    ("decoder.decoder.2.weight", (1, 128, 1)),
    ("decoder.decoder.2.bias", (1,)),
)


def _load() -> ModuleType | None:
    try:
        from rutster.media import _silero
    except ImportError:
        return None
    return _silero if _silero.SUPPORTED else None


#: The compiled kernel, or None where it was not built or this CPU cannot run it.
KERNEL = _load()


def _blocked(matrix: npt.NDArray[np.float32], rows: int | None = None) -> npt.NDArray[np.float32]:
    """``matrix`` ([output][input...]) as the kernel reads it: [output / 8][input][8]."""
    flat = matrix.reshape(matrix.shape[0], -1)
    if rows is not None:
        flat = np.pad(flat, ((0, rows - flat.shape[0]), (0, 0)))
    outputs, inputs = flat.shape
    return flat.reshape(outputs // LANES, LANES, inputs).transpose(0, 2, 1).ravel()


# ---- protobuf wire format (protobuf.dev/programming-guides/encoding) ------------------

#: Wire types: a varint, 8 bytes, a length-delimited run, 4 bytes.
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
#: Field numbers in onnx.proto (github.com/onnx/onnx, onnx/onnx.proto): ModelProto.graph,
#: GraphProto.initializer, and TensorProto's dims, data_type, float_data, name, raw_data
#: and data_location.
_MODEL_GRAPH, _GRAPH_INITIALIZER = 7, 5
_TENSOR_DIMS, _TENSOR_TYPE, _TENSOR_FLOATS, _TENSOR_NAME, _TENSOR_RAW, _TENSOR_LOCATION = (
    1,
    2,
    4,
    8,
    9,
    14,
)
#: TensorProto.DataType FLOAT and DataLocation EXTERNAL (onnx.proto).
_FLOAT, _EXTERNAL = 1, 1


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("the ONNX model is truncated or malformed (a varint)")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, at


def _fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of each field of one message, in order."""
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == _VARINT:
            value, at = _varint(data, at)
        elif wire == _LEN:
            size, at = _varint(data, at)
            value, at = data[at : at + size], at + size
        elif wire in (_I64, _I32):
            size = 8 if wire == _I64 else 4
            value, at = data[at : at + size], at + size
        else:
            raise ValueError(f"the ONNX model has a field of wire type {wire} (groups)")
        if at > len(data):
            raise ValueError("the ONNX model is truncated or malformed (a field runs past)")
        yield number, wire, value


def _packed_varints(data: bytes) -> list[int]:
    values, at = [], 0
    while at < len(data):
        value, at = _varint(data, at)
        values.append(value)
    return values


def float_initializers(model: bytes, prefix: str = "") -> dict[str, npt.NDArray[np.float32]]:
    """The float tensors among the graph's initializers of ``model`` (a serialised ONNX
    ModelProto) whose names start with ``prefix``, by name, as arrays of their dims.

    Raises ``ValueError`` for a malformed model, a tensor kept in an external file, or a
    tensor whose data does not fill its dims. Tensors of other types are skipped.
    """
    found: dict[str, npt.NDArray[np.float32]] = {}
    for number, wire, graph in _fields(model):
        if number != _MODEL_GRAPH or wire != _LEN:
            continue
        assert isinstance(graph, bytes)
        for field, kind, tensor in _fields(graph):
            if field != _GRAPH_INITIALIZER or kind != _LEN:
                continue
            assert isinstance(tensor, bytes)
            dims: list[int] = []
            data_type = 0
            name = ""
            raw: bytes | None = None
            floats: list[bytes] = []
            external = False
            for tag, _, value in _fields(tensor):
                if tag == _TENSOR_DIMS:
                    if isinstance(value, bytes):
                        dims += _packed_varints(value)
                    else:
                        dims.append(value)
                elif tag == _TENSOR_TYPE and isinstance(value, int):
                    data_type = value
                elif tag == _TENSOR_NAME and isinstance(value, bytes):
                    name = value.decode("utf-8", "replace")
                elif tag == _TENSOR_RAW and isinstance(value, bytes):
                    raw = value
                elif tag == _TENSOR_FLOATS and isinstance(value, bytes):
                    floats.append(value)  # packed (wire type 2) or one float (type 5)
                elif tag == _TENSOR_LOCATION and isinstance(value, int):
                    external = value == _EXTERNAL
            if data_type != _FLOAT or not name.startswith(prefix):
                continue
            if external:
                raise ValueError(f"the ONNX tensor {name} is kept in an external file")
            data = raw if raw is not None else b"".join(floats)
            count = math.prod(dims)
            if len(data) != 4 * count:
                raise ValueError(f"the ONNX tensor {name} holds {len(data)} bytes for dims {dims}")
            found[name] = np.frombuffer(data, dtype="<f4").astype(np.float32).reshape(dims)
    return found


def pack_weights(model: bytes) -> npt.NDArray[np.float32]:
    """The 8 kHz network's weights from ``model`` (the ONNX file), packed for the kernel.

    Raises ``ValueError`` when the model lacks a weight or holds one of another shape.
    """
    found = {
        name.removeprefix(BRANCH_PREFIX): array
        for name, array in float_initializers(model, BRANCH_PREFIX).items()
    }
    weights: dict[str, npt.NDArray[np.float32]] = {}
    for name, shape in WEIGHT_SHAPES:
        if name not in found:
            raise ValueError(f"the Silero model has no {BRANCH_PREFIX}{name}")
        array = found[name]
        if array.shape != shape:
            raise ValueError(f"{BRANCH_PREFIX}{name} has shape {array.shape}, expected {shape}")
        weights[name] = array
    parts = [_blocked(weights["stft.forward_basis_buffer"], SPEC_ROWS)]
    for layer in range(4):
        parts.append(_blocked(weights[f"encoder.{layer}.reparam_conv.weight"]))
        parts.append(weights[f"encoder.{layer}.reparam_conv.bias"])
    parts += [
        _blocked(weights["decoder.rnn.weight_ih"]),
        _blocked(weights["decoder.rnn.weight_hh"]),
        weights["decoder.rnn.bias_ih"],
        weights["decoder.rnn.bias_hh"],
        weights["decoder.decoder.2.weight"].ravel(),
        np.pad(weights["decoder.decoder.2.bias"], (0, DECODER_BIAS_FLOATS - 1)),
    ]
    packed = np.ascontiguousarray(np.concatenate(parts), dtype=np.float32)
    packed.setflags(write=False)
    return packed
