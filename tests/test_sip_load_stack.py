"""``rutster sip-load`` on a whole local stack (tools/sip_load_stack.py), through the CLI entry."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import threading
from collections.abc import Iterator

import psutil
import pytest

from rutster.media.vad import DEFAULT_DETECTOR
from rutster.tools.cli import main
from rutster.tools.sip_load_stack import (
    MetricSample,
    cpu_delta,
    format_stack_report,
    free_port_block,
    load_gateway_env,
    parse_metrics,
    workers_needed,
)
from rutster.tools.sip_peer import SipPeerProcess
from tests.realtime_echo import check_sip_echo, realtime_echo


def _stack_children() -> list[list[str]]:
    """Command lines of this process's children that belong to a rutster stack."""
    found = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            cmdline = child.cmdline()
            if "rutster.tools.cli" in cmdline or any(
                "multiprocessing.spawn" in arg for arg in cmdline
            ):
                found.append(cmdline)
    return found


@contextlib.contextmanager
def echo_reflector() -> Iterator[str]:
    """A pjsua2 phone answering every call and echoing it, on a loop of its own thread
    (``main`` runs ``asyncio.run`` itself, so the test cannot hold a running loop)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    peer = SipPeerProcess()

    async def start() -> None:
        await peer.start()
        await peer.answer_incoming(200, echo=True)

    try:
        asyncio.run_coroutine_threadsafe(start(), loop).result(30)
        yield peer.sip_uri
    finally:
        asyncio.run_coroutine_threadsafe(peer.close(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def _figure(text: str, pattern: str) -> float:
    found = re.search(pattern, text)
    assert found is not None, f"{pattern!r} not in:\n{text}"
    return float(found.group(1))


@realtime_echo
def test_small_run_of_the_whole_stack_passes_every_call(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["sip-load", "--calls", "4", "--cps", "4", "--duration", "3"])
    out = capsys.readouterr().out
    print(out)  # shown when an assertion fails
    # 4 calls cannot meet the 40-concurrent goal, so the verdict is FAIL (exit 1); every
    # other goal and every call passes.
    assert code == 1
    assert "calls       attempted 4  answered 4  failed 0  concurrent peak 4" in out
    assert "FAIL  concurrent calls >= 40 (peak 4)" in out
    assert "PASS  setup P95 <= 200 ms" in out
    assert "PASS  failed calls <= 0 (0)" in out
    check_sip_echo(_figure(out, r"correlation min ([0-9.]+)"))
    # The stack part: one worker (4 calls), the gateway saw and admitted all 4 calls, and
    # carried about 3 s x 50 frames/s each way per call.
    assert "local stack: 1 SIP workers" in out
    assert _figure(out, r"gateway     calls (\d+)") == 4
    assert _figure(out, r"admitted (\d+)") == 4
    assert _figure(out, r"refused (\d+)") == 0
    assert _figure(out, r"active after (\d+)") == 0  # every call ended and settled
    assert _figure(out, r"frames in (\d+)") >= 4 * 100
    assert _figure(out, r" out (\d+)") >= 4 * 100
    assert _figure(out, r"bad msgs    (\d+)") == 0
    for role in ("gateway", "workers \\(1\\)", "brain", "peers"):
        assert _figure(out, rf"{role} ([0-9.]+) s = ") > 0, role
    assert f"gateway VAD {DEFAULT_DETECTOR} (default)" in out
    # Nothing of the stack (brain, gateway, workers, peers) is left running.
    assert _stack_children() == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--calls", "0"], "calls must be >= 1"),
        (["--cps", "0"], "cps must be > 0"),
        (["--duration", "-1"], "duration must be > 0"),
        (["--calls", "400"], "more than one pool runs"),
        (["--vad", "nonsense"], "unknown VAD 'nonsense'"),
        (["--header", "no-colon"], "header must be NAME:VALUE"),
        (["--speech", "/nonexistent.wav"], "not found"),
        (["--bind-host", "10.0.0.1"], "--bind-host needs --target"),
        (["--target", "sip:127.0.0.1:5070", "--vad", "webrtc"], "local stack only"),
    ],
)
def test_bad_arguments_are_refused_before_anything_starts(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    assert main(["sip-load", *argv]) == 2
    assert message in capsys.readouterr().out
    assert {p.pid for p in psutil.Process().children(recursive=True)} == before


def test_with_target_only_the_generator_runs(capsys: pytest.CaptureFixture[str]) -> None:
    with echo_reflector() as uri:
        code = main(["sip-load", "--target", uri, "--calls", "2", "--cps", "4", "--duration", "2"])
    out = capsys.readouterr().out
    print(out)
    assert code == 1  # 2 calls < the 40-concurrent goal
    assert f"SIP load: {uri}  2 calls at 4/s, 2 s each, 1 peer processes" in out
    assert "calls       attempted 2  answered 2  failed 0" in out
    assert "local stack" not in out and "gateway" not in out


def test_workers_needed_is_four_calls_per_worker() -> None:
    assert [workers_needed(n) for n in (1, 4, 5, 8, 40, 41)] == [1, 1, 2, 2, 10, 11]
    with pytest.raises(ValueError, match="calls must be >= 1"):
        workers_needed(0)


def test_port_block_is_free_for_udp_and_tcp() -> None:
    base = free_port_block(3)
    for port in range(base, base + 3):
        for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
            with socket.socket(socket.AF_INET, kind) as sock:
                sock.bind(("127.0.0.1", port))
    with pytest.raises(ValueError):
        free_port_block(0)


def test_gateway_env_lifts_the_load_limits_and_keeps_secrets_random() -> None:
    a = load_gateway_env("ws://127.0.0.1:1/echo", "s" * 32, vad="webrtc")
    b = load_gateway_env("ws://127.0.0.1:1/echo", "s" * 32)
    assert a["RUTSTER_DEFAULT_MAX_CONCURRENT"] == "0"
    assert a["RUTSTER_DEFAULT_CALLER_CALLS_PER_HOUR"] == "0"
    assert a["RUTSTER_BARGE_IN"] == "off"
    assert a["RUTSTER_VAD"] == "webrtc" and b["RUTSTER_VAD"] == DEFAULT_DETECTOR
    for name in ("TWILIO_AUTH_TOKEN", "RUTSTER_STREAM_SECRET", "RUTSTER_ADMIN_KEY"):
        assert a[name] != b[name] and len(a[name]) >= 32


def test_cpu_delta_counts_new_processes_from_zero_and_never_goes_negative() -> None:
    before = {"workers": {1: 2.0, 2: 5.0}, "gateway": {9: 10.0}}
    after = {"workers": {1: 3.5, 3: 0.5}, "gateway": {9: 9.0}}  # 2 died, 3 restarted
    assert cpu_delta(before, after) == {"workers": 2.0, "gateway": 0.0}


METRICS_BEFORE = """\
# TYPE rutster_calls_total counter
rutster_calls_total 2.0
# TYPE rutster_playout_underruns_total counter
rutster_playout_underruns_total 1.0
# TYPE rutster_bad_messages_total counter
rutster_bad_messages_total{source="sip_media",reason="bad_json"} 1.0
# TYPE rutster_pacer_lateness_seconds histogram
rutster_pacer_lateness_seconds_bucket{le="0.001"} 5.0
rutster_pacer_lateness_seconds_bucket{le="0.01"} 5.0
rutster_pacer_lateness_seconds_bucket{le="+Inf"} 5.0
rutster_pacer_lateness_seconds_count 5.0
rutster_pacer_lateness_seconds_sum 0.001
"""

METRICS_AFTER = """\
# TYPE rutster_calls_total counter
rutster_calls_total 12.0
# TYPE rutster_active_calls gauge
rutster_active_calls 0.0
# TYPE rutster_playout_underruns_total counter
rutster_playout_underruns_total 4.0
# TYPE rutster_admissions_total counter
rutster_admissions_total{outcome="admitted",reason="ok"} 9.0
rutster_admissions_total{outcome="refused",reason="budget"} 1.0
# TYPE rutster_bad_messages_total counter
rutster_bad_messages_total{source="sip_media",reason="bad_json"} 3.0
rutster_bad_messages_total{source="sip_control",reason="unauthorized"} 1.0
# TYPE rutster_pacer_lateness_seconds histogram
rutster_pacer_lateness_seconds_bucket{le="0.001"} 6.0
rutster_pacer_lateness_seconds_bucket{le="0.01"} 104.0
rutster_pacer_lateness_seconds_bucket{le="+Inf"} 105.0
rutster_pacer_lateness_seconds_count 105.0
rutster_pacer_lateness_seconds_sum 0.5
"""


def test_stack_report_shows_the_deltas_over_the_run() -> None:
    before = parse_metrics(METRICS_BEFORE)
    after = parse_metrics(METRICS_AFTER)
    assert MetricSample("rutster_calls_total", (), 12.0) in after
    text = format_stack_report(
        {"gateway": 3.0, "workers": 4.0, "brain": 1.0, "redis": 0.0, "sip-load": 0.5},
        2,
        1.5,
        10.0,
        before,
        after,
        2,
    )
    print(text)
    assert "local stack: 2 SIP workers" in text
    assert "gateway 3.0 s = 30 %" in text and "workers (2) 4.0 s = 40 %" in text
    assert "peers 1.5 s = 15 %" in text
    assert "CPU total   10.0 s = 100 % of one core; the machine has 2 cores (50 % of all)" in text
    assert "calls 10  admitted 9  refused 1  active after 0" in text
    assert "underruns 3" in text
    # 100 new samples: 1 <= 1 ms, 98 more <= 10 ms, 1 above -> p99 in the 10 ms bucket.
    assert "pacer lateness p99 10.0 ms" in text
    assert "bad msgs    3  sip_control/unauthorized 1  sip_media/bad_json 2" in text
    with pytest.raises(ValueError):
        format_stack_report({}, 1, 0.0, 0.0, before, after, 2)
