"""Parts of the per-call engine cut out of ``rutster serve`` (a measurement, never a setting).

``python -m bench.vs_pipecat --without PART`` puts this directory first on the gateway's
``PYTHONPATH``, so Python imports this file at start-up as ``sitecustomize``. In a process
started as ``... serve`` with ``RUTSTER_BENCH_WITHOUT`` set to one of :data:`PARTS`, the
part is replaced by one that does nothing, so that the capacity measured is what the
gateway would carry if that part cost nothing:

- ``vad``: the voice-activity detector answers 0.0 for every frame without running (the
  echo gate and the reflex loop's decisions still run; no caller turn is ever heard, which
  the echo brain, which echoes every frame, does not need);
- ``reflex``: the whole reflex loop: no echo gate (neither the caller's frames nor the
  assistant's), no VAD, no turn-taking or barge-in. The transforms, the pacer, the
  played ledger and the sockets stay.

The gateway neither imports nor knows of this file; the calls it serves so are not a
product's calls (no turns, no barge-in), only a bound on what those parts cost.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

#: What ``RUTSTER_BENCH_WITHOUT`` may name.
PARTS = ("vad", "reflex")


def _nothing_heard(self: Any, frame: bytes, near_end: bool = True) -> float:
    return 0.0


def _no_actions(self: Any, frame: bytes, now_ms: float) -> list[Any]:
    return []


def _not_rendered(self: Any, wire: bytes, now_ms: float) -> None:
    return None


def install(part: str) -> None:
    """Replace ``part``'s methods (see the module docstring); ValueError for another name."""
    if part == "vad":
        vad = importlib.import_module("rutster.media.vad")
        for name in ("EnergyDetector", "WebRtcDetector", "SileroDetector", "CascadeDetector"):
            getattr(vad, name).process = _nothing_heard
    elif part == "reflex":
        reflex = importlib.import_module("rutster.gateway.reflex")
        engine = importlib.import_module("rutster.gateway.media_engine")
        reflex.ReflexLoop.on_caller_frame = _no_actions
        engine.MediaEngine._render = _not_rendered
    else:
        raise ValueError(f"RUTSTER_BENCH_WITHOUT is one of {', '.join(PARTS)}, not {part!r}")


if os.environ.get("RUTSTER_BENCH_WITHOUT") and "serve" in sys.argv:
    # As bench/engine_timers/sitecustomize.py: rutster must come from the checkout the
    # benchmark runs from, which ``python -m`` puts first on sys.path only after this runs.
    if sys.path[:1] != [os.getcwd()]:
        sys.path.insert(0, os.getcwd())
    try:
        install(os.environ["RUTSTER_BENCH_WITHOUT"])
    except ValueError as exc:
        # site.py would print an Exception raised here and go on, serving uncut: a wrong
        # measurement. SystemExit is not caught there.
        raise SystemExit(str(exc)) from None
