"""Whether this node can take one more call: a fixed cap and what its event loop measured.

A node offered more calls than its core can pace does not degrade gently: every
call's 20 ms frames queue behind every other's, all of them break up together, and
the node's own Redis round trips time out behind the loaded loop. So the one
admission path (``gateway/admission.py``) asks this guard first and refuses the
call before anything is dialled when:

- ``RUTSTER_MAX_CALLS`` is set and the live calls plus the admissions still waiting
  for their media stream reach it (reason ``node_full``); or
- the event loop is measured near saturation (reason ``node_overloaded``): the share
  of wall time its thread spent on the CPU over the last few seconds is at or above
  :data:`LOOP_BUSY_LIMIT`, or its wake-ups run :data:`LOOP_LAG_LIMIT_S` late; or
  the calls it would hold after this one, at the CPU each live call costs now,
  would take it past :data:`LOOP_BUSY_LIMIT`.

The measured rules only apply once :data:`MIN_CALLS_MEASURED` calls are live: with
fewer, a busy loop is not the calls' doing (a start-up, a test harness sharing the
loop), and refusing would not relieve it.

This module does no I/O and reads no clock: the app's loop watcher
(``gateway/loop_watch.py``) feeds it samples, time given as an argument.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

#: Refusal reason when the fixed cap ``RUTSTER_MAX_CALLS`` is reached.
REASON_NODE_FULL = "node_full"
#: Refusal reason when the event loop is measured too busy for one more call.
REASON_NODE_OVERLOADED = "node_overloaded"

#: How often the loop watcher samples (seconds). Seed decision: fine enough to see a
#: burst of webhooks within a fraction of a second, cheap (ten wake-ups a second).
SAMPLE_INTERVAL_S = 0.1
#: The window the measured rules look back over (seconds). Seed decision: long
#: enough that one slow frame or one garbage collection is not "overloaded", short
#: enough to react within a burst of arrivals.
WINDOW_S = 2.0
#: The loop thread's CPU share (of wall time) at which no call is admitted, and the
#: share the per-call projection must stay under. Measured on the 2-core dev VM
#: (``bench/cluster_calls.py``, issue 17): one node carried every call at 85 % of its
#: core and none cleanly at 100 %; 80 % keeps room for calls admitted in a burst
#: before their cost shows.
LOOP_BUSY_LIMIT = 0.80
#: The loop's wake-up lateness (the window's 90th percentile, seconds) at which no
#: call is admitted. Seed decision from the pacing contract: the pacer keeps at most
#: 60 ms of audio queued at the provider (``media/pacer.py`` ``DEFAULT_LEAD_MS``), so a
#: loop that wakes 30 ms late on one sample in ten has spent half of that margin.
LOOP_LAG_LIMIT_S = 0.030
#: Live calls below which the measured rules do not refuse (see the module's text).
#: Measured: an echo call costs 3-4.6 % of the dev VM's core (``bench/vs_pipecat.py``,
#: issue 18), so ten calls are a third of a core at most; a loop saturated with fewer
#: is saturated by something else, which refusing calls would not relieve.
MIN_CALLS_MEASURED = 10
#: Samples the window must hold before the measured rules apply (a second's worth).
MIN_SAMPLES = 10


@dataclass(frozen=True, slots=True)
class LoopSample:
    """One watcher wake-up: when, the loop thread's CPU time so far, how late it woke,
    and the live calls then."""

    at: float
    cpu_s: float
    lag_s: float
    calls: int


@dataclass(frozen=True, slots=True)
class LoadReading:
    """What the window says (None where it does not hold enough samples yet)."""

    busy: float | None
    lag_p90_s: float | None
    #: The calls the loop could hold at LOOP_BUSY_LIMIT at today's cost per call.
    capacity: int | None


class OverloadGuard:
    """Decides, from samples of the event loop, whether one more call fits (sans-I/O)."""

    def __init__(
        self,
        max_calls: int | None = None,
        *,
        measured: bool = True,
        busy_limit: float = LOOP_BUSY_LIMIT,
        lag_limit_s: float = LOOP_LAG_LIMIT_S,
        window_s: float = WINDOW_S,
        min_calls: int = MIN_CALLS_MEASURED,
    ) -> None:
        if max_calls is not None and max_calls < 1:
            raise ValueError("max_calls must be at least 1 (None: no fixed cap)")
        self.max_calls = max_calls
        #: False: only the fixed cap refuses (``RUTSTER_OVERLOAD_GUARD=off``).
        self.measured = measured
        self.busy_limit = busy_limit
        self.lag_limit_s = lag_limit_s
        self.window_s = window_s
        self.min_calls = min_calls
        self._samples: deque[LoopSample] = deque()

    def on_sample(self, sample: LoopSample) -> None:
        """Take one watcher sample; samples older than the window are forgotten."""
        samples = self._samples
        if samples and (sample.at < samples[-1].at or sample.cpu_s < samples[-1].cpu_s):
            samples.clear()  # a clock that went back is not a measurement
        samples.append(sample)
        # Keep one sample at or before the window's start: the CPU share is a difference.
        while len(samples) > 2 and samples[1].at <= sample.at - self.window_s:
            samples.popleft()

    def reading(self) -> LoadReading:
        """The window's loop CPU share, wake-up lateness P90 and capacity estimate."""
        samples = self._samples
        if len(samples) < MIN_SAMPLES:
            return LoadReading(None, None, None)
        first, last = samples[0], samples[-1]
        wall = last.at - first.at
        busy = (last.cpu_s - first.cpu_s) / wall if wall > 0 else 0.0
        lags = sorted(s.lag_s for s in list(samples)[1:])
        lag_p90 = lags[min(len(lags) - 1, int(0.9 * len(lags)))]
        calls = sum(s.calls for s in samples) / len(samples)
        capacity = None
        if calls >= self.min_calls and busy > 0:
            capacity = int(self.busy_limit * calls / busy + 1e-9)  # float dust: 39.999… is 40
        return LoadReading(busy, lag_p90, capacity)

    def refusal(self, live_calls: int, pending: int) -> str | None:
        """None when one more call may be admitted, else the refusal reason.

        ``pending``: calls admitted here whose media stream has not arrived yet (they
        will cost as much as a live call once it does).
        """
        held = live_calls + pending
        if self.max_calls is not None and held >= self.max_calls:
            return REASON_NODE_FULL
        if not self.measured or live_calls < self.min_calls:
            return None
        reading = self.reading()
        if reading.busy is None or reading.lag_p90_s is None:
            return None
        if reading.busy >= self.busy_limit or reading.lag_p90_s >= self.lag_limit_s:
            return REASON_NODE_OVERLOADED
        if reading.capacity is not None and held + 1 > reading.capacity:
            return REASON_NODE_OVERLOADED
        return None


#: Node refusals (full, overloaded, draining) written to the dashboard's recent-refusals
#: stream (and, full or overloaded, logged) per second at most; the rest are only counted
#: (``rutster_admissions_total``).
#: Seed decision: the dashboard lists the last few, and a node refusing a flood must not
#: add a Redis write per refused call to the loop it is protecting.
NOTED_REFUSALS_PER_S = 5


class RefusalNotes:
    """How many of a second's node refusals are written down (sans-I/O, time given)."""

    def __init__(self, per_second: int = NOTED_REFUSALS_PER_S) -> None:
        self.per_second = per_second
        self._second = -1
        self._noted = 0

    def take(self, now_s: float) -> bool:
        """True when the refusal at ``now_s`` may be written down."""
        second = int(now_s)
        if second != self._second:
            self._second, self._noted = second, 0
        if self._noted >= self.per_second:
            return False
        self._noted += 1
        return True
