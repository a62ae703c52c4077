"""``Endpoint.libCreate`` without pjlib's start-up banner on stdout.

libCreate logs a few lines at pjlib's default level before ``libInit`` can set
ours, straight to fd 1, so stdout (a CLI report, a test's output) would carry
pjlib's version banner. Muting fd 1 for that one call keeps it clean.
"""

from __future__ import annotations

import os
from typing import Any


def lib_create_quietly(endpoint: Any) -> None:
    """Call ``endpoint.libCreate()`` with fd 1 pointed at /dev/null."""
    saved = os.dup(1)
    try:
        with open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), 1)
            endpoint.libCreate()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
