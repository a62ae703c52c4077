"""A node that cannot carry one more call refuses it before anything is dialled, keeps the
calls it took clean, and still stops on SIGTERM.

The measured rules' decisions are driven in virtual time in ``test_overload_guard.py``;
here the refusals go through the real admission path of a real gateway: the fixed cap
(``RUTSTER_MAX_CALLS``) on a ``rutster serve`` process, and a guard that measured its loop
saturated on an app in this process.
"""

from __future__ import annotations

import asyncio
import math
import secrets
import signal
import time

import httpx

from rutster.brains.echo import EchoBrain
from rutster.gateway.overload_guard import REASON_NODE_FULL, REASON_NODE_OVERLOADED
from rutster.tools.launcher import LOOPBACK, Service, echo_brain_process, gateway_process
from rutster.tools.twilio_simulator import SimulatedCallResult, TwilioSimulator, new_sid
from tests.conftest import (
    TEST_AUTH_TOKEN,
    eventually,
    gateway_config,
    serve_gateway,
    tenant_key,
    unique_prefix,
)
from tests.echo_checks import assert_echo_intact
from tests.realtime_echo import realtime_echo
from tests.support.cluster import TENANT, cluster_env
from tests.support.fake_twilio_rest import FakeTwilioRest
from tests.support.overload import overload, relieve

#: The node's fixed cap in the process test, and the calls offered at once (twice it).
CAP = 2
OFFERED = 2 * CAP
#: The drain deadline (RUTSTER_DRAIN_TIMEOUT_S) and what ending the calls may add.
DRAIN_S = 3.0
STOP_MARGIN_S = 4.0
#: How long the process may take to exit once its calls ended (as in test_cluster_drain).
EXIT_WAIT_S = 15.0


def metric_value(text: str, name: str, **labels: str) -> float:
    """One sample of a Prometheus text exposition (0 when absent)."""
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        key, _, value = line.rpartition(" ")
        if key == (f"{name}{{{wanted}}}" if labels else name):
            return float(value)
    return 0.0


@realtime_echo
async def test_a_full_node_refuses_the_excess_before_dialling_and_carries_what_it_took(
    speech_pcm: bytes,
) -> None:
    token = secrets.token_urlsafe(16)
    sent = speech_pcm[: 6 * 8000 * 2]
    # The brain in a process of its own: this process runs the four callers, whose
    # pacing the echo judgement relies on.
    with echo_brain_process() as brain:
        env = cluster_env(
            unique_prefix(),
            token,
            f"ws://{LOOPBACK}:{brain.port}/echo",
            RUTSTER_MAX_CALLS=str(CAP),
            RUTSTER_DRAIN_TIMEOUT_S=str(DRAIN_S),
        )
        with gateway_process(env) as node:
            await overload_then_stop(node, token, sent, speech_pcm)


async def brains_dialled(url: str) -> float:
    """The brain connections the gateway has opened (its own counter)."""
    async with httpx.AsyncClient(base_url=url, timeout=5) as http:
        return metric_value((await http.get("/metrics")).text, "rutster_tap_connects_total")


async def overload_then_stop(node: Service, token: str, sent: bytes, speech_pcm: bytes) -> None:
    """Offer ``node`` twice its cap at once and check what it took and refused; fill it
    again and SIGTERM it."""
    url = f"http://{LOOPBACK}:{node.port}"
    offered = await asyncio.gather(
        *(
            TwilioSimulator(url, auth_token=token).place_call(sent, tail_s=1.0)
            for _ in range(OFFERED)
        ),
        return_exceptions=True,
    )
    carried = [r for r in offered if isinstance(r, SimulatedCallResult)]
    refused = [r for r in offered if not isinstance(r, SimulatedCallResult)]
    # Refused at the webhook (<Reject>, no <Connect><Stream>), before any brain.
    assert len(carried) == CAP and len(refused) == OFFERED - CAP, offered
    assert all("<Connect>" in str(r) for r in refused), refused
    assert await brains_dialled(url) == CAP
    for result in carried:
        assert_echo_intact(sent, result)
    async with httpx.AsyncClient(base_url=url, timeout=5) as http:
        exposition = (await http.get("/metrics")).text
    assert metric_value(
        exposition, "rutster_admissions_total", outcome="refused", reason=REASON_NODE_FULL
    ) == float(OFFERED - CAP)

    # Full again, then SIGTERM: it still refuses, and it stops by its deadline.
    calls = [
        asyncio.create_task(TwilioSimulator(url, auth_token=token).place_call(speech_pcm))
        for _ in range(CAP)
    ]
    try:
        for _ in range(100):  # both calls at their brain, within 10 s
            if await brains_dialled(url) >= 2 * CAP:
                break
            await asyncio.sleep(0.1)
        assert await brains_dialled(url) == 2 * CAP
        webhook = await TwilioSimulator(url, auth_token=token).post_voice_webhook(
            new_sid("CA"), from_="+15550001234", to="+15559990000"
        )
        assert "<Reject" in webhook.text
        node.proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        ended = await asyncio.wait_for(asyncio.gather(*calls), DRAIN_S + STOP_MARGIN_S)
        assert all(r.media_received > 0 for r in ended)
        assert time.monotonic() - signalled <= DRAIN_S + STOP_MARGIN_S
        assert await asyncio.to_thread(node.proc.wait, EXIT_WAIT_S) == 0
    finally:
        for call in calls:
            call.cancel()


async def test_an_overloaded_node_refuses_webhooks_and_placed_calls_before_dialling(
    echo_brain: EchoBrain,
) -> None:
    account = "AC" + "5e" * 16
    async with FakeTwilioRest(account_sid=account, auth_token=TEST_AUTH_TOKEN) as fake:
        config = gateway_config(
            echo_brain.url, twilio_account_sid=account, twilio_api_base_url=fake.base_url
        )
        async with (
            serve_gateway(config) as gw,
            httpx.AsyncClient(base_url=gw.url, timeout=10) as api,
        ):
            auth = {"Authorization": f"Bearer {await tenant_key(api, TENANT)}"}
            overload(gw.state)
            try:
                placed = await api.post(
                    "/v1/calls",
                    json={"to": "+15550004444", "from": "+15550003333", "provider": "twilio"},
                    headers=auth,
                )
                webhook = await TwilioSimulator(
                    gw.url, auth_token=TEST_AUTH_TOKEN
                ).post_voice_webhook(new_sid("CA"), from_="+15550001234", to="+15559990000")
            finally:
                relieve(gw.state)
            assert placed.status_code == 503, placed.text
            assert placed.headers["retry-after"]
            assert REASON_NODE_OVERLOADED in placed.json()["error"]["message"]
            assert "<Reject" in webhook.text
            refused_reason = REASON_NODE_OVERLOADED
            refused = gw.metric(
                "rutster_admissions_total", outcome="refused", reason=refused_reason
            )
            assert refused == 2
            assert fake.calls == {}  # nothing was dialled
            assert echo_brain.connections == 0
            # On the dashboard's recent refusals, with the tenant and the reason.
            store = gw.state.spend_store
            assert store is not None
            await eventually(lambda: not gw.state.background, 5)
            noted = [r for r in await store.recent_refusals(10) if r["reason"] == refused_reason]
            assert len(noted) == 2 and {r["tenant"] for r in noted} == {TENANT}
            assert {r["caller"] for r in noted} == {"+15550003333", "+15550001234"}
            # Its health stays ok: it carries its calls; it only takes no more.
            assert (await api.get("/healthz")).status_code == 200


async def test_the_running_app_measures_its_own_loop(echo_brain: EchoBrain) -> None:
    async with (
        serve_gateway(gateway_config(echo_brain.url)) as gw,
        httpx.AsyncClient(base_url=gw.url, timeout=10) as http,
    ):
        deadline = time.monotonic() + 10
        busy = math.nan
        while math.isnan(busy) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            exposition = (await http.get("/metrics")).text
            busy = metric_value(exposition, "rutster_loop_busy_ratio")
        assert 0.0 <= busy <= 1.0, busy
        assert metric_value(exposition, "rutster_loop_lag_seconds") >= 0.0
        # No calls: too few to estimate what one costs.
        assert math.isnan(metric_value(exposition, "rutster_capacity_estimate_calls"))
