"""SipPeerProcess: two real pjsua2 peers (one process each) call each other over loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from rutster.tools.sip_load_generator import DEFAULT_SPEECH_PATH, analyse_echo, load_speech_16k
from rutster.tools.sip_peer import (
    MAX_CALLS_PER_PROCESS,
    SipPeerError,
    SipPeerProcess,
    _parse_headers,
)
from rutster.tools.twilio_simulator import best_lag_correlation

#: Bytes per second of PCM16 mono 16 kHz.
BPS = 32_000
#: Sent and heard audio are the same speech after PCMU on loopback: measured ~0.95-0.999.
#: A different sentence scores below 0.2, so 0.8 tells "my audio arrived" from "some audio".
MIN_MATCH = 0.8
MAX_MISMATCH = 0.3
#: Wait budget for SIP events on loopback (they take milliseconds).
EVENT_S = 5.0


@pytest.fixture(scope="module")
def speech() -> tuple[bytes, bytes]:
    """Two different 3 s stretches of the real-speech fixture at 16 kHz (caller, callee)."""
    pcm = load_speech_16k(DEFAULT_SPEECH_PATH)
    return pcm[: 3 * BPS], pcm[10 * BPS : 13 * BPS]


@pytest.fixture
async def pair() -> AsyncIterator[tuple[SipPeerProcess, SipPeerProcess]]:
    """A caller peer and a callee peer, each in its own process."""
    async with SipPeerProcess() as a, SipPeerProcess() as b:
        yield a, b


async def test_call_audio_both_ways_dtmf_and_caller_bye(
    pair: tuple[SipPeerProcess, SipPeerProcess], speech: tuple[bytes, bytes]
) -> None:
    a, b = pair
    caller_speech, callee_speech = speech
    assert a.port != b.port and b.sip_uri == f"sip:peer@127.0.0.1:{b.port}"
    await b.answer_incoming(200, speech=callee_speech)
    h = await a.place_call(b.sip_uri, speech=caller_speech, headers={"X-Tenant": "t-42"})
    assert h.answered and h.sip_code == 200 and h.direction == "out"
    assert h.setup_ms is not None and 0 < h.setup_ms < 1000
    inc = await b.next_incoming(EVENT_S)
    assert inc.headers["X-Tenant"] == "t-42"
    assert inc.handle.sip_call_id == h.sip_call_id and inc.handle.direction == "in"
    assert "peer@127.0.0.1" in inc.from_uri

    await a.send_dtmf(h, "12#*")
    assert await b.wait_dtmf(inc.handle, 4, EVENT_S) == "12#*"
    assert a.received_dtmf(h) == ""

    await asyncio.sleep(2.5)
    live = await a.rtp_stats(h)
    assert live is not None and live.rx_packets > 50
    await a.hang_up(h)
    end_a = await a.wait_ended(h, EVENT_S)
    end_b = await b.wait_ended(inc.handle, EVENT_S)
    assert end_a.by == "local" and end_b.by == "remote"
    assert end_a.connected_s > 2.0

    # What each side heard is what the other sent (and not its own speech).
    heard_b, sent_a = await b.received_audio(inc.handle), await a.sent_audio(h)
    heard_a, sent_b = await a.received_audio(h), await b.sent_audio(inc.handle)
    assert len(sent_a) > 2 * BPS and len(heard_b) > 2 * BPS
    # Per-segment medians (analyse_echo): a jitter buffer may shift the lag by a frame mid-call.
    assert (analyse_echo(sent_a, heard_b)[1] or 0.0) > MIN_MATCH
    assert (analyse_echo(sent_b, heard_a)[1] or 0.0) > MIN_MATCH
    assert best_lag_correlation(sent_b, heard_b)[0] < MAX_MISMATCH

    stats = await b.rtp_stats(inc.handle)
    assert stats is not None and stats.rx_packets > 100 and stats.loss_fraction == 0.0
    assert stats.tx_packets > 100


async def test_callee_hangs_up(pair: tuple[SipPeerProcess, SipPeerProcess]) -> None:
    a, b = pair
    await b.answer_incoming(200)
    h = await a.place_call(b.sip_uri)
    inc = await b.next_incoming(EVENT_S)
    await b.hang_up(inc.handle)
    assert (await a.wait_ended(h, EVENT_S)).by == "remote"
    assert (await b.wait_ended(inc.handle, EVENT_S)).by == "local"
    await b.hang_up(inc.handle)  # hanging up an ended call does nothing


async def test_busy_callee_486_is_seen_by_caller(
    pair: tuple[SipPeerProcess, SipPeerProcess],
) -> None:
    a, b = pair
    await b.answer_incoming(486)
    h = await a.place_call(b.sip_uri)
    assert not h.answered and h.sip_code == 486 and h.setup_ms is None
    end = await a.wait_ended(h, EVENT_S)
    assert end.by == "remote" and end.sip_code == 486
    inc = await b.next_incoming(EVENT_S)
    assert inc.handle.sip_code == 486 and not inc.handle.answered
    assert await a.rtp_stats(h) is None


async def test_delayed_answer_counts_in_setup_time(
    pair: tuple[SipPeerProcess, SipPeerProcess],
) -> None:
    a, b = pair
    await b.answer_incoming(200, after_ms=300)
    h = await a.place_call(b.sip_uri)
    assert h.answered and h.setup_ms is not None and h.setup_ms >= 300


async def test_ringing_forever_times_out_and_cancels(
    pair: tuple[SipPeerProcess, SipPeerProcess],
) -> None:
    a, b = pair  # b never got an answer mode: it rings
    with pytest.raises(TimeoutError):
        await a.place_call(b.sip_uri, answer_timeout_s=0.5)
    inc = await b.next_incoming(EVENT_S)
    assert inc.handle.sip_code == 180
    assert (await b.wait_ended(inc.handle, EVENT_S)).by == "remote"


async def test_echo_mode_plays_back_what_it_hears(
    pair: tuple[SipPeerProcess, SipPeerProcess], speech: tuple[bytes, bytes]
) -> None:
    a, b = pair
    await b.answer_incoming(200, echo=True)
    h = await a.place_call(b.sip_uri, speech=speech[0], loop=False)
    await asyncio.sleep(2.0)
    await a.hang_up(h)
    await a.wait_ended(h, EVENT_S)
    back, corr, lag_ms = analyse_echo(await a.sent_audio(h), await a.received_audio(h))
    assert back and corr is not None and corr > MIN_MATCH
    assert lag_ms is not None and 0 < lag_ms < 300  # a reflector on loopback: ~70-90 ms


async def test_fifth_call_in_one_process_is_refused(
    pair: tuple[SipPeerProcess, SipPeerProcess],
) -> None:
    a, b = pair
    async with SipPeerProcess() as c:
        await b.answer_incoming(200)
        await c.answer_incoming(200)
        handles = [
            await a.place_call((b if i % 2 else c).sip_uri) for i in range(MAX_CALLS_PER_PROCESS)
        ]
        assert all(h.answered for h in handles)
        with pytest.raises(SipPeerError, match="holds 4 calls"):
            await a.place_call(b.sip_uri)
        await a.hang_up(handles[0])
        await a.wait_ended(handles[0], EVENT_S)
        assert (await a.place_call(b.sip_uri)).answered  # a slot is free again


async def test_bad_input_is_refused(
    pair: tuple[SipPeerProcess, SipPeerProcess],
) -> None:
    a, b = pair
    with pytest.raises(ValueError, match="even"):
        await a.place_call(b.sip_uri, speech=b"\x00\x01\x02")
    with pytest.raises(ValueError, match="answer code"):
        await b.answer_incoming(100)
    with pytest.raises(ValueError, match="echo"):
        await b.answer_incoming(200, echo=True, speech=b"\x00\x00")
    with pytest.raises(SipPeerError, match=r"pjsua2: .*[Ii]nvalid"):
        await a.place_call("not a uri")
    with pytest.raises(TimeoutError):
        await b.next_incoming(0.1)
    await b.answer_incoming(200)
    h = await a.place_call(b.sip_uri)
    with pytest.raises(ValueError, match="DTMF"):
        await a.send_dtmf(h, "12x")
    with pytest.raises(SipPeerError, match="another peer"):
        await b.hang_up(h)


def test_parse_headers_folds_and_joins_repeats() -> None:
    msg = (
        "INVITE sip:x@y SIP/2.0\r\nVia: a\r\nVia: b\r\nSubject: long\r\n  line\r\n"
        "X-Empty:\r\nbroken line\r\n\r\nv=0\r\nX-Body: no\r\n"
    )
    assert _parse_headers(msg) == {"Via": "a, b", "Subject": "long line", "X-Empty": ""}
