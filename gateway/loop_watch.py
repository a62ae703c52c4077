"""The event loop's own measurements, fed to the overload guard: CPU share and lateness.

A task of the app wakes every ``SAMPLE_INTERVAL_S``; how late it wakes is how long
everything else queued on the loop made it wait, and the loop thread's CPU time
(``time.thread_time``: the per-call media work, Silero included, runs on this thread)
over wall time is how busy the loop is. The decision is the guard's
(``gateway/overload_guard.py``); this module is the clock and nothing else.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from rutster.gateway.overload_guard import SAMPLE_INTERVAL_S, LoopSample, OverloadGuard


async def watch_loop(guard: OverloadGuard, live_calls: Callable[[], int]) -> None:
    """Sample the running loop into ``guard`` until cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        planned = loop.time() + SAMPLE_INTERVAL_S
        await asyncio.sleep(SAMPLE_INTERVAL_S)
        now = loop.time()
        guard.on_sample(LoopSample(now, time.thread_time(), max(0.0, now - planned), live_calls()))
