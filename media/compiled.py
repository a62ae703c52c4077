"""The compiled media kernels (``media/_kernels.c``), or None where they were not built.

``pip install`` builds them as an optional C extension (``setup.py``): on a machine with
no C compiler the install goes on without them, and each user of a kernel runs its numpy
code instead (:mod:`media.echo_kernels`, :mod:`media.polyphase`); ``rutster serve`` warns.
Silero's compiled network (``media/_silero.c``) is a second optional extension, whose
stand-in is onnxruntime (:mod:`media.silero_kernel`); :func:`describe` names both.
"""

from __future__ import annotations

from types import ModuleType

from rutster.media import silero_kernel

__all__ = ["KERNELS", "describe"]


def _load() -> ModuleType | None:
    try:
        from rutster.media import _kernels
    except ImportError:
        return None
    return _kernels


#: The module of compiled kernels, or None.
KERNELS = _load()


def describe(silero_engine: str | None = None) -> str:
    """Which kernels run, for logs and benchmark headers (a figure says what build made it).

    ``silero_engine``: the engine a configuration asks Silero to run in (None: the
    default, the compiled kernel wherever it was built).
    """
    kernels = (
        "numpy twins (the C kernels were not built)"
        if KERNELS is None
        else "compiled (media/_kernels.c)"
    )
    if silero_engine == "onnxruntime":
        silero = "onnxruntime (RUTSTER_SILERO_ENGINE)"
    elif silero_kernel.KERNEL is None:
        silero = "onnxruntime (its kernel was not built or this CPU lacks AVX2 and FMA)"
    else:
        silero = "compiled (media/_silero.c)"
    return f"{kernels}; Silero VAD: {silero}"
