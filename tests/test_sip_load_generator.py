"""SIP load generator: real runs against pjsua2 echo reflectors and a busy peer, plus its maths."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest

from rutster.tools.sip_load_generator import (
    DEFAULT_SPEECH_PATH,
    GOAL_CONCURRENT_CALLS,
    CallResult,
    LoadReport,
    analyse_echo,
    format_report,
    load_speech_16k,
    main,
    run_load,
)
from rutster.tools.sip_peer import SipPeerProcess
from tests.realtime_echo import check_sip_echo, realtime_echo

#: Bytes per second of PCM16 mono 16 kHz.
BPS = 32_000


@realtime_echo
async def test_six_calls_against_echo_reflectors_all_succeed() -> None:
    # One pjsua2 process holds 4 calls, so 6 concurrent calls need two reflectors.
    async with SipPeerProcess() as r1, SipPeerProcess() as r2:
        for r in (r1, r2):
            await r.answer_incoming(200, echo=True)
        report = await run_load(
            [r1.sip_uri, r2.sip_uri],
            calls=6,
            cps=6,
            duration_s=3,
            speech_path=DEFAULT_SPEECH_PATH,
            headers={"X-Load": "1"},
        )
        infos = [await r.next_incoming(1) for r in (r1, r1, r1, r2, r2, r2)]
    assert all(i.headers["X-Load"] == "1" for i in infos)
    print(format_report(report), *report.results, sep="\n")  # shown when an assertion fails
    assert (report.attempted, report.answered, report.failed) == (6, 6, 0)
    assert report.peer_processes == 2
    assert report.concurrent_peak == 6  # all started within 1 s, each held 3 s
    assert report.setup_p95_ms is not None and report.setup_p95_ms < 200
    check_sip_echo(report.correlation_min)
    assert report.lag_p50_ms is not None and 0 < report.lag_p50_ms < 300
    assert report.loss_pct == 0.0
    assert all(r.rx_packets > 100 for r in report.results)
    assert report.peer_cpu_s > 0
    text = format_report(report)
    assert f"FAIL  concurrent calls >= {GOAL_CONCURRENT_CALLS} (peak 6)" in text
    assert "PASS  setup P95" in text and "PASS  failed calls <= 0 (0)" in text
    assert text.endswith("\nFAIL")


async def test_busy_target_counts_every_call_failed() -> None:
    async with SipPeerProcess() as busy:
        await busy.answer_incoming(486)
        report = await run_load(busy.sip_uri, calls=6, cps=6, duration_s=3)
    assert (report.attempted, report.answered, report.failed) == (6, 0, 6)
    assert all(r.sip_code == 486 for r in report.results)
    assert report.setup_p95_ms is None and report.concurrent_peak == 0
    text = format_report(report)
    assert "6 x SIP 486" in text and "setup P95 <= 200 ms (n/a)" in text
    assert not report.passed


def _result(i: int, setup: float | None, **kw: object) -> CallResult:
    base: dict[str, object] = {
        "index": i,
        "sip_code": 200 if setup is not None else 503,
        "answered": setup is not None,
        "setup_ms": setup,
        "audio_back": setup is not None,
        "correlation": 0.9 if setup is not None else None,
        "lag_ms": 60.0 if setup is not None else None,
        "rx_packets": 99,
        "rx_lost": 1,
    }
    base.update(kw)
    return CallResult(**base)  # type: ignore[arg-type]


def _report(results: list[CallResult], peak: int) -> LoadReport:
    return LoadReport("sip:x", len(results), 5, 60, tuple(results), peak, 10.0, 10, 2.5)


def test_report_figures_and_goals() -> None:
    results = [_result(i, float(i + 1)) for i in range(40)]
    report = _report(results, peak=40)
    assert report.setup_p50_ms == pytest.approx(20.5)
    assert report.setup_p95_ms == pytest.approx(38.05)
    assert report.setup_max_ms == 40.0
    assert report.loss_pct == pytest.approx(1.0)
    assert report.peer_cpu_pct == pytest.approx(25.0)
    assert report.passed and format_report(report).endswith("\nPASS")

    slow = _report([*results[:-3], *(_result(i, 500.0) for i in range(3))], peak=40)
    assert not slow.passed and "FAIL  setup P95" in format_report(slow)
    no_audio = _report([*results[:-1], _result(39, 5.0, audio_back=False)], peak=40)
    assert no_audio.failed == 1 and "1 x no audio back" in format_report(no_audio)
    assert _report(results, peak=39).passed is False


def test_analyse_echo_finds_lag_and_silence() -> None:
    sent = load_speech_16k(DEFAULT_SPEECH_PATH)[: 3 * BPS]
    heard = bytes(100 * 32) + sent  # 100 ms later
    back, corr, lag_ms = analyse_echo(sent, heard)
    assert back and corr is not None and corr > 0.99 and lag_ms == pytest.approx(100.0)
    back, corr, _ = analyse_echo(sent, bytes(len(sent)))
    assert not back and corr == 0.0
    assert analyse_echo(sent, b"") == (False, None, None)


def test_load_speech_resamples_to_16k_and_rejects_stereo(tmp_path: Path) -> None:
    with wave.open(str(DEFAULT_SPEECH_PATH), "rb") as w:
        frames_8k = w.getnframes()
    pcm = load_speech_16k(DEFAULT_SPEECH_PATH)
    assert len(pcm) // 2 == 2 * frames_8k
    assert np.abs(np.frombuffer(pcm, np.int16)).max() > 1000
    stereo = tmp_path / "stereo.wav"
    with wave.open(str(stereo), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(bytes(64))
    with pytest.raises(ValueError, match="mono"):
        load_speech_16k(stereo)


def test_main_rejects_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--target", "sip:127.0.0.1:5070", "--calls", "0"]) == 2
    assert "calls must be >= 1" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--target", "sip:127.0.0.1:5070", "--header", "no-colon"])
