"""The real-time echo checks' one rerun, and the SIP tests' echo-quality check.

An echo test through the gateway judges what the caller heard against what it
said, in real time, across several processes: for SIP the pjsua caller, one or
more workers, the gateway, the echo brain and Redis, judged by correlation per
half-second segment (:func:`tools.sip_load_generator.analyse_echo`); for Twilio
the simulator, the gateway and the brain, judged window by window
(:func:`tests.echo_checks.judge_echo`). On CI's shared two-core machine a stall
of the host spoils that now and then:

- CI runs failed ``tests/test_sip_load_stack.py`` at correlation 0.71 (the
  gateway's pacer woke up to 50 ms late at p99) and
  ``tests/test_gateway_calls.py::test_three_calls_at_once`` with windows at 0.82
  and 0.48.
- On this machine with two busy loops taking both cores, the small ``sip-load``
  run of the first scored a minimum of 0.60-0.62 in some runs and 0.999 in the
  others, on the code before and after the polyphase resampler alike (8725887,
  a517306); with one busy loop, 0.999 in 18 of 18. The second failed 3 of 12
  runs, and as many with a 2 s shed hold-off tried in the pacer; 4 of 6 at
  8725887.

The hostile campaign's quick test judges its honest calls the same way and is
rerun the same way (its attack is seeded, so a rerun is the same attack).

Lowering the floors cannot tell that from a broken call (losing every other
frame scores 0.68; a wrong rate, byte order or noise 0.04-0.09), so they stay
and a shortfall is run once more: a path that is broken fails twice. Only a
shortfall of echo quality is rerun, never a failed call, a wrong count or an
error (``only_rerun`` matches :data:`ECHO_SHORTFALL`).
"""

from __future__ import annotations

import pytest

from tests.echo_checks import ECHO_SHORTFALL

__all__ = ["ECHO_SHORTFALL", "MIN_SIP_ECHO_CORRELATION", "check_sip_echo", "realtime_echo"]

#: Correlation an echoed SIP call must reach: L16 16 kHz both ways and two
#: resamplings leave 0.999 on the project's recording (measured, sip-load).
MIN_SIP_ECHO_CORRELATION = 0.8

#: Mark for a test whose echo quality depends on real-time scheduling of several
#: processes: one more run when (and only when) its echo fell short.
realtime_echo = pytest.mark.flaky(reruns=1, only_rerun=[ECHO_SHORTFALL])


def check_sip_echo(corr: float | None, what: object = "") -> None:
    """Fail with :data:`ECHO_SHORTFALL` unless ``corr`` exceeds the floor."""
    if corr is None or corr <= MIN_SIP_ECHO_CORRELATION:
        raise AssertionError(
            f"{ECHO_SHORTFALL}: correlation {corr} <= {MIN_SIP_ECHO_CORRELATION} {what}"
        )
