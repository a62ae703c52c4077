"""The compiled media kernels (``media/_kernels.c``), or None where they were not built.

``pip install`` builds them as an optional C extension (``setup.py``): on a machine with
no C compiler the install goes on without them, and each user of a kernel runs its numpy
code instead (:mod:`media.echo_kernels`, :mod:`media.polyphase`); ``rutster serve`` warns.
"""

from __future__ import annotations

from types import ModuleType

__all__ = ["KERNELS", "describe"]


def _load() -> ModuleType | None:
    try:
        from rutster.media import _kernels
    except ImportError:
        return None
    return _kernels


#: The module of compiled kernels, or None.
KERNELS = _load()


def describe() -> str:
    """Which kernels run, for logs and benchmark headers (a figure says what build made it)."""
    if KERNELS is None:
        return "numpy twins (the C kernels were not built)"
    return "compiled (media/_kernels.c)"
