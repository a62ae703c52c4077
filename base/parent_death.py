"""A child process that stops when its parent dies, however the parent dies (Linux).

A process killed with SIGKILL runs no cleanup, so what it started (the embedded
``redis-server``, the workers of ``rutster serve --workers``) would run on as
orphans. ``prctl(PR_SET_PDEATHSIG)`` is the kernel's own answer: the child gets a
signal when the thread that started it ends.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

#: ``PR_SET_PDEATHSIG`` (<linux/prctl.h>): the signal a process gets when the
#: thread that created it ends.
_PR_SET_PDEATHSIG = 1


def stop_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the child get SIGTERM when its parent dies (Linux).

    Redis has no option to watch its parent, and a gateway killed with SIGKILL
    runs no cleanup. ``prctl(PR_SET_PDEATHSIG)`` is the kernel's own answer; the
    function only calls it (no allocation, no lock: what a ``preexec_fn``
    may safely do in a process with threads), then checks that the parent did
    not die before the call took effect. None elsewhere (no such call).
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    stop = int(signal.SIGTERM)

    def stop_with_parent() -> None:
        prctl(_PR_SET_PDEATHSIG, stop)
        if os.getppid() != parent:
            os._exit(1)  # the parent is already gone

    return stop_with_parent
