"""Silero VAD's 8 kHz network run by the compiled kernel (``media/_silero.c``).

:class:`media.vad.SileroDetector` runs Silero VAD v6 one 32 ms window at a time. In
onnxruntime that costs ~70 µs a window on the dev VM, most of it the runtime's
per-node dispatch, not the network's ~0.38 M multiply-adds; the kernel runs the same
network in ~24 µs (the C file says why it is written by hand). This module packs the
network's weights, read from the same hash-checked model file with the ``onnx``
package, into the layout the kernel reads.

The kernel's probabilities are onnxruntime's within about 1e-6 (sums run in another
order); ``tests/test_media_silero_kernel.py`` holds them to that on recorded speech.
Where the kernel was not built (no C compiler at install) or the CPU lacks AVX2 and
FMA, :data:`KERNEL` is None and the detector runs the model in onnxruntime.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import numpy.typing as npt

__all__ = ["KERNEL", "LANES", "pack_weights"]

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


def pack_weights(model: bytes) -> npt.NDArray[np.float32]:
    """The 8 kHz network's weights from ``model`` (the ONNX file), packed for the kernel.

    Raises ``ValueError`` when the model lacks a weight or holds one of another shape.
    """
    import onnx  # ~0.3 s to import: only when the kernel is wanted.
    from onnx import numpy_helper

    graph = onnx.load_from_string(model).graph
    found = {
        init.name.removeprefix(BRANCH_PREFIX): init
        for init in graph.initializer
        if init.name.startswith(BRANCH_PREFIX)
    }
    weights: dict[str, npt.NDArray[np.float32]] = {}
    for name, shape in WEIGHT_SHAPES:
        if name not in found:
            raise ValueError(f"the Silero model has no {BRANCH_PREFIX}{name}")
        array = numpy_helper.to_array(found[name]).astype(np.float32)
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
