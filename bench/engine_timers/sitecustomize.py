"""Timers around the per-call engine's parts inside ``rutster serve`` (benchmark use only).

``python -m bench.call_profile --timers`` puts this directory first on the gateway's
``PYTHONPATH``, so Python imports this file at start-up as ``sitecustomize``. In a process
started as ``... serve`` with ``RUTSTER_BENCH_TIMERS`` set, each method of :data:`TIMED` is
wrapped: its thread CPU time (``time.thread_time_ns``) and its calls are added up, and the
totals are written as JSON to that path every :data:`SNAPSHOT_EVERY_S` (the benchmark
takes the difference of two snapshots). The gateway neither imports nor knows of it.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

#: (module, class, method) of each part timed; nested parts overlap their parents.
TIMED: tuple[tuple[str, str, str], ...] = (
    ("rutster.gateway.media_engine", "MediaEngine", "on_ingress"),
    ("rutster.gateway.media_engine", "MediaEngine", "poll"),
    ("rutster.gateway.media_engine", "MediaEngine", "on_brain"),
    ("rutster.media.transform", "InboundTransform", "decode"),
    ("rutster.media.transform", "InboundTransform", "frames"),
    ("rutster.media.transform", "OutboundTransform", "resample"),
    ("rutster.media.transform", "OutboundTransform", "encode"),
    ("rutster.media.narrowband", "NarrowbandTap", "push"),
    ("rutster.gateway.reflex", "ReflexLoop", "on_caller_frame"),
    ("rutster.media.echo_gate", "EchoGate", "capture"),
    ("rutster.media.echo_gate", "EchoGate", "render"),
    ("rutster.media.vad", "CascadeDetector", "process"),
    ("rutster.media.vad", "SileroDetector", "_run_window"),
)
#: How often the totals are written (seed decision: a tenth of the shortest window timed).
SNAPSHOT_EVERY_S = 0.5


def _timed(method: Callable[..., Any], total: list[int]) -> Callable[..., Any]:
    clock = time.thread_time_ns

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = clock()
        try:
            return method(*args, **kwargs)
        finally:
            total[0] += clock() - started
            total[1] += 1

    return wrapper


def _install(path: str) -> None:
    totals: dict[str, list[int]] = {}
    for module_name, class_name, method_name in TIMED:
        cls = getattr(importlib.import_module(module_name), class_name)
        total = totals.setdefault(f"{class_name}.{method_name}", [0, 0])
        setattr(cls, method_name, _timed(getattr(cls, method_name), total))

    def snapshot() -> None:
        body = {name: {"cpu_ns": ns, "calls": n} for name, (ns, n) in totals.items()}
        temporary = f"{path}.tmp"
        with open(temporary, "w", encoding="utf-8") as out:
            json.dump(body, out)
        os.replace(temporary, path)

    def every_while() -> None:
        while True:
            time.sleep(SNAPSHOT_EVERY_S)
            snapshot()

    atexit.register(snapshot)
    threading.Thread(target=every_while, name="bench-timers", daemon=True).start()


if os.environ.get("RUTSTER_BENCH_TIMERS") and "serve" in sys.argv:
    # sitecustomize runs before ``python -m`` puts the working directory first on
    # sys.path: imported now, rutster would come from the installed (or editable) copy,
    # while the gateway run from another checkout imports that checkout's. Measured
    # code must be the code that runs.
    if sys.path[:1] != [os.getcwd()]:
        sys.path.insert(0, os.getcwd())
    _install(os.environ["RUTSTER_BENCH_TIMERS"])
