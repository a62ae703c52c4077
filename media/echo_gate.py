"""Echo gate: does a caller frame hold sound beyond the echo of what we played?

On a phone call the caller's line often carries the assistant's own voice
back (speakerphones, poor 2-to-4-wire hybrids), delayed by the network round
trip and our send-ahead, and attenuated by the echo return loss (ERL). The
reflex loop must never take that echo for the caller barging in, yet must
still hear a caller who talks over the assistant (double talk).
:class:`EchoGate` answers that per 20 ms frame, from frame energies:

1. :meth:`EchoGate.render` records the level (dBFS) of every frame the core
   sent, on a 20 ms slot timeline taken from its send time. Slots nothing was
   sent for count as silence, and so do the frames :meth:`EchoGate.unplayed`
   says the provider dropped unplayed (a barge-in's ``clear``).
2. Every ``delay_update_ms`` the gate cross-correlates (Pearson) the
   log-energy envelope of the last ``correlation_window_ms`` of capture with
   the render envelope at every lag from ``min_delay_ms`` to ``max_delay_ms``,
   in one vectorised pass. The best lag becomes the delay estimate once it
   correlates well over the window *and* over the frames where the render at
   that lag was loud enough to be heard as echo (turn-taking alone, a caller
   starting a few hundred ms into every answer that then stops, correlates
   the two envelopes' on/off structure at the caller's reaction time with no
   echo at all), and replaces an earlier one only when it correlates clearly
   better (hysteresis), so double talk, which blurs the correlation, does
   not move it. The delay moves at most once per update; a jump of more
   than ``delay_spread_ms`` is a new echo path and drops all ERL learned.
3. The echo expected in a capture frame, once a delay is known, is the
   loudest render frame within ``delay_spread_ms`` of that delay (a delay
   between frame boundaries, the echo path's smearing) minus the ERL.
   Without a delay the echo may be at any lag, and each lag has its own
   proven ERL (item 4): the echo expected is the loudest (render at a lag
   minus that lag's ERL), so a lag whose render was loud while the line
   stayed quiet carries no echo however loud its render is.
4. The ERL starts at ``min_erl_db``, the worst a line is assumed to have,
   and is learned only from what cannot be the caller:

   - *Without a delay: proven bounds, per lag.* The echo in a frame is
     never louder than the frame (energies add), so were the echo at lag d,
     the ERL is at least (render at d - capture) for every frame heard,
     whoever talked: double talk only weakens the bound. Every frame raises
     each lag's bound (the quietest render within ``delay_spread_ms`` of the
     lag, less ``proof_wobble_db``), and each lag's ERL in use follows its
     bound up by at most ``max_proof_rise_db_per_s``. A clean line proves a
     lag clean one frame after that lag's render was loud and the line
     quiet (the old rule took the weakest bound of all lags for every lag,
     so a caller who spoke 300 ms into the call's first answer waited until
     lags the answer had not reached yet were proven).
   - *Coherence, for what energy cannot clear.* A frame the energies call
     echo, without a delay, at least ``COHERENCE_FLOOR_DBFS`` and
     ``COHERENCE_NOISE_MARGIN_DB`` over the line's noise floor, is compared
     as a waveform (8 kHz, pre-emphasised) with everything played over the
     lag range: a best normalised cross-correlation under
     ``echo_coherence`` means it is no copy of anything played, so it is the
     caller. That is the caller who starts d ms into the call's first answer,
     whom energy alone cannot tell from the answer's own echo d ms late.
     Measured on tests/test_media_echo_gate.py's echo paths (6-20 dB ERL),
     echo alone at -45 dBFS or louder correlates 0.95 at the median and never
     under 0.40; it costs one 4096-point FFT correlation, and only runs on
     such frames.
   - *With a delay: echo-alone evidence.* Finding a delay (the echo proven,
     item 2) resets the ERL to ``min_erl_db``; (render peak - capture) of
     frames judged echo only is kept as evidence only while the capture
     envelope of the last ``echo_check_ms`` follows the render envelope at
     the delay closely (which double talk breaks), the history the delay was
     found in too when it passes that test; the ERL is a low percentile of
     it, never more than ``erl_spread_db`` under its median. Echo alone that
     sits ``erl_shift_db`` under the evidence (the path turning louder, a
     caller switching to speakerphone) replaces the evidence at once.

   The ERL rises at most ``max_erl_rise_db_per_s``; falls are not limited
   (they only hide more). Render the provider dropped unplayed
   (:meth:`EchoGate.unplayed`, after a ``clear``) counts as silence, so it
   proves nothing.
5. A frame is *near end* when its level is at least
   ``max(near_end_floor_dbfs, predicted echo + margin_db)``. When nothing
   audible was rendered over the search range that is the floor alone: every
   frame above it is eligible, and the VAD decides whether it is speech.
   The first ``COPY_CHECK_FRAMES`` frames of every run so judged are then
   compared as waveforms with the render (as the coherence test above): a
   copy of what was played (``echo_copy`` or more) is echo the ERL in use did
   not predict (the path turned louder or moved mid-call) and is not near end.
   With a delay known and nothing played around it, such frames are checked
   too when something was played elsewhere in the lag range: a copy at another
   lag is a path that moved (shorter, or the delay was wrong), and the delay
   goes (:meth:`EchoGate._moved_echo`). With a delay known, a run that goes on is
   checked again every ``MOVED_RECHECK_FRAMES`` frames for such a copy at another
   lag: a path that moved while noise on the caller's side held the run open.

6. The line echo canceller (:mod:`media.line_echo`, ``line_canceller``, on
   by default) subtracts its linear prediction of the echo, sample by sample
   at 8 kHz. It is aligned to the sample around the gate's delay when there
   is one, else (a call whose replies keep being cut gives the envelope
   correlation too little echo alone) by waveform correlation over the whole
   lag range, every ``delay_update_ms`` while render is audible and it does
   not yet cancel well. Once it cancels at least its ``min_erle_db``, a frame
   the energies call echo is near end when what the canceller leaves stands
   ``LINE_CANCELLER_MARGIN_DB`` above the echo it should leave (its estimate
   less its measured ERLE) and ``RESIDUAL_NOISE_MARGIN_DB`` above the quietest
   it left of late (the line's noise, with the echo it could not take off),
   and is no copy of the render (``RESIDUAL_COPY``).
   That hears a caller under a 6-10 dB echo, which energy cannot. The VAD hears
   that residual, unless it is ``STALE_RESIDUAL_DB`` louder than the frame
   itself: the canceller adding its prediction of an echo that has gone (the
   path moved or turned quieter), the assistant's own voice. When the
   echo path moves, the residual holds the new echo and the old prediction
   taken off it, a copy of neither: the frame as heard is then checked too,
   and a copy of it (``echo_copy``) at a lag away from the known delay is the
   moved echo (``bench/echo_alone.py``'s moved lines). Where the frame as heard
   copies the render at the delay, a residual that a few taps of that render
   explain (``RESIDUAL_FOLLOWS_SHARE``) is the canceller's own error, a slip at
   a loud onset, not the caller.

7. What the VAD hears of a frame judged echo alone is silence, on a line that
   has shown echo: a delay found, or the line canceller's whole-range
   alignment peaking twice at one lag (``ECHO_HINT_CORRELATION``, far under
   what aligns it: echo under the line's noise, which no delay is found for).
   On a line that has not, after ``ECHO_SEARCHES_BEFORE_VAD_HEARS`` searches,
   a frame judged echo within ``VAD_HEARS_NEAR_NOISE_DB`` of the noise floor
   is heard as it is: it is under a per-lag bound that the noise kept the gate
   from proving, and it is the caller's quieter syllables or the noise. Silence
   in their place chopped a quiet caller's words on a noisy line, and Silero
   scored them as no speech.

Optionally (``EchoGateConfig(canceller=True)``, needs the ``pywebrtc-audio``
wheel) WebRTC's AEC3 echo canceller runs first, fed each capture frame with
the render frame sent in the same slot: delay and correlation are still
taken on the raw capture, but the level judged (and the ERL learned, then the
loss of echo left after the canceller) is that of the canceller's output,
which :attr:`EchoVerdict.cancelled` carries. It hears double talk far better
at low ERL, at ~15x the cost (``bench/echo_gate.py``).

Time comes in as milliseconds from any monotonic origin shared by both
directions; nothing here does I/O or reads a clock. Frames are narrowband
(160 samples of s16le mono at 8 kHz, :mod:`media.narrowband`): the caller's
audio as it came off the wire and the assistant's as it went onto it, before
and after the resamplers, which would otherwise add 55 ms to every judgement.

Measured (``bench/echo_gate.py``: speech and mock voice through the real
μ-law path, 80-400 ms round trip, 6-30 dB ERL, +-2 dB level wobble; Python
3.11, numpy 2.4; the old fixture and the mock voice, in-sample material):
echo alone was called near end on no frame, in the first 500 ms of echo or
after; a caller talking over the echo at natural level was heard on 89-100 %
of speech frames at 20-30 dB ERL and on 56-68 % at 6-10 dB (before the line
canceller and the per-lag bounds: 24-50 %), three near-end frames in a row
60-120 ms after onset; 65-100 µs per frame pair on an AMD EPYC VM (render +
capture, the line canceller included; ~10 µs before it). With AEC3 in front
(at 8 kHz): 46-100 %, ~210-250 µs. A sudden echo path change (8 dB louder,
or a new delay) gave false runs of 2-8 frames while the gate caught up. On
the reflex rig's clean line (tests/test_reflex.py), twelve interruptions in a
row at -35 to -12 dBFS each paused within 60 ms of reaching the core, the
first included.

Limits, by design: energy cannot separate a caller who is no louder than the
echo from that echo once a delay is known (the canceller can, partly); at
6-10 dB ERL a stretch of double talk can pass the echo-alone test and lower
the ERL (the safe direction). The coherence test needs the render's waveform
to match the echo's within the 8 kHz band: a strongly dispersive or
non-linear echo path correlates less and is then taken for the caller until
the delay is found. Render sent more than ``render_ahead_ms`` ahead of the
capture timeline is not modelled (the pacer sends ~60 ms ahead).
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import Protocol, cast

import numpy as np
import numpy.typing as npt

from rutster.media import echo_kernels
from rutster.media.endpointing import (
    DIGITAL_SILENCE_DBFS,
    frame_level_dbfs,
    samples_level_dbfs,
)
from rutster.media.formats import (
    FRAME_MS,
    NARROWBAND_FRAME_BYTES,
    NARROWBAND_FRAME_SAMPLES,
    NARROWBAND_SAMPLE_RATE,
    ms_to_frames,
)
from rutster.media.line_echo import WAVE_FRAME, LineEchoCanceller, normalised_xcorr_peak

__all__ = [
    "CANCELLER",
    "CAPTURE_RESYNC_MS",
    "COHERENCE_FLOOR_DBFS",
    "COHERENCE_NOISE_MARGIN_DB",
    "COHERENCE_NOISE_WINDOW_MS",
    "COPY_CHECK_FRAMES",
    "CORRELATION_WINDOW_MS",
    "DELAY_HYSTERESIS",
    "DELAY_SPREAD_MS",
    "DELAY_UPDATE_MS",
    "ECHO_CHECK_MS",
    "ECHO_COHERENCE",
    "ECHO_COPY",
    "ECHO_HINT_CORRELATION",
    "ECHO_HINT_LAG_SAMPLES",
    "ECHO_ONLY_CORRELATION",
    "ECHO_SEARCHES_BEFORE_VAD_HEARS",
    "ERL_PERCENTILE",
    "ERL_SHIFT_DB",
    "ERL_SPREAD_DB",
    "ERL_WINDOW_MS",
    "LINE_CANCELLER",
    "LINE_CANCELLER_MARGIN_DB",
    "LINE_CANCELLER_SKIP_ERL_DB",
    "MARGIN_DB",
    "MAX_DELAY_MS",
    "MAX_ERL_DB",
    "MAX_ERL_RISE_DB_PER_S",
    "MAX_PROOF_RISE_DB_PER_S",
    "MIN_CORRELATION",
    "MIN_CORRELATION_WINDOW_MS",
    "MIN_DELAY_MS",
    "MIN_ERL_DB",
    "MIN_ERL_EVIDENCE_MS",
    "MOVED_RECHECK_FRAMES",
    "NEAR_END_FLOOR_DBFS",
    "PROOF_WOBBLE_DB",
    "RENDER_AHEAD_MS",
    "RESIDUAL_COPY",
    "RESIDUAL_NOISE_MARGIN_DB",
    "STALE_RESIDUAL_DB",
    "VAD_HEARS_NEAR_NOISE_DB",
    "EchoCancellerUnavailableError",
    "EchoGate",
    "EchoGateConfig",
    "EchoGateInputError",
    "EchoVerdict",
]

#: Longest echo delay searched (brief): 100-400 ms network round trip plus the
#: ~60 ms the pacer sends ahead is 460 ms; 600 ms leaves room for a provider's
#: or a SIP leg's own jitter buffer. (Both directions are judged on the wire
#: side of our resamplers, media.narrowband, so they add nothing.)
MAX_DELAY_MS = 600.0
#: Shortest echo delay searched: a frame sent now plays once the provider has
#: played what it holds before it (the pacer keeps 40-60 ms there,
#: media.pacer), and its echo comes back over the network after that, so
#: nothing under 40 ms is echo; not searching those lags also lets a render
#: frame sent "now" land in its own slot.
MIN_DELAY_MS = 40.0
#: Half-width of the window the echo is taken from around the delay
#: (measured, bench/echo_gate.py): one frame either side covers a delay
#: between frame boundaries and the echo path's tail; two frames lost 5-9
#: points of double talk and gained nothing on echo alone.
DELAY_SPREAD_MS = 20.0
#: Capture history the delay is estimated over (seed decision): 3 s spans a
#: dozen syllables, enough to tell the true lag from one a syllable away.
CORRELATION_WINDOW_MS = 3000.0
#: Capture history needed for a first delay estimate (brief: converge within
#: ~500 ms of render activity).
MIN_CORRELATION_WINDOW_MS = 500.0
#: How often the delay and ERL are re-estimated (measured): every 10 frames
#: keeps it to ~3 µs per frame on average; every 5 bought nothing.
DELAY_UPDATE_MS = 200.0
#: Correlation the best lag needs to be believed (measured, bench/echo_gate.py:
#: the right lag correlates 0.82-0.96 on echo alone, the best wrong lag
#: reached 0.68 in double talk).
MIN_CORRELATION = 0.75
#: How much better than the current lag a new lag must correlate to replace
#: it (seed decision).
DELAY_HYSTERESIS = 0.1
#: ERL assumed until one is learned: ITU-T G.168 designs for hybrids with at
#: least 6 dB of echo return loss.
MIN_ERL_DB = 6.0
#: Highest ERL the gate will learn (seed decision): the echo of speech-level
#: render (-10 to -30 dBFS) 40 dB down is under NEAR_END_FLOOR_DBFS anyway.
MAX_ERL_DB = 40.0
#: Recent echo-only frames the ERL is learned from (measured,
#: bench/echo_gate.py: 6 s cut false near-end frames by 4x against 3 s, with
#: the same double-talk detection).
ERL_WINDOW_MS = 6000.0
#: Echo-only evidence needed before the learned ERL replaces MIN_ERL_DB
#: (brief: converge within ~500 ms of render activity).
MIN_ERL_EVIDENCE_MS = 500.0
#: Percentile of the (render - capture) evidence taken as the ERL (measured,
#: bench/echo_gate.py): the 2nd lost 4-8 points of double talk at 6-10 dB ERL
#: for no fewer false frames, the 10th doubled the false frames.
ERL_PERCENTILE = 5.0
#: Furthest the ERL may sit below the median of its evidence (measured,
#: bench/echo_gate.py: on echo alone the median is 4.5-5.5 dB above the 5th
#: percentile and 6-8.5 dB above the minimum), so double talk that slipped
#: into the evidence costs at most ~3 dB of sensitivity.
ERL_SPREAD_DB = 8.0
#: How far under the median of the ERL evidence the echo-alone frames of one
#: update must sit for the echo to be taken as louder (seed decision, checked
#: on bench/echo_gate.py splices): a step of more than the margin makes most
#: echo frames near end, so they would never become evidence; 6 dB is above
#: the 2-3 dB an update's median wobbles by.
ERL_SHIFT_DB = 6.0
#: Span over which the capture envelope must follow the render envelope at the
#: delay for its frames to count as ERL evidence (measured,
#: bench/echo_gate.py): 500 ms, two or three syllables.
ECHO_CHECK_MS = 500.0
#: Correlation over ECHO_CHECK_MS that means echo alone (measured,
#: bench/echo_gate.py: echo alone gives a median 0.95 and a 10th percentile
#: 0.88-0.92; 0.9 against 0.8 cut false frames by 30 % and raised double-talk
#: detection at 6-10 dB ERL by 4-9 points).
ECHO_ONLY_CORRELATION = 0.9
#: How far above the predicted echo a frame must be to be near end (measured,
#: bench/echo_gate.py): 3 dB doubled the false frames, 5 dB lost 4-8 points of
#: double talk.
MARGIN_DB = 4.0
#: Quietest frame that can be near end (seed decision): 5 dB under the
#: endpointer's speech floor (media.endpointing.ABS_FLOOR_DBFS, -45 dBFS), so
#: the gate never hides what the VAD would call speech, and far above
#: idle-channel noise.
NEAR_END_FLOOR_DBFS = -50.0
#: How far ahead of the capture timeline render may be sent and still be kept
#: (seed decision; the pacer sends ~60 ms ahead).
RENDER_AHEAD_MS = 5000.0
#: How much later than its place in the caller's stream a frame may arrive
#: before the gap is taken for missing audio (seed decision): Twilio's media
#: stream is contiguous audio over TCP, so late frames are network stalls to
#: ride out, not loss; a second of nothing on the socket is something else.
CAPTURE_RESYNC_MS = 1000.0
#: Whether WebRTC AEC3 runs before the gate (measured, bench/echo_gate.py):
#: opt-in, since it costs ~160 µs per frame, ~15x the gate alone.
CANCELLER = False

#: Fastest the ERL in use may rise, dB per second (chosen on the reflex rig's
#: clean-line call in tests/test_reflex.py, in-sample: at 60 dB/s a caller
#: 900 ms into the first answer waited 240 ms; checked on bench/echo_gate.py,
#: unchanged): one 200 ms update raises it by at most 24 dB, a clean line's
#: 6 -> 37 dB takes ~0.3 s once proven. Falls are not limited: a lower ERL
#: only hides more, the safe direction.
MAX_ERL_RISE_DB_PER_S = 120.0

#: Fastest a lag's proven ERL in use may rise while no delay is known, dB per
#: second: 12 dB a frame, so a lag proven clean reaches MAX_ERL_DB within three
#: frames. A proof is a bound, not an estimate learned from what may be the
#: caller, so it is allowed to move faster than MAX_ERL_RISE_DB_PER_S; bounded
#: all the same, so one frame cannot open a lag at once (seed decision, kept
#: on the tune split of bench/reflex.py).
MAX_PROOF_RISE_DB_PER_S = 600.0

#: Normalised cross-correlation (pre-emphasised 8 kHz waveforms, best offset
#: over the whole lag range) below which a frame the energies cannot clear is
#: taken for the caller: it is no copy of anything played. Chosen on the tune
#: split (bench/reflex.py, and the tune recordings of scripted calls): 0.3 to
#: 0.6 all cleared the first answer's interruptions on clean lines; 0.35 keeps
#: a margin under echo alone (never below 0.40 at -45 dBFS and louder,
#: tests/test_media_echo_gate.py's paths).
ECHO_COHERENCE = 0.35
#: Normalised cross-correlation (as for ECHO_COHERENCE) at or above which a frame
#: the energies call near end is taken for echo all the same: a copy of what was
#: played, louder than the ERL in use predicted (the echo path turned louder or
#: moved mid-call). Checked on the first frames of each near-end run only, until
#: one is not a copy. Chosen on the tune split: 0.7 and 0.8 both took the
#: echo-alone pauses of the 30 -> 10 dB mid-call line from 1.5 a minute to 0;
#: on tests/test_media_echo_gate.py's dispersive path a louder echo correlated
#: 0.76-0.84 at times, so 0.7. A copy found at a lag away from the known delay
#: also drops that delay (the path moved): on the tune split, under the speech
#: rule, the mid-call line's echo-alone pauses went from 0.75 a minute to 0.
ECHO_COPY = 0.7
#: Whether the line echo canceller (media.line_echo) runs once a delay is known,
#: to hear a caller under an echo energy cannot clear (measured on the tune split's
#: recorded calls, 6-20 dB lines, flat and dispersive paths: interruption P95 from
#: 260 to 40-60 ms, misses on the 6-10 dB lines from 11 to 0; bench/reflex.py tune:
#: pause P95 330 -> 300 ms, 10 dB line 460 -> 310 ms). It is skipped when AEC3
#: runs (``canceller``), which already takes the echo out of what is judged.
LINE_CANCELLER = True
#: Proven ERL at every lag (no delay known) above which the line canceller is not
#: aligned over the whole lag range: echo 30 dB under speech-level render (-10 to
#: -30 dBFS) is at or under the near-end floor's reach, so energy already hears a
#: caller past it, and the alignment (one FFT correlation of ~1 s, ~170 µs every
#: DELAY_UPDATE_MS) would search a clean line for ever. Seed decision; the tune
#: split's figures were the same with and without it.
LINE_CANCELLER_SKIP_ERL_DB = 30.0
#: Whole-range alignments that may fail in a row, one every DELAY_UPDATE_MS, before
#: they are spaced out: the first second of an answer's echo is searched as
#: closely as ever (seed decision: with no such allowance the tune split's echo
#: lines heard some first answers' callers later, the 6 dB line's pause P95 250 ->
#: 270 ms).
LINE_CANCELLER_SEARCHES_BEFORE_BACKOFF = 5
#: Longest wait between whole-range alignments that keep failing: past
#: LINE_CANCELLER_SEARCHES_BEFORE_BACKOFF, each failure doubles the wait from
#: DELAY_UPDATE_MS up to this. A success, an echo path forgotten, or render silent
#: over the whole lag range (the next answer's echo is a new search) starts again.
#: A line with noise over -60 dBFS keeps its proven ERL under
#: LINE_CANCELLER_SKIP_ERL_DB (render less that noise), so a line with no echo at
#: all was searched every DELAY_UPDATE_MS for as long as the assistant spoke: on a
#: -45 dBFS noise line the gate cost 56-58 µs a frame against 17 at -75 dBFS
#: (measured on the rig, 2026-12-06), and the echo brain's callers, who hear
#: themselves back, pay it on every frame. Seed decision; checked on the tune split.
LINE_CANCELLER_SEARCH_BACKOFF_MS = 1600.0
#: How far the canceller's residual must stand above the echo it should leave
#: (its echo estimate less its ERLE) to be the caller. Chosen on the tune split's
#: recorded calls: 6 / 9 / 12 dB left 15 / 10 / 9 two-frame near-end runs on echo
#: alone at 6 dB ERL (6.5 min), with the same detection.
LINE_CANCELLER_MARGIN_DB = 12.0
#: How far above the line canceller's residual floor (its quietest residual of the last
#: COHERENCE_NOISE_WINDOW_MS; none until it has left one in every frame of that window)
#: its residual must stand to be the caller. What it leaves at that floor is the line's
#: noise and the echo it could not take off, and on a noisy line that already meets
#: LINE_CANCELLER_MARGIN_DB: the VAD then heard the residual of the assistant's voice
#: under -45 dBFS of noise, paused the assistant, and resumed (tune split,
#: bench/echo_alone.py: 3 of its 12 pauses, 10 dB of echo under -45 dBFS of noise).
#: 3 dB is an equal-power sum: something as loud as that floor was added to it. Chosen
#: on the tune split: 3, 6 and 9 dB all took those 3 pauses (12 -> 9); bench/reflex.py's
#: standard lines were unchanged by 3 dB (6: one noise-alone pause fewer) and its hard
#: lines' noise alone made 12 cuts against 11 without (6: 13); docs/BENCHMARKS.md, "Echo
#: the line canceller leaves at the line's noise".
RESIDUAL_NOISE_MARGIN_DB = 3.0
#: How much louder than the frame heard the line canceller's residual must be for
#: the VAD to hear the frame instead: the canceller then added a prediction at least
#: as loud as the frame (uncorrelated sounds of equal power add 3 dB), an echo that
#: is no longer there (the path moved or turned quieter under noise), and the VAD
#: called that copy of the assistant speech (bench/moved_under_noise.py). Chosen on
#: the tune split: 0 dB took that benchmark's cuts (babble aside) from 68 to 25 and
#: 3 dB to 26, but 0 dB moved bench/reflex.py's pause P95 on the 6 dB line 250 -> 280
#: ms; 3 dB left its figures the same but one more pause resumed (not talked over) and
#: the changing line's P95 at 140 ms against 130.
#: (Not counting such a residual as near end either, tried with the 0 dB rule: 24 cuts,
#: but one more caller talked over and a pause P95 of 210 ms against 190.)
STALE_RESIDUAL_DB = 3.0
#: ECHO_COPY for what the canceller leaves: echo it did not cancel is a filtered
#: copy of the render and correlates less than the echo itself; the caller hardly
#: at all. Chosen on the same calls: 0.5 took those runs from 9 to 7 (0.35: to 3,
#: but missed two interruptions).
RESIDUAL_COPY = 0.5
#: Taps of the short filter through which a trusted line canceller's residual is
#: fitted to the render, aligned where the frames heard copy it (RESIDUAL_FOLLOWS_SHARE).
#: A canceller that slips at a loud onset leaves its own error, (path - estimate) * render:
#: the render through a short filter, weighted to the low band that pre-emphasis takes
#: out of the RESIDUAL_COPY test (which scored such slips 0.32-0.44). A caller under the
#: echo leaves their own voice, which no short filter of the render explains. Chosen on
#: the tune split with RESIDUAL_FOLLOWS_SHARE, over every frame whose residual scored
#: under RESIDUAL_COPY (tune calls of interruptions on the echo lines of bench/reflex.py,
#: standard and hard, and Festival's voices on bench/echo_alone.py's lines; a scratch
#: trace, docs/BENCHMARKS.md "Echo alone over many lines"): 4 taps at 0.7 explained 6 of
#: 1,218 frames with no caller (the second frame of each of the Finnish voice's two
#: slips among them: a run of one frame does not pause) and none of 1,537 frames with a
#: caller talking (at most 0.65); 8 taps at 0.8 explained 6 and 3, 16 at 0.8 12 and 5.
RESIDUAL_FOLLOWS_TAPS = 4
#: Share of the residual's energy that fit must explain for the residual to be the
#: canceller's own error, not the caller (chosen with RESIDUAL_FOLLOWS_TAPS; 0.6 also
#: explained 2 caller frames).
RESIDUAL_FOLLOWS_SHARE = 0.7
#: Frames of a near-end run checked for being a copy of the render before the
#: rest of the run is trusted: the reflex loop's pause needs two (40 ms), and at
#: the very frame an echo path changes, the two frames compared straddle both
#: paths and correlate with neither.
COPY_CHECK_FRAMES = 2
#: With a delay known, a near-end run past its first COPY_CHECK_FRAMES is checked
#: again every this many frames (100 ms) for a copy of the render, as heard, at a lag
#: away from that delay: the path moved while something on the caller's side (a
#: passing bus, a door) held the run open, so the checks at the run's start never saw
#: it, and the VAD heard the assistant's own voice under the noise, paused and cut
#: (tune split, a first grid of four moves x 3 voices x 7 noises x 3 offsets x 2
#: levels: 106 of 504 runs cut). Chosen on that grid: every 5 frames 14 cut, every 3
#: frames 11, bench/reflex.py's tune figures the same for both; 5 is fewer coherence
#: tests in double talk (bench/moved_under_noise.py's tune split: 234 -> 156 cuts of
#: 768 runs, 90 and 88 of them babble, which is talk). A copy at the known
#: delay is not acted on here: a caller talking over a 6-10 dB echo correlates with
#: the render there too.
MOVED_RECHECK_FRAMES = 5
#: Quietest frame the coherence test may clear (the reflex loop's barge-in
#: floor, gateway.reflex PAUSE_FLOOR_DBFS): under it, line noise and the
#: mu-law steps blur even a pure echo's waveform (measured on
#: tests/test_media_echo_gate.py's lines: echo alone at -50..-45 dBFS fell to
#: 0.18, at -45 dBFS and louder never under 0.6).
COHERENCE_FLOOR_DBFS = -45.0
#: How far above the line's own noise floor (the quietest frame of the last
#: COHERENCE_NOISE_WINDOW_MS) that frame must be: line noise is no copy of the
#: render either, and must stay the VAD's to judge, not pause the assistant
#: (seed decision: 6 dB, twice the frame-to-frame wobble of steady noise;
#: checked on the tune split's -45 dBFS noise line).
COHERENCE_NOISE_MARGIN_DB = 6.0
#: Window of that noise floor: the endpointer's minimum-statistics window
#: (media.endpointing NOISE_WINDOW_MS).
COHERENCE_NOISE_WINDOW_MS = 1500.0
#: A whole-range alignment's best correlation (media.line_echo, 500 ms of capture over
#: every lag) that counts as a hint of echo when it fails ALIGN_MIN_CORRELATION: echo
#: under the line's noise, which no delay is found for. Measured on the tune split
#: (scratch: every tune voice for 30 s over seven noisy lines, a caller twice): on
#: lines with no echo under -45 and -50 dBFS of noise, searches peaked at 0.03-0.07
#: (one at 0.17 in 98); with 30 dB of echo under that noise, at 0.12-0.49 a call, at
#: the echo's lag. Noise peaks at a random lag of thousands, so two at one lag
#: (ECHO_HINT_LAG_SAMPLES) are echo. A caller talking over the assistant peaks higher:
#: on bench/reflex.py's tune calls of interruptions over the lines with no echo, at
#: 0.10-0.21 every few searches, and two calls of seven on the -45 dBFS noise line
#: counted echo as heard at 0.1 (two searches 200 ms apart read 300 ms of the same
#: capture, so one chance peak was found twice; another pair 1 s apart matched to 3
#: samples). Chosen on the tune split: at 0.15 no such call hears echo, every call of
#: interruptions over the hard lines' echo under noise still does, and echo alone
#: heard echo on 28 of 32 noisy-line runs against 30 (0.12: the same no-echo calls
#: clear); bench/echo_alone.py's pauses 9 -> 7 (0.12: 9, 0.2: 10), bench/reflex.py's
#: -45 dBFS line's pause P95 190 -> 180 ms, its other figures the same
#: (docs/BENCHMARKS.md, "Chance peaks counted as echo").
ECHO_HINT_CORRELATION = 0.15
#: How near (8 kHz samples, 1 ms) two hints' delays must be to be one echo path: the
#: line canceller aligns to the sample, and a path's delay does not move between
#: two searches.
ECHO_HINT_LAG_SAMPLES = 8
#: A frame judged the assistant's echo within this much (dB) of the line's noise floor,
#: on a line where no echo has been heard (no delay found, no ECHO_HINT_CORRELATION hint
#: repeated), is heard by the VAD as it is, not as silence: it is under a bound the gate
#: could not prove, too near the noise for the copy test (COHERENCE_NOISE_MARGIN_DB),
#: and on such a line it is the caller's quieter syllables or the noise. Silence in
#: their place chops a caller's words, and Silero scores chopped speech as none (tune
#: split: a -31 dBFS caller on the -45 dBFS noise line scored 0.01-0.15, talked over).
VAD_HEARS_NEAR_NOISE_DB = COHERENCE_NOISE_MARGIN_DB
#: Whole-range alignments that must have found no echo before VAD_HEARS_NEAR_NOISE_DB
#: applies: the first second of a call's echo searched closely
#: (LINE_CANCELLER_SEARCHES_BEFORE_BACKOFF), so that echo under the noise is heard
#: before the VAD is given any of it (tune split: with none, an assistant's first
#: words over a 20 dB echo under -45 dBFS of noise paused it once).
ECHO_SEARCHES_BEFORE_VAD_HEARS = 5

#: Allowance taken off every proven ERL bound (measured, tests and
#: bench/echo_gate.py): envelopes of echo alone wobble around render - ERL
#: (the path's smearing, mu-law, +-2 dB of level wobble), so the highest
#: (render - capture) of a window sat up to ~2.2 dB above the true ERL.
PROOF_WOBBLE_DB = 3.0

#: Envelope floor (seed decision): below it levels are quantisation and line
#: noise; clamping keeps digital silence (-100 dBFS) from dominating the
#: correlation. Render at or below it cannot produce audible echo.
_ENVELOPE_FLOOR_DBFS = -70.0
#: Smallest envelope variance (dB^2 per frame) a window needs to be correlated:
#: a flat envelope (steady tone, constant silence) has no delay to find.
_MIN_ENVELOPE_VARIANCE = 1.0
#: Lowest ERL the gate will learn: echo louder than what was played is level
#: wobble or double talk, not a path with gain.
_ERL_FLOOR_DB = 0.0
#: Bytes per envelope value (float64), for the strided lag matrix.
_ITEM = np.dtype(np.float64).itemsize
#: Module and class of the optional echo canceller (the pywebrtc-audio wheel).
_CANCELLER_MODULE = "pywebrtc_audio"
_CANCELLER_CLASS = "AudioProcessor"
_SILENT_SAMPLES: npt.NDArray[np.int16] = np.zeros(NARROWBAND_FRAME_SAMPLES, dtype=np.int16)


class EchoGateInputError(ValueError):
    """A frame or time the gate cannot take; ``reason`` is a short stable label.

    Reasons: ``bad_frame_length`` (not exactly one narrowband frame),
    ``bad_time`` (not a finite number of ms).
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class EchoCancellerUnavailableError(ImportError):
    """``canceller=True`` but the ``pywebrtc-audio`` package is not installed."""

    reason = "echo_canceller_unavailable"


class _Canceller(Protocol):
    """The part of ``pywebrtc_audio.AudioProcessor`` the gate uses."""

    def process(
        self, near: npt.NDArray[np.int16], far: npt.NDArray[np.int16]
    ) -> npt.NDArray[np.int16]: ...

    def reset(self) -> None: ...


def _new_canceller() -> _Canceller:
    """WebRTC AEC3 at the narrowband rate (imported here: an optional dependency)."""
    try:
        module = importlib.import_module(_CANCELLER_MODULE)
    except ImportError as exc:
        raise EchoCancellerUnavailableError(
            "EchoGateConfig(canceller=True) needs the pywebrtc-audio package"
        ) from exc
    factory = getattr(module, _CANCELLER_CLASS)
    return cast(
        _Canceller,
        factory(sample_rate=NARROWBAND_SAMPLE_RATE, echo_cancellation=True, high_pass_filter=True),
    )


def _median(values: list[float]) -> float:
    """Median of a short list (plain Python: np.median costs ~10 µs)."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


@dataclass(frozen=True, slots=True)
class EchoGateConfig:
    """Tuning of an :class:`EchoGate`; durations round up to whole 20 ms frames."""

    max_delay_ms: float = MAX_DELAY_MS
    min_delay_ms: float = MIN_DELAY_MS
    delay_spread_ms: float = DELAY_SPREAD_MS
    correlation_window_ms: float = CORRELATION_WINDOW_MS
    min_correlation_window_ms: float = MIN_CORRELATION_WINDOW_MS
    delay_update_ms: float = DELAY_UPDATE_MS
    min_correlation: float = MIN_CORRELATION
    delay_hysteresis: float = DELAY_HYSTERESIS
    min_erl_db: float = MIN_ERL_DB
    max_erl_db: float = MAX_ERL_DB
    max_erl_rise_db_per_s: float = MAX_ERL_RISE_DB_PER_S
    proof_wobble_db: float = PROOF_WOBBLE_DB
    echo_coherence: float = ECHO_COHERENCE
    echo_copy: float = ECHO_COPY
    line_canceller: bool = LINE_CANCELLER
    max_proof_rise_db_per_s: float = MAX_PROOF_RISE_DB_PER_S
    erl_window_ms: float = ERL_WINDOW_MS
    min_erl_evidence_ms: float = MIN_ERL_EVIDENCE_MS
    erl_percentile: float = ERL_PERCENTILE
    erl_spread_db: float = ERL_SPREAD_DB
    erl_shift_db: float = ERL_SHIFT_DB
    echo_check_ms: float = ECHO_CHECK_MS
    echo_only_correlation: float = ECHO_ONLY_CORRELATION
    margin_db: float = MARGIN_DB
    near_end_floor_dbfs: float = NEAR_END_FLOOR_DBFS
    render_ahead_ms: float = RENDER_AHEAD_MS
    capture_resync_ms: float = CAPTURE_RESYNC_MS
    canceller: bool = CANCELLER

    def __post_init__(self) -> None:
        for name in (
            "max_delay_ms",
            "correlation_window_ms",
            "min_correlation_window_ms",
            "delay_update_ms",
            "erl_window_ms",
            "min_erl_evidence_ms",
            "echo_check_ms",
            "render_ahead_ms",
            "capture_resync_ms",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of ms, got {value!r}")
        for name in (
            "min_delay_ms",
            "delay_spread_ms",
            "delay_hysteresis",
            "min_erl_db",
            "erl_spread_db",
            "erl_shift_db",
            "margin_db",
            "max_erl_rise_db_per_s",
            "max_proof_rise_db_per_s",
            "proof_wobble_db",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if ms_to_frames(self.min_delay_ms) >= ms_to_frames(self.max_delay_ms):
            raise ValueError("min_delay_ms must be at least one frame below max_delay_ms")
        if ms_to_frames(self.min_correlation_window_ms) < 2:
            raise ValueError("min_correlation_window_ms must span at least two frames")
        if ms_to_frames(self.min_correlation_window_ms) > ms_to_frames(self.correlation_window_ms):
            raise ValueError("min_correlation_window_ms must not exceed correlation_window_ms")
        if ms_to_frames(self.min_erl_evidence_ms) > ms_to_frames(self.erl_window_ms):
            raise ValueError("min_erl_evidence_ms must not exceed erl_window_ms")
        if not (math.isfinite(self.max_erl_db) and self.max_erl_db >= self.min_erl_db):
            raise ValueError("max_erl_db must be finite and at least min_erl_db")
        for name in ("min_correlation", "echo_only_correlation", "echo_coherence", "echo_copy"):
            value = getattr(self, name)
            if not -1.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [-1, 1], got {value!r}")
        if not 0.0 <= self.erl_percentile <= 100.0:
            raise ValueError(f"erl_percentile must be in [0, 100], got {self.erl_percentile!r}")
        if not math.isfinite(self.near_end_floor_dbfs):
            raise ValueError("near_end_floor_dbfs must be finite")


@dataclass(frozen=True, slots=True)
class EchoVerdict:
    """What :meth:`EchoGate.capture` says about one caller frame.

    ``near_end`` is True when the frame holds energy that the delayed,
    attenuated render cannot explain: ``capture_dbfs >= max(floor,
    echo_level_dbfs + margin)``. It is not speech detection (the VAD decides
    that). ``echo_level_dbfs`` is the echo predicted in the frame
    (:data:`~media.endpointing.DIGITAL_SILENCE_DBFS` when none can be),
    ``capture_dbfs`` the level judged, ``delay_ms`` the echo delay estimate
    (send time to arrival time; None until found) and ``erl_db`` the echo
    return loss in use. With the canceller on, ``capture_dbfs`` and
    ``erl_db`` are those of its output and ``cancelled`` is that output (the
    frame with the echo taken out); otherwise ``cancelled`` is None.
    ``vad_frame`` is the frame as the VAD should hear it (:meth:`EchoGate._vad_frame`):
    the canceller's output when one is on, silence for a frame judged the
    assistant's echo alone (the frame itself near the noise of a line that has
    shown no echo), the line canceller's residual once it is trusted
    (unless ``STALE_RESIDUAL_DB`` louder than the frame), else the frame itself.
    """

    near_end: bool
    echo_level_dbfs: float
    capture_dbfs: float
    delay_ms: float | None
    erl_db: float
    vad_frame: bytes
    cancelled: bytes | None = None


#: What the VAD hears of a frame judged the assistant's echo alone.
_SILENT_FRAME = bytes(NARROWBAND_FRAME_BYTES)


def _pcm16(band: npt.NDArray[np.float64]) -> bytes:
    """8 kHz samples as a narrowband frame (rounded, saturated s16le)."""
    return np.clip(np.rint(band), -32768, 32767).astype("<i2").tobytes()


def _samples(frame: bytes) -> npt.NDArray[np.float64]:
    """A narrowband frame's samples (PCM16 units)."""
    return np.frombuffer(frame, dtype="<i2").astype(np.float64)


def _check_frame(frame: bytes) -> None:
    if len(frame) != NARROWBAND_FRAME_BYTES:
        raise EchoGateInputError(
            "bad_frame_length",
            f"echo gate frame of {len(frame)} bytes; need exactly {NARROWBAND_FRAME_BYTES} "
            f"({NARROWBAND_FRAME_SAMPLES} samples, {FRAME_MS} ms of 8 kHz PCM16 s16le mono)",
        )


def _slot(ms: float) -> int:
    """The 20 ms slot a time falls in; raises on a non-finite time."""
    if not math.isfinite(ms):
        raise EchoGateInputError("bad_time", f"echo gate time must be finite ms, got {ms!r}")
    return math.floor(ms / FRAME_MS)


class _SlotRing:
    """Per-slot levels of the last ``size`` slots, readable as one contiguous slice.

    Every value is written twice, ``size`` apart, so any run of up to ``size``
    consecutive slots is a plain slice (no wrap-around copy).
    """

    __slots__ = ("_buf", "_size")

    def __init__(self, size: int) -> None:
        self._size = size
        self._buf: npt.NDArray[np.float64] = np.full(2 * size, _ENVELOPE_FLOOR_DBFS)

    def clear(self) -> None:
        self._buf.fill(_ENVELOPE_FLOOR_DBFS)

    def put(self, slot: int, value: float) -> None:
        i = slot % self._size
        buf = self._buf
        buf[i] = value
        buf[i + self._size] = value

    def silence(self, first: int, last: int) -> None:
        """Set slots ``first..last`` (inclusive) to the floor; only the newest ``size`` matter."""
        for slot in range(max(first, last - self._size + 1), last + 1):
            self.put(slot, _ENVELOPE_FLOOR_DBFS)

    def window(self, last: int, count: int) -> npt.NDArray[np.float64]:
        """Levels of slots ``last - count + 1 .. last`` (a view; ``count <= size``)."""
        end = last % self._size + self._size + 1
        return self._buf[end - count : end]


class EchoGate:
    """Per-call echo gate: render frames in, one :class:`EchoVerdict` per capture frame.

    Feed every frame sent to the caller to :meth:`render` and every frame
    heard from the caller to :meth:`capture`, each with its time in ms on one
    shared monotonic clock. Render frames sent in a burst play one after
    another; caller frames are one contiguous stream placed one after another
    however they arrive, until one arrives more than ``capture_resync_ms``
    late. Deterministic: the same calls give the same verdicts.

    Raises :class:`EchoCancellerUnavailableError` when ``config.canceller``
    is set and ``pywebrtc-audio`` is not installed.
    """

    __slots__ = (
        "_canceller",
        "_capture_count",
        "_capture_env",
        "_capture_head",
        "_capture_resync",
        "_capture_wave",
        "_checked_run",
        "_config",
        "_delay",
        "_echo_check",
        "_echo_heard",
        "_echo_hint_lag",
        "_echo_searches",
        "_erl",
        "_erl_count",
        "_erl_index",
        "_erl_median",
        "_erl_quantile",
        "_erl_ratios",
        "_judged_env",
        "_lag_erl",
        "_lag_max",
        "_lag_min",
        "_lags_clean",
        "_lec",
        "_lec_aligned_for",
        "_lec_search_backoff",
        "_lec_search_failures",
        "_lec_search_longest",
        "_lec_search_wait",
        "_margin",
        "_min_erl",
        "_min_erl_evidence",
        "_min_window",
        "_near_end_floor",
        "_noise_window",
        "_pending",
        "_pending_quiet",
        "_proof",
        "_proof_rise",
        "_proof_start",
        "_render_env",
        "_render_head",
        "_render_pcm",
        "_render_size",
        "_render_wave",
        "_residual_env",
        "_residual_wave",
        "_run_frames",
        "_spread",
        "_until_update",
        "_update_every",
        "_window",
    )

    def __init__(self, config: EchoGateConfig | None = None) -> None:
        self._config = config = config if config is not None else EchoGateConfig()
        self._lag_min = ms_to_frames(config.min_delay_ms)
        self._lag_max = ms_to_frames(config.max_delay_ms)
        self._spread = ms_to_frames(config.delay_spread_ms)
        self._window = ms_to_frames(config.correlation_window_ms)
        self._min_window = ms_to_frames(config.min_correlation_window_ms)
        self._update_every = ms_to_frames(config.delay_update_ms)
        self._echo_check = min(ms_to_frames(config.echo_check_ms), self._window)
        self._capture_resync = ms_to_frames(config.capture_resync_ms)
        self._min_erl_evidence = ms_to_frames(config.min_erl_evidence_ms)
        self._erl_quantile = config.erl_percentile / 100.0
        self._margin = config.margin_db
        self._min_erl = config.min_erl_db
        self._near_end_floor = config.near_end_floor_dbfs
        self._noise_window = min(ms_to_frames(COHERENCE_NOISE_WINDOW_MS), self._window)
        # Render is needed for the correlation window plus the lag range
        # behind the newest capture slot, and for whatever was sent ahead.
        self._render_size = (
            self._window + self._lag_max + self._spread + ms_to_frames(config.render_ahead_ms)
        )
        self._render_env = _SlotRing(self._render_size)
        self._capture_env = _SlotRing(self._window)
        # The line canceller's residual level per slot (the floor where it left none).
        self._residual_env = _SlotRing(self._noise_window)
        # Levels judged: the capture's, or the canceller output's when it runs.
        self._judged_env = _SlotRing(self._window) if config.canceller else self._capture_env
        self._erl_ratios: npt.NDArray[np.float64] = np.zeros(ms_to_frames(config.erl_window_ms))
        self._pending: list[float] = []
        self._pending_quiet: list[float] = []
        # Per searched lag (row k is lag lag_max + spread - k, as in
        # _prove_lags): the ERL that frames heard since _proof_start prove
        # (-inf: nothing proven yet).
        self._proof: npt.NDArray[np.float64] = np.full(
            self._lag_max + self._spread - self._lag_min + 1, -math.inf
        )
        self._proof_start = 0
        # Per lag (rows as _proof): the ERL in use while no delay is known, and
        # with one, the floor under the delay's (_proven_at).
        self._lag_erl: npt.NDArray[np.float64] = np.full(len(self._proof), config.min_erl_db)
        # Every lag's ERL in use has reached max_erl_db (proofs only rise): see _prove_lags.
        self._lags_clean = False
        self._proof_rise = config.max_proof_rise_db_per_s * FRAME_MS / 1000.0
        self._render_pcm: dict[int, bytes] = {}
        # What was played and heard, at 8 kHz, for the coherence test: one row per slot.
        self._render_wave: npt.NDArray[np.float32] = np.zeros(
            (self._render_size, WAVE_FRAME), np.float32
        )
        self._capture_wave: npt.NDArray[np.float32] = np.zeros(2 * WAVE_FRAME, np.float32)
        # The same after the line canceller (the capture itself where it has no say).
        self._residual_wave: npt.NDArray[np.float32] = np.zeros(2 * WAVE_FRAME, np.float32)
        self._canceller = _new_canceller() if config.canceller else None
        # AEC3, when it runs, already takes the echo out of what is judged.
        self._lec = LineEchoCanceller() if config.line_canceller and not config.canceller else None
        # Whole-range alignments: updates to wait before the next, the wait after the
        # next failure, and failures in a row (see LINE_CANCELLER_SEARCH_BACKOFF_MS).
        self._lec_search_wait = 0
        self._lec_search_backoff = 1
        self._lec_search_failures = 0
        self._lec_search_longest = max(
            1, round(LINE_CANCELLER_SEARCH_BACKOFF_MS / (self._update_every * FRAME_MS))
        )
        self._init_state()

    def _init_state(self) -> None:
        self._render_env.clear()
        self._render_wave.fill(0.0)
        self._capture_wave.fill(0.0)
        self._residual_wave.fill(0.0)
        self._capture_env.clear()
        self._residual_env.clear()
        self._judged_env.clear()
        self._render_pcm.clear()
        self._render_head: int | None = None
        self._capture_head: int | None = None
        self._capture_count = 0
        # Frames of the current near-end run checked and found no copy of the render.
        self._checked_run = 0
        # Frames of the current near-end run (MOVED_RECHECK_FRAMES).
        self._run_frames = 0
        self._lec_aligned_for: int | None = None
        self._until_update = self._update_every
        # Whether this line has shown echo (a delay found, or a repeated alignment hint):
        # from then on a frame judged echo is silence to the VAD (VAD_HEARS_NEAR_NOISE_DB).
        self._echo_heard = False
        self._echo_hint_lag: int | None = None
        self._echo_searches = 0
        self._forget_delay()

    # ---- read-only state -----------------------------------------------------

    @property
    def config(self) -> EchoGateConfig:
        """The tuning this gate runs with."""
        return self._config

    @property
    def delay_ms(self) -> float | None:
        """Current echo delay estimate (send time to arrival), None until found."""
        return None if self._delay is None else float(self._delay * FRAME_MS)

    @property
    def echo_heard(self) -> bool:
        """Whether this line has shown echo: a delay found, or a repeated alignment hint."""
        return self._echo_heard

    @property
    def erl_db(self) -> float:
        """Echo return loss in use (``min_erl_db`` until one is learned)."""
        return self._erl

    # ---- operations ----------------------------------------------------------

    def render(self, frame: bytes, sent_ms: float) -> None:
        """Record a narrowband frame the core put on the wire to the caller at ``sent_ms``.

        Raises :class:`EchoGateInputError` and changes nothing unless
        ``frame`` is exactly one narrowband frame and ``sent_ms`` is finite.
        """
        _check_frame(frame)
        slot = _slot(sent_ms)
        head = self._render_head
        if head is not None:
            if slot <= head:
                slot = head + 1  # sent in a burst: it plays after the previous one
            elif slot > head + 1:
                self._render_env.silence(head + 1, slot - 1)
        band = _samples(frame)
        self._render_env.put(slot, max(samples_level_dbfs(band), _ENVELOPE_FLOOR_DBFS))
        self._render_wave[slot % self._render_size] = band
        if self._lec is not None:
            self._lec.render(band, sent_ms)
        self._render_head = slot
        if self._canceller is not None:
            self._render_pcm[slot] = frame

    def unplayed(self, frames: int) -> None:
        """The newest ``frames`` frames rendered were never played (the provider cleared them).

        Their slots become silence: the caller never heard them, so they can
        have no echo, and a quiet capture where they would have echoed
        proves nothing about the ERL. Frames sent again later are rendered
        again, in later slots.
        """
        head = self._render_head
        if head is None or frames <= 0:
            return
        self._render_env.silence(head - frames + 1, head)
        for slot in range(head - frames + 1, head + 1):
            self._render_pcm.pop(slot, None)
        if self._lec is not None:
            self._lec.unplayed(frames)

    def capture(self, frame: bytes, now_ms: float) -> EchoVerdict:
        """Judge a narrowband caller frame that arrived at ``now_ms``.

        Raises :class:`EchoGateInputError` and changes nothing unless
        ``frame`` is exactly one narrowband frame and ``now_ms`` is finite.
        """
        _check_frame(frame)
        slot = _slot(now_ms)
        head = self._capture_head
        if head is not None:
            if slot - head - 1 > self._capture_resync:
                # Audio went missing: restart the timeline at the arrival
                # time, and trust no delay until one is found on it again.
                self._capture_env.silence(head + 1, slot - 1)
                self._residual_env.silence(head + 1, slot - 1)
                self._judged_env.silence(head + 1, slot - 1)
                self._forget_delay(slot - 1)
                if self._lec is not None:
                    self._lec.restart_capture()
            else:
                slot = head + 1
        self._capture_head = slot
        level = frame_level_dbfs(frame)
        self._capture_env.put(slot, max(level, _ENVELOPE_FLOOR_DBFS))
        self._capture_count += 1
        band = _samples(frame)
        wave = self._capture_wave
        wave[:WAVE_FRAME] = wave[WAVE_FRAME:]
        wave[WAVE_FRAME:] = band
        cancelled_line = None if self._lec is None else self._lec.capture(band, now_ms)
        self._residual_env.put(
            slot,
            _ENVELOPE_FLOOR_DBFS
            if cancelled_line is None
            else max(cancelled_line[0], _ENVELOPE_FLOOR_DBFS),
        )
        residual = self._residual_wave
        residual[:WAVE_FRAME] = residual[WAVE_FRAME:]
        residual[WAVE_FRAME:] = band if cancelled_line is None else cancelled_line[2]

        # Nothing was sent for the slots up to the shortest possible echo
        # delay behind this frame: they are silence.
        render_last = slot - self._lag_min
        render_head = self._render_head
        if render_head is None or render_head < render_last:
            first = render_last if render_head is None else render_head + 1
            self._render_env.silence(first, render_last)
            self._render_head = render_last

        cancelled = None
        if self._canceller is not None:
            cancelled = self._cancel(self._canceller, frame, slot)
            level = frame_level_dbfs(cancelled)
            self._judged_env.put(slot, max(level, _ENVELOPE_FLOOR_DBFS))

        delay = self._delay
        # Per-lag bounds are kept up whether or not a delay is known (finding one
        # starts them afresh): without one they give the echo allowed at every
        # lag; with one, the least ERL the delay's lags are proven to have
        # (_update_erl).
        lag_echo = self._prove_lags(slot, level, allowed=delay is None)
        if delay is None:
            lo, hi = self._lag_min, self._lag_max + self._spread
        else:
            lo, hi = max(self._lag_min, delay - self._spread), delay + self._spread
        erl = self._erl
        render_peak = float(self._render_env.window(slot - lo, hi - lo + 1).max())
        if render_peak <= _ENVELOPE_FLOOR_DBFS:
            echo = DIGITAL_SILENCE_DBFS
            near_end = level >= self._near_end_floor
            if (
                near_end
                and delay is not None
                and self._checked_run < COPY_CHECK_FRAMES
                and level >= COHERENCE_FLOOR_DBFS
                and self._moved_echo(slot, delay)
            ):
                near_end = False
        else:
            # No delay yet: the echo may be at any lag, each with its own proven
            # ERL (a lag whose render was loud while the line stayed quiet carries
            # no echo however loud that render is). With a delay: the ERL learned there.
            echo = lag_echo if delay is None else render_peak - erl
            near_end = level >= max(self._near_end_floor, echo + self._margin)
            if (
                not near_end
                and delay is None
                and level >= max(self._near_end_floor, COHERENCE_FLOOR_DBFS)
                and level >= self._noise_floor(slot) + COHERENCE_NOISE_MARGIN_DB
                and self._coherence(slot)[0] < self._config.echo_coherence
            ):
                # Loud enough to be echo of a lag not yet proven clean, but no
                # copy of anything played: the caller (a caller who starts d ms
                # into the call's first answer looks, by energy, exactly like
                # that answer's echo d ms late).
                near_end = True
                self._checked_run = COPY_CHECK_FRAMES
            else:
                by_residual = (
                    not near_end
                    and cancelled_line is not None
                    and self._lec is not None
                    and self._lec.trusted
                    and cancelled_line[0]
                    >= max(
                        self._near_end_floor,
                        COHERENCE_FLOOR_DBFS,
                        cancelled_line[1] - self._lec.erle_db + LINE_CANCELLER_MARGIN_DB,
                        self._residual_floor(slot) + RESIDUAL_NOISE_MARGIN_DB,
                    )
                )
                if by_residual:
                    # What the line canceller leaves is more than its echo can
                    # be: the caller, under an echo energy could not clear.
                    near_end = True
                if (
                    near_end
                    and self._checked_run < COPY_CHECK_FRAMES
                    and level >= max(self._near_end_floor, COHERENCE_FLOOR_DBFS)
                ):
                    # The first frames of a run called near end: a copy of what
                    # was played is echo the ERL in use (or the canceller) did not
                    # predict (the path turned louder, a new path), not the caller.
                    wave = self._residual_wave if by_residual else self._capture_wave
                    copy = RESIDUAL_COPY if by_residual else self._config.echo_copy
                    best, lag = self._coherence(slot, wave)
                    if best < copy and by_residual and delay is not None:
                        # The canceller's residual after the path moved holds the new
                        # echo and the old path's prediction taken off it, a copy of
                        # neither (measured: 0.35-0.45 on a 200 ms -> 450 ms change).
                        # The frame as heard shows the echo's new lag; a copy at the
                        # known delay says nothing (a caller under it is what the
                        # residual is for), so only a moved lag is believed.
                        heard, heard_lag = self._coherence(slot)
                        if heard >= self._config.echo_copy and self._beyond_delay(heard_lag, delay):
                            best, lag = heard, heard_lag
                            copy = self._config.echo_copy
                        elif heard >= self._config.echo_copy and self._residual_follows(
                            slot, heard_lag
                        ):
                            # The canceller's own error (it slipped at a loud onset),
                            # where the frames heard copy the render: echo, not the caller.
                            best, lag = heard, heard_lag
                            copy = self._config.echo_copy
                    if best >= copy:
                        near_end = False
                        if delay is not None and self._beyond_delay(lag, delay):
                            # A copy more than a frame beyond the delay's spread:
                            # the echo now comes at another delay (the path moved,
                            # a caller switching to speakerphone). What was learned
                            # of the old path goes; the per-lag bounds and the
                            # waveform tests serve until the new one is learned.
                            self._forget_delay(slot)
                    else:
                        self._checked_run += 1
        if near_end:
            self._run_frames += 1
            later = self._run_frames - COPY_CHECK_FRAMES
            if (
                later > 0
                and later % MOVED_RECHECK_FRAMES == 0
                and self._delay is not None
                and level >= max(self._near_end_floor, COHERENCE_FLOOR_DBFS)
                and self._copy_beyond_delay(slot, self._delay)
            ):
                near_end = False
        if not near_end:
            self._checked_run = 0
            self._run_frames = 0
        vad_frame = self._vad_frame(frame, cancelled, cancelled_line, near_end, level, slot)
        if render_peak > _ENVELOPE_FLOOR_DBFS and (
            render_peak - self._min_erl >= self._near_end_floor
        ):
            # Render loud enough for its echo to be heard at the worst ERL
            # assumed: ERL evidence if nothing else was heard and, the
            # delay known, the envelopes around it say echo alone (see
            # _update_erl); or the sign that the echo turned louder than
            # the ERL in use allows.
            self._pending.append(render_peak - level)
            if not near_end:
                self._pending_quiet.append(render_peak - level)

        self._until_update -= 1
        if self._until_update <= 0:
            self._until_update = self._update_every
            self._update_delay(slot)
            self._update_erl(slot)
            self._align_line_canceller(slot)
        return EchoVerdict(
            near_end=near_end,
            echo_level_dbfs=echo,
            capture_dbfs=level,
            delay_ms=None if delay is None else float(delay * FRAME_MS),
            erl_db=erl,
            cancelled=cancelled,
            vad_frame=vad_frame,
        )

    def close(self) -> None:
        """The call is over: free its audio history now. The gate must not be used again.

        What goes is most of a gate's memory (~0.55 MiB: the render waveform ring and
        the line canceller's 4 s of render). A call's objects sit in reference cycles
        (callbacks, cancelled tasks' tracebacks), so without this they wait for the
        cyclic GC's full collection, and under call churn dead calls piled up
        (gateway/media_engine.py MediaEngine.close).
        """
        self._lec = None
        self._canceller = None
        self._render_wave = np.zeros((0, WAVE_FRAME), np.float32)
        self._render_pcm.clear()

    def reset(self) -> None:
        """Forget everything rendered and heard, delay and ERL included (as newly built)."""
        self._init_state()
        if self._canceller is not None:
            self._canceller.reset()
        if self._lec is not None:
            self._lec = LineEchoCanceller()

    # ---- internals -----------------------------------------------------------

    def _vad_frame(
        self,
        frame: bytes,
        cancelled: bytes | None,
        cancelled_line: tuple[float, float, npt.NDArray[np.float64]] | None,
        near_end: bool,
        level: float,
        slot: int,
    ) -> bytes:
        """The frame as the VAD should hear it: what this gate leaves of the caller.

        Fed the raw frame, the VAD hears the assistant's own voice in the echo:
        a door slammed over the echo then sounds like speech (measured on the
        rig: 0.9 on glass breaking over a 20 dB echo, against 0 on a clean
        line), and the echo heard before a burst primes its recurrent state.
        """
        if cancelled is not None:
            return cancelled  # WebRTC AEC3's output
        if not near_end and level >= self._near_end_floor:
            if (
                not self._echo_heard
                and self._echo_searches >= ECHO_SEARCHES_BEFORE_VAD_HEARS
                and level < self._noise_floor(slot) + VAD_HEARS_NEAR_NOISE_DB
            ):
                return frame  # no echo heard on this line, and this is at its noise
            return _SILENT_FRAME  # the assistant's echo alone: nothing of the caller
        lec = self._lec
        if cancelled_line is not None and lec is not None and lec.trusted:
            if cancelled_line[0] > level + STALE_RESIDUAL_DB:
                # The canceller added its prediction of an echo that is no longer
                # there (the path moved or turned quieter): the assistant's own
                # voice, which the VAD calls speech.
                return frame
            return _pcm16(cancelled_line[2])
        return frame

    def _cancel(self, canceller: _Canceller, frame: bytes, slot: int) -> bytes:
        """The canceller's output for ``frame``, given the render frame sent in its slot."""
        pcm = self._render_pcm
        far_bytes = pcm.pop(slot, None)
        if len(pcm) > self._render_size:  # render sent far ahead, or stale slots
            for old in [s for s in pcm if s < slot]:
                del pcm[old]
        far = _SILENT_SAMPLES if far_bytes is None else np.frombuffer(far_bytes, dtype=np.int16)
        out = canceller.process(np.frombuffer(frame, dtype=np.int16), far)
        return out.astype("<i2", copy=False).tobytes()

    def _prove_lags(self, slot: int, level: float, *, allowed: bool) -> float:
        """Raise every lag's proven ERL from this frame; the echo they allow in it (dBFS).

        The echo in a frame is never louder than the frame (energies add), so
        were the echo at lag d, the ERL is at least (render at d - this
        frame's level), whoever was talking: double talk only weakens the
        bound. The render taken is the quietest within ``delay_spread_ms`` of
        d (a delay between frame boundaries mixes its neighbours in), less
        ``proof_wobble_db``. Each lag's ERL in use follows its bound up by at
        most ``max_proof_rise_db_per_s`` and never falls but with a new echo
        path (:meth:`_forget_delay`, :meth:`_update_erl`). Returns the loudest
        echo any lag allows (only when ``allowed``: with a delay known it goes
        unused, and :data:`DIGITAL_SILENCE_DBFS` comes back instead): the
        render within ``delay_spread_ms`` of each lag
        less the weakest ERL there.
        """
        spread = self._spread
        lo, hi = self._lag_min, self._lag_max + spread
        lags = hi - lo + 1
        # window[j] is render slot slot - hi - spread + j; lag hi - k is window[k + spread].
        window = self._render_env.window(slot - lo + spread, lags + 2 * spread)
        config = self._config
        echo, self._lags_clean = echo_kernels.prove_lags(
            window,
            self._proof,
            self._lag_erl,
            spread,
            level,
            config.proof_wobble_db,
            config.max_erl_db,
            self._min_erl,
            self._proof_rise,
            _ENVELOPE_FLOOR_DBFS,
            DIGITAL_SILENCE_DBFS,
            slot >= self._proof_start,
            allowed,
            self._lags_clean,
        )
        return echo

    def _beyond_delay(self, lag: float, delay: int) -> bool:
        """Whether a copy found at ``lag`` (frames) lies more than a frame beyond the known
        delay's spread: echo at another delay than the one learned (the path moved)."""
        return abs(lag - delay) > self._spread + 1

    def _moved_echo(self, slot: int, delay: int) -> bool:
        """Whether a frame heard while nothing was played around the known delay is a
        copy of what was played at another lag: the echo path moved (a shorter route,
        a caller switching to speakerphone). Then the old delay goes.

        Nothing played around the delay would make every such frame near end, so a
        path that moved to a shorter delay was heard as the caller at the start of
        every answer (bench/reflex.py --lines hard, tune split: a 6 dB echo at 200 ms
        where 450 ms was learned paused and cut the assistant). Counts toward the
        run's COPY_CHECK_FRAMES when it is no such copy.
        """
        if self._copy_beyond_delay(slot, delay):
            return True
        self._checked_run += 1
        return False

    def _copy_beyond_delay(self, slot: int, delay: int) -> bool:
        """Whether the frame as heard is a copy (``echo_copy``) of what was played at a
        lag away from the known delay: the echo path moved, and the delay goes."""
        spread = self._spread
        lo, hi = self._lag_min, self._lag_max + spread
        if float(self._render_env.window(slot - lo, hi - lo + 1).max()) <= _ENVELOPE_FLOOR_DBFS:
            return False  # nothing played over the whole lag range: nothing to copy
        best, lag = self._coherence(slot)
        if best >= self._config.echo_copy and self._beyond_delay(lag, delay):
            self._forget_delay(slot)
            return True
        return False

    def _noise_floor(self, slot: int) -> float:
        """The quietest frame heard over the last ``COHERENCE_NOISE_WINDOW_MS`` (dBFS)."""
        count = min(self._capture_count, self._noise_window)
        return float(self._capture_env.window(slot, count).min())

    def _residual_floor(self, slot: int) -> float:
        """The line canceller's quietest residual over the last ``COHERENCE_NOISE_WINDOW_MS``
        (dBFS): the envelope floor unless it left a residual in every frame of it."""
        return float(self._residual_env.window(slot, self._noise_window).min())

    def _align_line_canceller(self, slot: int) -> None:
        """Point the line canceller at the echo, to the sample.

        Around the delay the gate found, when it has one. Without one (a call
        whose replies keep being cut is short of the echo alone the envelope
        correlation needs), over the whole lag range, while render is audible
        and the canceller has no delay or no longer cancels well: a waveform
        that correlates with the render at one offset is echo, whoever else is
        talking. Past ``LINE_CANCELLER_SEARCHES_BEFORE_BACKOFF`` searches in a
        row that found nothing, they are spaced out, up to
        ``LINE_CANCELLER_SEARCH_BACKOFF_MS`` apart, until render falls silent.
        """
        lec = self._lec
        if lec is None:
            return
        delay = self._delay
        if delay is not None:
            if lec.delay is not None and self._lec_aligned_for == delay:
                return
            if lec.align(delay * FRAME_MS, (self._spread + 1) * FRAME_MS):
                self._lec_aligned_for = delay
            return
        if lec.trusted or float(self._lag_erl.min()) >= LINE_CANCELLER_SKIP_ERL_DB:
            return
        lo, hi = self._lag_min, self._lag_max + self._spread
        if float(self._render_env.window(slot - lo, hi - lo + 1).max()) <= _ENVELOPE_FLOOR_DBFS:
            self._restart_search()  # nothing played that can echo now: the next is new
            return
        if self._lec_search_wait > 0:
            self._lec_search_wait -= 1  # the last searches found nothing: back off
            return
        low_ms, high_ms = lo * FRAME_MS, hi * FRAME_MS
        found = lec.align((low_ms + high_ms) / 2, (high_ms - low_ms) / 2)
        self._note_echo_hint(lec, found)
        if found:
            self._restart_search()
        else:
            self._lec_search_failures += 1
            if self._lec_search_failures >= LINE_CANCELLER_SEARCHES_BEFORE_BACKOFF:
                self._lec_search_wait = self._lec_search_backoff
                self._lec_search_backoff = min(
                    2 * self._lec_search_backoff, self._lec_search_longest
                )
        self._lec_aligned_for = None

    def _note_echo_hint(self, lec: LineEchoCanceller, found: bool) -> None:
        """After a whole-range alignment: has this line shown echo (ECHO_HINT_CORRELATION)?"""
        self._echo_searches += 1
        if found:
            self._echo_heard = True
            return
        lag = lec.best_delay
        if lec.best_correlation < ECHO_HINT_CORRELATION or lag is None:
            return
        last = self._echo_hint_lag
        if last is not None and abs(lag - last) <= ECHO_HINT_LAG_SAMPLES:
            self._echo_heard = True
        self._echo_hint_lag = lag

    def _restart_search(self) -> None:
        """Whole-range alignments at full rate again (LINE_CANCELLER_SEARCH_BACKOFF_MS)."""
        self._lec_search_wait = 0
        self._lec_search_backoff = 1
        self._lec_search_failures = 0

    def _coherence(
        self, slot: int, wave: npt.NDArray[np.float32] | None = None
    ) -> tuple[float, float]:
        """Best normalised cross-correlation of the last two frames heard with the render,
        and the lag (frames) it is at.

        Over every offset the lag range allows (pre-emphasised 8 kHz
        waveforms): near 1 when the line carries a copy of what was played
        (echo, through any short echo path), low for anything else.
        """
        render, hi = self._render_span(slot)
        capture = (self._capture_wave if wave is None else wave).astype(np.float64)
        peak = normalised_xcorr_peak(render, capture)
        if peak is None:
            return 0.0, math.nan
        correlation, best = peak
        # Render row i is slot - 1 - hi + i, and the two frames heard start at slot - 1.
        return correlation, hi - best / WAVE_FRAME

    def _render_span(self, slot: int) -> tuple[npt.NDArray[np.float64], int]:
        """The render every slot the last two frames heard can echo, as one waveform
        (slots slot-1-hi .. slot-lo, inaudible slots zeroed), and ``hi``."""
        spread = self._spread
        lo, hi = self._lag_min - spread, self._lag_max + 2 * spread
        rows = np.arange(slot - 1 - hi, slot - lo + 1) % self._render_size
        audible = self._render_env.window(slot - lo, len(rows)) > _ENVELOPE_FLOOR_DBFS
        render = (self._render_wave[rows] * audible[:, None]).ravel().astype(np.float64)
        return render, hi

    def _residual_follows(self, slot: int, lag: float) -> bool:
        """Whether the line canceller's residual (the last two frames) is the render at
        ``lag`` (frames, as :meth:`_coherence` gives it) through a short filter:
        RESIDUAL_FOLLOWS_TAPS taps around that lag explain RESIDUAL_FOLLOWS_SHARE of
        its energy (least squares)."""
        if math.isnan(lag):
            return False
        render, hi = self._render_span(slot)
        residual = self._residual_wave.astype(np.float64)
        energy = float(residual @ residual)
        if energy <= 0.0:
            return False
        n = len(residual)
        start = round((hi - lag) * WAVE_FRAME) - RESIDUAL_FOLLOWS_TAPS // 2
        if start < 0 or start + RESIDUAL_FOLLOWS_TAPS - 1 + n > len(render):
            return False
        taps = np.lib.stride_tricks.sliding_window_view(
            render[start : start + n - 1 + RESIDUAL_FOLLOWS_TAPS], n
        )
        fitted, *_ = np.linalg.lstsq(taps.T, residual, rcond=None)
        left = residual - taps.T @ fitted
        return 1.0 - float(left @ left) / energy >= RESIDUAL_FOLLOWS_SHARE

    def _forget_delay(self, slot: int | None = None) -> None:
        """Drop the delay and all the ERL learned (back to the conservative prediction).

        ``slot``: the capture slot the echo path may have changed at; the ERL
        is proven again from frames after it only (None: from any frame).
        """
        self._delay: int | None = None
        if self._lec is not None:
            self._lec.forget()
        # A new echo path may be anywhere: search for it at once again.
        self._restart_search()
        self._forget_evidence()
        self._erl = self._min_erl
        self._proof.fill(-math.inf)
        self._lag_erl.fill(self._min_erl)
        self._lags_clean = False
        self._proof_start = -(2**62) if slot is None else slot + 1

    def _forget_evidence(self) -> None:
        """Drop the echo-alone ERL evidence (not the proven bounds)."""
        self._erl_count = 0
        self._erl_index = 0
        self._erl_median = math.inf
        self._pending.clear()
        self._pending_quiet.clear()

    def _update_delay(self, slot: int) -> None:
        """Re-estimate the echo delay from the envelopes ending at capture ``slot``.

        A lag is believed only when the capture follows the render at it on
        the frames where that render was loud enough to be heard as echo
        (``_follows``), not merely over the whole window: turn-taking alone
        (the caller starting a few hundred ms into every answer, the answer
        stopping when they do) correlates the two envelopes' on/off
        structure at the caller's reaction time, with no echo at all.
        """
        count = min(self._capture_count, self._window)
        if count < self._min_window:
            return
        capture = self._capture_env.window(slot, count)
        centred = capture - capture.mean()
        capture_var = float(centred @ centred)
        if capture_var < _MIN_ENVELOPE_VARIANCE * count:
            return
        lag_min, lag_max = self._lag_min, self._lag_max
        # Render slots slot-count+1-lag_max .. slot-lag_min. Row k of the
        # strided view (no copy; sliding_window_view costs ~6 µs of checks)
        # is render[k : k + count], the render envelope at lag lag_max - k.
        render = self._render_env.window(slot - lag_min, count + lag_max - lag_min)
        rows: npt.NDArray[np.float64] = np.ndarray(
            (len(render) - count + 1, count), np.float64, render, 0, (_ITEM, _ITEM)
        )
        sums = np.cumsum(np.concatenate(([0.0], render)))
        squares = np.cumsum(np.concatenate(([0.0], render * render)))
        row_sum = sums[count:] - sums[:-count]
        row_var = squares[count:] - squares[:-count] - row_sum * row_sum / count
        usable = row_var >= _MIN_ENVELOPE_VARIANCE * count
        if not usable.any():
            return
        # The capture is centred, so the row means drop out of the covariance.
        covariance = rows @ centred
        corr = np.where(usable, covariance / np.sqrt(np.maximum(row_var, 1.0) * capture_var), -1.0)
        best = int(np.argmax(corr))
        best_corr = float(corr[best])
        if best_corr < self._config.min_correlation or not self._follows(rows[best], capture):
            return
        best_lag = lag_max - best
        current = self._delay
        if current is None:
            # The first echo path found: back to the worst ERL assumed, then
            # learned from echo alone at it.
            self._forget_delay(slot)
            self._delay = best_lag
            self._echo_heard = True
            self._seed_evidence(slot, best_lag)
        elif (
            best_lag != current
            and best_corr >= float(corr[lag_max - current]) + self._config.delay_hysteresis
        ):
            if abs(best_lag - current) > self._spread:
                # A new echo path: nothing learned about the old one holds;
                # learn it afresh from the frames after now.
                self._forget_delay(slot)
            self._delay = best_lag

    def _follows(self, render: npt.NDArray[np.float64], capture: npt.NDArray[np.float64]) -> bool:
        """Whether ``capture`` follows ``render`` (aligned) where render could be heard as echo.

        Pearson correlation over the frames whose render, at the worst ERL
        assumed, would be echo above the near-end floor; at least
        ``min_correlation_window_ms`` of them.
        """
        audible = render - self._min_erl >= self._near_end_floor
        if int(audible.sum()) < self._min_window:
            return False
        r = render[audible]
        c = capture[audible]
        r = r - r.mean()
        c = c - c.mean()
        energy = float(r @ r) * float(c @ c)
        if energy < (_MIN_ENVELOPE_VARIANCE * len(r)) ** 2:
            return False
        return float(r @ c) >= self._config.min_correlation * math.sqrt(energy)

    def _seed_evidence(self, slot: int, delay: int) -> None:
        """Fill the ERL evidence from the envelope history at a newly found ``delay``.

        Only when the capture envelope of that history follows the render's
        at the delay closely (echo alone, as :meth:`_update_erl` asks of
        every frame it keeps); frames that the conservative ERL would call
        near end are left out, like the frames :meth:`capture` leaves out.
        """
        count = min(self._capture_count, self._window, len(self._erl_ratios))
        if not self._echo_alone(slot, delay, count):
            return
        lo, hi = max(self._lag_min, delay - self._spread), delay + self._spread
        capture = self._judged_env.window(slot, count)
        render = self._render_env.window(slot - lo, count + hi - lo)
        # Row k is the render envelope at lag hi - k; the peak over rows is the
        # render peak capture() takes for each of these frames.
        lags: npt.NDArray[np.float64] = np.ndarray(
            (hi - lo + 1, count), np.float64, render, 0, (_ITEM, _ITEM)
        )
        peak = lags.max(axis=0)
        echo = peak - self._min_erl
        audible = (peak > _ENVELOPE_FLOOR_DBFS) & (echo >= self._near_end_floor)
        quiet = capture < np.maximum(self._near_end_floor, echo + self._margin)
        self._add_evidence((peak - capture)[audible & quiet].tolist())

    def _update_erl(self, slot: int) -> None:
        """Re-take the ERL: proven bounds, plus echo-alone evidence once the delay is known.

        Nothing here is learned from a frame that can hold the caller:

        - the proven bound (:meth:`_prove_lags`) holds whoever talks;
          without a delay the ERL is the lowest bound over all lags (the
          echo may be at any of them), with one that of the delay;
        - (render - capture) of frames judged echo only is kept as evidence
          only while the capture envelope of the last ``echo_check_ms``
          follows the render envelope at the delay closely, which double
          talk breaks; its low percentile (never more than
          ``erl_spread_db`` under its median) may raise the ERL above the
          bound. Without a delay nothing is echo-alone evidence.

        When the envelopes say echo alone over the pending frames too, yet
        those sit ``erl_shift_db`` under the ERL or the evidence, the echo
        path got louder (a caller switching to speakerphone): bounds and
        evidence are dropped and the ERL follows at once. Rises are limited
        to ``max_erl_rise_db_per_s``; falls are not (they only hide more).
        """
        pending, quiet = self._pending, self._pending_quiet
        delay = self._delay
        if delay is not None and pending and self._echo_alone(slot, delay, self._echo_check):
            known = self._erl_count >= self._min_erl_evidence
            reference = self._erl_median if known else self._erl
            # Capture louder than the render it would echo is not echo (a path
            # with gain): double talk the envelopes did not tell apart.
            shift = _median(pending)
            louder = _ERL_FLOOR_DB <= shift < reference - self._config.erl_shift_db
            if louder and self._echo_alone(slot, delay, len(pending)):
                louder_echo = list(pending)
                self._forget_evidence()
                self._proof.fill(-math.inf)
                self._lag_erl.fill(self._min_erl)
                self._lags_clean = False
                self._proof_start = slot + 1
                by_size = sorted(louder_echo)
                low = by_size[min(len(by_size) - 1, int(len(by_size) * self._erl_quantile))]
                self._erl = max(min(self._erl, low), _ERL_FLOOR_DB)
                self._add_evidence(louder_echo)
            else:
                self._add_evidence(quiet)
        pending.clear()
        quiet.clear()
        if delay is None:
            # The echo may be at any lag: the weakest bound, and never under
            # the worst ERL assumed. Bounds only rise, so this never falls.
            target = max(float(self._proof.min()), self._min_erl, self._erl)
        else:
            # Echo proven at the delay: its level is measured, not bounded.
            # The bounds, a maximum over time, would hold the quietest the
            # echo ever was against an echo level that drifts; the
            # echo-alone evidence follows it (and may fall: echo alone).
            target = self._erl  # until enough evidence, hold
            count = self._erl_count
            if count >= self._min_erl_evidence:
                # k-th smallest by partition: np.percentile costs ~20x as much.
                rank = min(count - 1, int(count * self._erl_quantile))
                middle = count // 2
                ordered = np.partition(self._erl_ratios[:count], (rank, middle))
                self._erl_median = median = float(ordered[middle])
                target = max(float(ordered[rank]), median - self._config.erl_spread_db)
            # Never under what the delay's lags are proven to have, whoever talked.
            # A delay can be found on turn-taking alone (a caller who starts the same
            # few hundred ms into every answer); with no echo there, no echo-alone
            # evidence ever comes, and the worst ERL assumed would stay in use for
            # the rest of the call: a caller quieter than the assistant less 6 dB
            # taken for its echo, and interruptions resumed over them (tune split).
            target = max(target, self._proven_at(delay))
        target = min(max(target, _ERL_FLOOR_DB), self._config.max_erl_db)
        rise = self._config.max_erl_rise_db_per_s * self._update_every * FRAME_MS / 1000.0
        self._erl = min(target, self._erl + rise) if target > self._erl else target

    def _proven_at(self, delay: int) -> float:
        """The least ERL in use (:meth:`_prove_lags`) within the spread of lag ``delay``."""
        k = self._lag_max + self._spread - delay
        return float(self._lag_erl[max(0, k - self._spread) : k + self._spread + 1].min())

    def _echo_alone(self, slot: int, delay: int, frames: int) -> bool:
        """Whether the capture envelope of the last ``frames`` follows the render's at ``delay``."""
        count = min(self._capture_count, frames)
        capture = self._capture_env.window(slot, count)
        render = self._render_env.window(slot - delay, count)
        c = capture - capture.mean()
        r = render - render.mean()
        energy = float(c @ c) * float(r @ r)
        threshold = self._config.echo_only_correlation
        return energy > 0 and float(c @ r) >= threshold * math.sqrt(energy)

    def _add_evidence(self, ratios: list[float]) -> None:
        """Append (render - capture) values to the ERL evidence ring."""
        ring = self._erl_ratios
        size = len(ring)
        index = self._erl_index
        for ratio in ratios:
            ring[index] = ratio
            index = (index + 1) % size
        self._erl_index = index
        self._erl_count = min(self._erl_count + len(ratios), size)
