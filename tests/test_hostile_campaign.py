"""The hostile-input campaign, quick mode: seeded fuzzing while honest calls flow.

``bench/hostile_campaign.py`` runs the gateway and its echo brain in their own
processes, a fuzzing process attacking the media socket, the webhooks, raw TCP
and the tap (a hostile brain), and honest echo calls of real speech alongside.
The long mode is the same code for ten minutes (``python -m
bench.hostile_campaign``); its figures are in the README.
"""

from __future__ import annotations

from bench.hostile_campaign import WORKERS, run_campaign
from rutster.media.pacer import DEFAULT_LEAD_MS
from tests.echo_checks import ECHO_SHORTFALL
from tests.realtime_echo import realtime_echo

#: Seconds of attack: long enough for several honest calls back to back and a few
#: thousand hostile messages of every family, short enough for CI.
QUICK_SECONDS = 15.0
#: The seed CI runs (a failure is replayed with ``--seed 1 --seconds 15``).
QUICK_SEED = 1
#: Seconds between one webhook worker's requests here (~20 a second in all, a fifth
#: of the long mode's rate). Measured: at the long mode's ~100 webhooks a second the
#: first second of some honest calls underran (a 40 ms hole or a sub-ms gap, then the
#: delay won back). Part of it was the webhooks themselves: one of thousands of short
#: form fields cost the loop 23-40 ms until caf3dad refused them on a count. Since,
#: the long mode kept 134 of 134 honest calls intact; 15 s runs at its rate (seeds
#: 1-4) still had a few-ms gap in one, as did one at this rate: on this 2-core VM
#: even a bare sleeping process then wakes 8-23 ms late about once a second (README,
#: "The hostile-input campaign"). The rerun (tests/realtime_echo.py) covers one.
QUICK_WEBHOOK_INTERVAL_S = 0.1
#: Fewest hostile messages the quick run must have sent (it sends ~3,000: a
#: run that sent far fewer did not attack, whatever it measured).
MIN_MESSAGES = 1_500
#: Fewest honest calls judged (two lanes of 8 s calls over 15 s).
MIN_HONEST_CALLS = 4
#: Slack on the lead seen at the provider: loop jitter on a loaded 2-core box delays
#: single arrivals (as in tests/test_hostile_brain.py); a flood passed through would
#: be seconds.
LEAD_SLACK_MS = 40.0
#: RSS the gateway may keep after the attack, once every call has ended. CPython
#: does not hand freed arenas back at once, and bounded caches fill (recent call
#: trails, MAX_RECENT_TRAILS; stream-token claims, MAX_LOCAL_CLAIMS; the tool
#: schema cache): measured +20 MiB after 15 s and a plateau, +21 MiB over 120 s
#: (README, "Bad input"); in-process, malloc_trim(0) gave it back.
MAX_RSS_GROWTH_MIB = 48


@realtime_echo
async def test_quick_campaign_harms_no_honest_call() -> None:
    report = await run_campaign(
        QUICK_SECONDS, QUICK_SEED, webhook_interval_s=QUICK_WEBHOOK_INTERVAL_S
    )
    report.print()  # shown when the test fails

    fuzz = report.fuzz
    assert sum(fuzz.sent.values()) >= MIN_MESSAGES, fuzz.sent
    for family in WORKERS:
        assert fuzz.sent[family] > 0, f"no {family} messages were sent"

    assert fuzz.server_errors == 0, fuzz.errors
    # Issue 14, finding 4, end to end: whatever a hostile brain sends, the provider
    # never holds more than the pacer's lead (plus loop jitter on a loaded box).
    assert fuzz.max_tap_queue_ms <= DEFAULT_LEAD_MS + LEAD_SLACK_MS
    assert report.tracebacks == 0, report.log_errors

    assert len(report.honest) >= MIN_HONEST_CALLS
    problems = [c.judgement.problem for c in report.honest if c.judgement.problem is not None]
    assert not problems, f"{ECHO_SHORTFALL}: {problems}"

    assert report.calls_left == 0
    assert report.after.other_fds == report.before.other_fds, (report.before, report.after)
    growth_mib = (report.after.rss_kib - report.before.rss_kib) / 1024
    assert growth_mib <= MAX_RSS_GROWTH_MIB, f"RSS grew {growth_mib:.1f} MiB"
