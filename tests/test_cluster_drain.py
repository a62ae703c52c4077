"""Draining a node: SIGTERM stops admissions there, its calls end with ``shutdown`` by the
deadline, and a second node sharing the Redis keeps its calls.

Two ``rutster serve`` processes (own ports, own node ids) on the suite's Redis, each
carrying a call of the echo brain. Node A gets SIGTERM with a 3 s drain deadline.
"""

from __future__ import annotations

import asyncio
import secrets
import signal
import time

import httpx

from rutster.brains.echo import EchoBrain
from rutster.spend.store import SpendStore, redis_client
from rutster.tools.launcher import LOOPBACK, Service, gateway_process
from rutster.tools.twilio_simulator import TwilioSimulator, new_sid
from tests.conftest import (
    TEST_AUTH_TOKEN,
    gateway_config,
    serve_gateway,
    suite_redis_url,
    tenant_key,
    unique_prefix,
)
from tests.echo_checks import assert_echo_intact
from tests.realtime_echo import realtime_echo
from tests.support.cluster import TENANT, cluster_env, record_when
from tests.support.fake_twilio_rest import FakeTwilioRest

#: Node A's drain deadline (RUTSTER_DRAIN_TIMEOUT_S).
DRAIN_S = 3.0
#: What ending the calls may add to it.
STOP_MARGIN_S = 4.0
#: How long the drained process may take to exit once its last call ended (closing its
#: clients, the interpreter's own shutdown): seconds on a 2-core machine running the rest
#: of the suite beside it; what matters here is that it exits, and with 0.
EXIT_WAIT_S = 15.0


def url(node: Service) -> str:
    return f"http://{LOOPBACK}:{node.port}"


@realtime_echo
async def test_sigterm_drains_one_node_and_the_other_keeps_its_calls(
    echo_brain: EchoBrain, speech_pcm: bytes
) -> None:
    prefix, token = unique_prefix(), secrets.token_urlsafe(16)
    env = cluster_env(prefix, token, echo_brain.url)
    client = redis_client(suite_redis_url())
    store = SpendStore(client, prefix)
    with (
        gateway_process(
            {**env, "RUTSTER_NODE_ID": "node-a", "RUTSTER_DRAIN_TIMEOUT_S": str(DRAIN_S)}
        ) as a,
        gateway_process({**env, "RUTSTER_NODE_ID": "node-b"}) as b,
    ):
        on_a, on_b = new_sid("CA"), new_sid("CA")
        b_sent = speech_pcm[: 10 * 8000 * 2]
        call_a = asyncio.create_task(
            TwilioSimulator(url(a), auth_token=token).place_call(speech_pcm, call_sid=on_a)
        )
        call_b = asyncio.create_task(
            TwilioSimulator(url(b), auth_token=token).place_call(b_sent, call_sid=on_b, tail_s=1.0)
        )
        try:
            await record_when(store, on_a, "active")
            await record_when(store, on_b, "active")
            a.proc.send_signal(signal.SIGTERM)
            stopped_at = time.monotonic()
            async with httpx.AsyncClient(base_url=url(a), timeout=5) as http:
                # Out of the balancer's rotation at once, and admitting nothing new.
                health = await http.get("/healthz")
                while health.status_code == 200:
                    health = await http.get("/healthz")
                assert (health.status_code, health.json()["status"]) == (503, "draining")
            refused = await TwilioSimulator(url(a), auth_token=token).post_voice_webhook(
                new_sid("CA"), from_="+15550001234", to="+15559990000"
            )
            assert refused.status_code == 200 and "<Reject" in refused.text
            # The live call on A runs on through the drain, then ends with shutdown.
            result_a = await asyncio.wait_for(call_a, DRAIN_S + STOP_MARGIN_S)
            ended_in = time.monotonic() - stopped_at
            assert DRAIN_S - 0.5 <= ended_in <= DRAIN_S + STOP_MARGIN_S
            assert result_a.media_received > 0
            exit_code = await asyncio.to_thread(a.proc.wait, EXIT_WAIT_S)
            assert exit_code == 0
            ended = await record_when(store, on_a, "ended")
            assert ended["end_reason"] == "shutdown" and (ended["spent"] or 0) > 0
            # Node B never noticed: its call runs to its end, echoed whole.
            result_b = await asyncio.wait_for(call_b, 20)
            assert_echo_intact(b_sent, result_b)
            assert (await record_when(store, on_b, "ended"))["end_reason"] == "caller_hangup"
        finally:
            call_a.cancel()
            call_b.cancel()
            await client.aclose()


async def test_a_draining_gateway_refuses_webhooks_and_placed_calls(echo_brain: EchoBrain) -> None:
    account = "AC" + "4d" * 16
    async with FakeTwilioRest(account_sid=account, auth_token=TEST_AUTH_TOKEN) as fake:
        config = gateway_config(
            echo_brain.url, twilio_account_sid=account, twilio_api_base_url=fake.base_url
        )
        async with (
            serve_gateway(config) as gw,
            httpx.AsyncClient(base_url=gw.url, timeout=10) as api,
        ):
            auth = {"Authorization": f"Bearer {await tenant_key(api, TENANT)}"}
            gw.state.draining = True
            placed = await api.post(
                "/v1/calls",
                json={"to": "+15550004444", "from": "+15550003333", "provider": "twilio"},
                headers=auth,
            )
            assert placed.status_code == 503, placed.text
            assert "draining" in placed.json()["error"]["message"]
            webhook = await TwilioSimulator(gw.url, auth_token=TEST_AUTH_TOKEN).post_voice_webhook(
                new_sid("CA"), from_="+15550001234", to="+15559990000"
            )
            assert "<Reject" in webhook.text
            assert gw.metric("rutster_admissions_total", outcome="refused", reason="draining") == 2
            assert fake.calls == {}  # nothing was dialled
            health = await api.get("/healthz")
            assert (health.status_code, health.json()["status"]) == (503, "draining")
