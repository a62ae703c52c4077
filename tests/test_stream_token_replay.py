"""One stream token admits exactly one media socket, once, within its lifetime, on any node.

Found: a replayed token turned one admitted webhook into three live calls, each
dialling the brain. Here a gateway (or two, sharing one Redis) under real
uvicorn gets the replays: same node, another node, a race between two nodes, an
expired token, a token whose call was already settled, and the SIP workers'
``/sip/stream``. The first call must keep flowing through all of it. The
:class:`StreamClaims` unit tests cover the Redis claim itself and its node-local
fallback when Redis is unreachable.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import replace
from pathlib import Path
from tempfile import mkdtemp

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from rutster.base.stream_token import STREAM_TOKEN_LIFETIME_S, StreamTokenSigner
from rutster.base.ws_close import CLOSE_POLICY_VIOLATION
from rutster.brains.echo import EchoBrain
from rutster.gateway.config import GatewayConfig
from rutster.gateway.media_session import REASON_CALL_ENDED
from rutster.gateway.media_socket import REASON_EXPIRED_TOKEN, REASON_TOKEN_REPLAYED
from rutster.gateway.spend_context import PARAM_SPEND, SpendContext
from rutster.gateway.stream_claims import (
    CLAIM_CLOCK_SKEW_MARGIN_MS,
    ClaimOutcome,
    StreamClaims,
)
from rutster.gateway.text_stream_leg import PARAM_TAP_URL
from rutster.protocols.tap import AudioIn
from rutster.spend.store import SpendStore, redis_client
from rutster.tools.launcher import LOOPBACK, free_port
from rutster.tools.twilio_simulator import (
    StreamInstructions,
    TwilioSimulator,
    connected_message,
    new_sid,
    start_message,
)
from rutster.trunk.sip.wire import Admit, Hello, InviteRequest, WorkerMediaCodec, encode_control
from rutster.trunk.sip.wire import parse_control as parse_sip_control
from rutster.trunk.twilio.codec import PARAM_TOKEN
from tests.conftest import (
    RunningGateway,
    eventually,
    gateway_config,
    serve_gateway,
    spend_settings,
    suite_redis_url,
    unique_prefix,
)
from tests.support.recording_brain import RecordingBrain
from tests.test_gateway_calls import received_media, send_speech, simulator

CALLER = "+15550001111"
NUMBER = "+15550002222"
#: ``RUTSTER_SIP_SECRET`` of the SIP test gateway (any string of >= 16 bytes).
SIP_SECRET = "replay-test-sip-secret-0123456789"
#: 20 ms of 16 kHz L16 (the SIP media contract's audio), a quiet tone the echo returns.
SIP_FRAME = (b"\x00\x10\x00\xf0" * 160)[:640]


async def close_of(ws: ClientConnection) -> tuple[int | None, str | None]:
    """Read until the gateway closes ``ws``; its close code and reason."""
    with pytest.raises(ConnectionClosed):
        while True:
            await asyncio.wait_for(ws.recv(), 10)
    return ws.close_code, ws.close_reason


async def open_media(
    sim: TwilioSimulator,
    instructions: StreamInstructions,
    call_sid: str,
    parameters: dict[str, str] | None = None,
) -> tuple[ClientConnection, str]:
    """Open a media socket as Twilio does and send ``connected`` + ``start`` with
    ``parameters`` (default: the TwiML's); the socket and its streamSid."""
    ws = await sim.connect_media(instructions)
    stream_sid = new_sid("MZ")
    await ws.send(connected_message())
    params = instructions.parameters if parameters is None else parameters
    await ws.send(start_message(stream_sid, call_sid, sim.account_sid, params))
    return ws, stream_sid


async def binary_frames(ws: ClientConnection, seconds: float) -> int:
    """Count binary (audio) frames arriving on a SIP media socket within ``seconds``."""
    count = 0
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    with contextlib.suppress(TimeoutError):
        while (left := deadline - loop.time()) > 0:
            if isinstance(await asyncio.wait_for(ws.recv(), left), bytes):
                count += 1
    return count


async def live_call_id(gateway: RunningGateway) -> str:
    """The public id of the gateway's one live call, once its brain is connected."""
    await eventually(lambda: len(gateway.state.calls) == 1)
    call = next(iter(gateway.state.calls.values()))
    await eventually(lambda: call.tap.connected)
    assert call.call_id is not None
    return call.call_id


async def record_status(gateway: RunningGateway, call_id: str) -> str:
    store = gateway.state.spend_store
    assert store is not None
    record = await store.get_call(call_id)
    assert record is not None
    return record["status"]


async def eventually_status(
    gateway: RunningGateway, call_id: str, status: str, timeout_s: float = 5.0
) -> None:
    """Wait until the call record's status is ``status`` (it is written after the start)."""
    deadline = time.monotonic() + timeout_s
    while (current := await record_status(gateway, call_id)) != status:
        if time.monotonic() > deadline:
            raise AssertionError(f"call {call_id} is {current}, not {status}")
        await asyncio.sleep(0.02)


async def test_replay_on_the_same_node_is_refused_and_the_first_call_keeps_flowing(
    gateway: RunningGateway, echo_brain: EchoBrain, speech_pcm: bytes
) -> None:
    sim = simulator(gateway)
    call_sid = new_sid("CA")
    instructions = await sim.open_stream(call_sid, from_=CALLER, to=NUMBER)
    first, stream_sid = await open_media(sim, instructions, call_sid)
    call_id = await live_call_id(gateway)
    call = gateway.state.calls_by_id[call_id]

    for attempt in (1, 2):  # the finding: one webhook, three sockets
        replay, _ = await open_media(sim, instructions, call_sid)
        assert await close_of(replay) == (CLOSE_POLICY_VIOLATION, REASON_TOKEN_REPLAYED)
        assert gateway.metric("rutster_stream_token_replays_total") == attempt

    # The first call was not touched: still the one call, its brain, its audio.
    assert list(gateway.state.calls.values()) == [call] and not call.ended.is_set()
    assert echo_brain.connections == 1
    assert gateway.metric("rutster_calls_total") == 1
    assert gateway.metric("rutster_admissions_total", outcome="admitted", reason="ok") == 1
    assert gateway.metric("rutster_stream_token_failures_total") == 0
    await send_speech(first, stream_sid, speech_pcm[: 8000 * 2])
    assert await received_media(first, 1.0) > 20
    await eventually_status(gateway, call_id, "active")

    # Once the call is over its token is still spent.
    await first.close()
    await eventually(lambda: not gateway.state.calls)
    late, _ = await open_media(sim, instructions, call_sid)
    assert await close_of(late) == (CLOSE_POLICY_VIOLATION, REASON_TOKEN_REPLAYED)
    assert gateway.metric("rutster_stream_token_replays_total") == 3
    assert echo_brain.connections == 1
    await eventually_status(gateway, call_id, "ended")


def two_node_configs(brain_url: str) -> tuple[GatewayConfig, GatewayConfig]:
    """Two gateway configs on ONE Redis and key prefix, as two nodes of one deployment."""
    shared = spend_settings()
    a = gateway_config(brain_url, spend=replace(shared, node_id="node-a"))
    b = gateway_config(
        brain_url,
        spend=replace(shared, node_id="node-b", data_dir=Path(mkdtemp(prefix="rutster-b-"))),
    )
    return a, b


async def test_replay_to_another_node_on_the_same_redis_is_refused(
    echo_brain: EchoBrain, speech_pcm: bytes
) -> None:
    config_a, config_b = two_node_configs(echo_brain.url)
    async with serve_gateway(config_a) as a, serve_gateway(config_b) as b:
        sim = simulator(a)
        call_sid = new_sid("CA")
        instructions = await sim.open_stream(call_sid, from_=CALLER, to=NUMBER)
        first, stream_sid = await open_media(sim, instructions, call_sid)
        call_id = await live_call_id(a)

        # The same start, to the other node's stream URL (Twilio-signed for it).
        to_b = StreamInstructions(b.config.twilio_stream_url, instructions.parameters)
        replay, _ = await open_media(simulator(b), to_b, call_sid)
        assert await close_of(replay) == (CLOSE_POLICY_VIOLATION, REASON_TOKEN_REPLAYED)
        assert b.metric("rutster_stream_token_replays_total") == 1
        assert not b.state.calls and b.metric("rutster_calls_total") == 0
        assert echo_brain.connections == 1

        store = a.state.spend_store
        assert store is not None
        claim = await store.redis.get(StreamClaims.key(store.keys.prefix, call_id))
        assert claim == "node-a"
        await send_speech(first, stream_sid, speech_pcm[: 8000 * 2])
        assert await received_media(first, 1.0) > 20
        assert not a.state.calls_by_id[call_id].ended.is_set()
        await first.close()


async def test_a_started_call_is_not_restarted_even_without_its_claim(
    echo_brain: EchoBrain,
) -> None:
    # As if node A had claimed only locally (Redis away for that one SET): node B finds
    # no claim, but the call record says its media already started.
    config_a, config_b = two_node_configs(echo_brain.url)
    async with serve_gateway(config_a) as a, serve_gateway(config_b) as b:
        sim = simulator(a)
        call_sid = new_sid("CA")
        instructions = await sim.open_stream(call_sid, from_=CALLER, to=NUMBER)
        first, _ = await open_media(sim, instructions, call_sid)
        call_id = await live_call_id(a)
        await eventually_status(a, call_id, "active")
        store = a.state.spend_store
        assert store is not None
        assert await store.redis.delete(StreamClaims.key(store.keys.prefix, call_id)) == 1

        to_b = StreamInstructions(b.config.twilio_stream_url, instructions.parameters)
        replay, _ = await open_media(simulator(b), to_b, call_sid)
        assert await close_of(replay) == (CLOSE_POLICY_VIOLATION, REASON_TOKEN_REPLAYED)
        assert b.metric("rutster_stream_token_replays_total") == 1
        assert not b.state.calls and echo_brain.connections == 1
        assert not a.state.calls_by_id[call_id].ended.is_set()
        await first.close()


async def test_two_nodes_racing_for_one_token_start_exactly_one_call(
    echo_brain: EchoBrain,
) -> None:
    config_a, config_b = two_node_configs(echo_brain.url)
    async with serve_gateway(config_a) as a, serve_gateway(config_b) as b:
        sim = simulator(a)
        call_sid = new_sid("CA")
        instructions = await sim.open_stream(call_sid, from_=CALLER, to=NUMBER)
        to_b = StreamInstructions(b.config.twilio_stream_url, instructions.parameters)
        sockets = await asyncio.gather(
            open_media(sim, instructions, call_sid), open_media(simulator(b), to_b, call_sid)
        )
        await eventually(
            lambda: (
                len(a.state.calls) + len(b.state.calls) == 1
                and a.metric("rutster_stream_token_replays_total")
                + b.metric("rutster_stream_token_replays_total")
                == 1
            )
        )
        winner, loser = (0, 1) if a.state.calls else (1, 0)
        assert await close_of(sockets[loser][0]) == (CLOSE_POLICY_VIOLATION, REASON_TOKEN_REPLAYED)
        await eventually(lambda: echo_brain.connections == 1)
        await sockets[winner][0].close()


async def test_expired_token_is_refused(gateway: RunningGateway, echo_brain: EchoBrain) -> None:
    sim = simulator(gateway)
    call_sid = new_sid("CA")
    before = time.time()
    instructions = await sim.open_stream(call_sid, from_=CALLER, to=NUMBER)
    params = instructions.parameters
    # The webhook's token expires one lifetime after it was issued.
    expires_at = int(params[PARAM_TOKEN].partition(".")[0])
    assert int(before) + STREAM_TOKEN_LIFETIME_S <= expires_at <= time.time() + 60

    # The same token as the gateway would have issued a lifetime (and a second) ago.
    stale = StreamTokenSigner(gateway.config.stream_secret).issue(
        call_sid,
        params[PARAM_TAP_URL],
        params[PARAM_SPEND],
        now_s=time.time() - STREAM_TOKEN_LIFETIME_S - 1,
    )
    ws, _ = await open_media(sim, instructions, call_sid, dict(params, **{PARAM_TOKEN: stale}))
    assert await close_of(ws) == (CLOSE_POLICY_VIOLATION, REASON_EXPIRED_TOKEN)
    assert gateway.metric("rutster_stream_token_failures_total") == 1
    assert gateway.metric("rutster_stream_token_replays_total") == 0
    assert echo_brain.connections == 0 and not gateway.state.calls

    # The refusal claimed nothing: the call's own, fresh token still starts it.
    fresh, _ = await open_media(sim, instructions, call_sid)
    await live_call_id(gateway)
    assert echo_brain.connections == 1
    await fresh.close()


async def test_token_of_a_settled_call_does_not_resurrect_it(
    gateway: RunningGateway, echo_brain: EchoBrain
) -> None:
    sim = simulator(gateway)
    call_sid = new_sid("CA")
    instructions = await sim.open_stream(call_sid, from_=CALLER, to=NUMBER)
    call_id = SpendContext.decode(instructions.parameters[PARAM_SPEND]).call_id
    # Released before its stream came, as the media-connect watcher or a status
    # callback does; its token is unexpired and was never used.
    gate = gateway.state.spend_gate
    assert gate is not None
    await gate.settle_unanswered(call_id, "no_media")
    assert await record_status(gateway, call_id) == "ended"

    ws, _ = await open_media(sim, instructions, call_sid)
    assert await close_of(ws) == (CLOSE_POLICY_VIOLATION, REASON_CALL_ENDED)
    assert gateway.metric("rutster_stream_token_failures_total") == 1
    assert echo_brain.connections == 0 and not gateway.state.calls
    store = gateway.state.spend_store
    assert store is not None
    record = await store.get_call(call_id)
    assert record is not None
    assert (record["status"], record["spent"], record["answered_ms"]) == ("ended", 0, None)


async def test_sip_stream_token_is_used_once() -> None:
    async with RecordingBrain() as brain:
        config = gateway_config(brain.url, barge_in=False, sip_secret=SIP_SECRET)
        async with serve_gateway(config) as gateway:
            base = gateway.url.replace("http://", "ws://")
            bearer = {"Authorization": f"Bearer {SIP_SECRET}"}
            async with connect(f"{base}/sip/workers", additional_headers=bearer) as control:
                await control.send(encode_control(Hello("w1", f"sip:w1@{LOOPBACK}:5060", 4)))
                invite = InviteRequest(
                    "ref1",
                    "sip-call-1",
                    f"sip:{CALLER}@x",
                    f"sip:{NUMBER}@y",
                    "1.2.3.4:5060",
                    "udp",
                )
                await control.send(encode_control(invite))
                admit = parse_sip_control(str(await asyncio.wait_for(control.recv(), 10)))
                assert isinstance(admit, Admit)
                start = WorkerMediaCodec().start(
                    admit.call_id,
                    "sip-call-1",
                    "in",
                    CALLER,
                    NUMBER,
                    admit.tap_url,
                    admit.spend,
                    admit.token,
                )
                first = await connect(f"{base}/sip/stream", additional_headers=bearer)
                await first.send(start)
                assert await live_call_id(gateway) == admit.call_id

                replay = await connect(f"{base}/sip/stream", additional_headers=bearer)
                await replay.send(start)
                assert await close_of(replay) == (CLOSE_POLICY_VIOLATION, REASON_TOKEN_REPLAYED)
                assert gateway.metric("rutster_stream_token_replays_total") == 1
                assert len(gateway.state.calls) == 1

                # The first leg still carries audio both ways.
                heard_before = len(brain.of_type(AudioIn))
                for _ in range(50):
                    await first.send(SIP_FRAME)
                    await asyncio.sleep(0.02)
                await eventually(lambda: len(brain.of_type(AudioIn)) >= heard_before + 40)
                assert await binary_frames(first, 1.5) > 20
                await first.close()


# ---- StreamClaims ------------------------------------------------------------------------


def _store(url: str) -> SpendStore:
    return SpendStore(redis_client(url), unique_prefix())


async def test_a_claim_is_one_atomic_redis_key_that_outlives_the_token() -> None:
    store = _store(suite_redis_url())
    try:
        expires_at = int(time.time()) + STREAM_TOKEN_LIFETIME_S
        node_a, node_b = StreamClaims(), StreamClaims()
        results = await asyncio.gather(
            *(claims.claim(store, "call_ab12", name, expires_at)
              for claims, name in ((node_a, "a"), (node_b, "b")))
        )  # fmt: skip
        assert sorted(r.value for r in results) == ["already_used", "claimed"]
        key = StreamClaims.key(store.keys.prefix, "call_ab12")
        assert key == f"{store.keys.prefix}:stream_claim:call_ab12"
        assert await store.redis.get(key) in ("a", "b")
        ttl_ms = await store.redis.pttl(key)
        most = STREAM_TOKEN_LIFETIME_S * 1000 + CLAIM_CLOCK_SKEW_MARGIN_MS
        assert most - 2_000 < ttl_ms <= most
        for claims in (node_a, node_b):
            assert await claims.claim(store, "call_ab12", "x", expires_at) is (
                ClaimOutcome.ALREADY_USED
            )
        assert await node_a.claim(store, "call_cd34", "a", expires_at) is ClaimOutcome.CLAIMED
    finally:
        await store.redis.aclose()


async def test_without_redis_same_node_replays_are_still_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    down = _store(f"redis://{LOOPBACK}:{free_port()}")  # nothing listens there
    try:
        claims = StreamClaims()
        expires_at = int(time.time()) + STREAM_TOKEN_LIFETIME_S
        with caplog.at_level(logging.WARNING, "rutster.gateway.stream_claims"):
            racing = await asyncio.gather(
                claims.claim(down, "call_1", "a", expires_at),
                claims.claim(down, "call_1", "a", expires_at),
            )
        assert sorted(r.value for r in racing) == ["already_used", "claimed_locally"]
        assert "claimed on this node only" in caplog.text
        assert await claims.claim(down, "call_1", "a", expires_at) is ClaimOutcome.ALREADY_USED
        assert await claims.claim(down, "call_2", "a", expires_at) is (ClaimOutcome.CLAIMED_LOCALLY)
        # No store at all: the same node-local rule.
        assert await claims.claim(None, "call_3", "a", expires_at) is ClaimOutcome.CLAIMED_LOCALLY
        assert await claims.claim(None, "call_3", "a", expires_at) is ClaimOutcome.ALREADY_USED
    finally:
        await down.redis.aclose()


async def test_a_claim_redis_took_is_also_held_locally_if_redis_goes_away() -> None:
    up = _store(suite_redis_url())
    down = _store(f"redis://{LOOPBACK}:{free_port()}")
    try:
        claims = StreamClaims()
        expires_at = int(time.time()) + STREAM_TOKEN_LIFETIME_S
        assert await claims.claim(up, "call_9", "a", expires_at) is ClaimOutcome.CLAIMED
        assert await claims.claim(down, "call_9", "a", expires_at) is ClaimOutcome.ALREADY_USED
    finally:
        await up.redis.aclose()
        await down.redis.aclose()


async def test_local_claims_are_bounded_and_expire() -> None:
    now = [1000.0]
    wall = 1_700_000_000_000
    claims = StreamClaims(max_local=3, clock=lambda: now[0], wall_ms=lambda: wall)
    expires_at = wall // 1000 + 10  # 10 s left, + the skew margin
    for n in range(4):
        assert await claims.claim(None, f"call_{n}", "a", expires_at) is (
            ClaimOutcome.CLAIMED_LOCALLY
        )
    assert len(claims) == 3  # the oldest went first
    assert await claims.claim(None, "call_3", "a", expires_at) is ClaimOutcome.ALREADY_USED
    now[0] += 10 + CLAIM_CLOCK_SKEW_MARGIN_MS / 1000 + 0.001
    assert await claims.claim(None, "call_3", "a", expires_at) is ClaimOutcome.CLAIMED_LOCALLY
    assert len(claims) == 1  # the others were forgotten once their tokens had expired
    with pytest.raises(ValueError):
        StreamClaims(max_local=0)
