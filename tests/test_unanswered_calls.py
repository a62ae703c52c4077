"""Unanswered outbound calls are free, however long the provider takes to say so.

A call placed through ``POST /v1/calls`` is admitted with a reservation and a 30 s
lease before anything is billed. The gateway's reaper used to settle it at its full
reservation (``lease_expired``) when it was still ringing ~31-34 s later, so a late
``no-answer`` callback changed nothing. Here every call rings 35 s, past that lease
and several reaper rounds, before the FAKE Twilio REST server reports how it ended
(signed status callbacks to the real gateway, default spend settings):

- ``no-answer``, ``busy`` and ``failed`` settle 0 with that reason;
- a call the tenant cancels with ``DELETE /v1/calls/{id}`` after 35 s settles 0
  (``canceled``);
- a call answered after 35 s settles what it used: the telephony of its answered
  time at the published outbound rate, not its reservation;
- no call is reaped (no ``lease_expired``, no ledger ``reap``), and the tenant's day
  holds no reservation afterwards.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

import httpx

from rutster.brains.echo import EchoBrain
from rutster.spend.money import parse_money
from rutster.tools.twilio_simulator import SimulatedCallee
from tests.conftest import (
    TEST_AUTH_TOKEN,
    eventually,
    gateway_config,
    serve_gateway,
    tenant_key,
)
from tests.support.fake_twilio_rest import CalleeOutcome, FakeTwilioRest

ACCOUNT_SID = "AC" + "3c" * 16
CALLER_ID = "+15550003333"
#: Longer than the spend store's 30 s lease (spend/store.py ``DEFAULT_LEASE_MS``) plus a
#: reaper round (spend/gate.py ``MAINTENANCE_S``, 5 s): the issue's 35 s from placement
#: to the provider's final status.
RING_S = 35.0
#: Of those, seconds queued at the provider before ringing (Twilio's per-account
#: calls-per-second queue, which its ring ``Timeout`` does not count).
QUEUE_S = 10.0
#: Seconds of callee speech on the answered call (then the simulated callee hangs up).
ANSWERED_SPEECH_S = 3.0
NO_ANSWER, BUSY, FAILED, CANCELED, ANSWERED = (f"+1555000400{i}" for i in range(5))


def _ms(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1000


async def test_calls_that_ring_past_the_lease_settle_what_the_provider_bills(
    echo_brain: EchoBrain, speech_pcm: bytes
) -> None:
    callee = SimulatedCallee(
        speech_pcm[: int(ANSWERED_SPEECH_S * 8000) * 2], auth_token=TEST_AUTH_TOKEN, tail_s=1
    )
    async with FakeTwilioRest(account_sid=ACCOUNT_SID, auth_token=TEST_AUTH_TOKEN) as fake:
        fake.on_answer = callee
        # Queued, then ringing up to the gateway's 30 s Timeout: the outcome lands at 35 s.
        ring = {"queue_s": QUEUE_S, "ring_s": RING_S - QUEUE_S}
        fake.set_callee(NO_ANSWER, CalleeOutcome.NO_ANSWER, **ring)
        fake.set_callee(BUSY, CalleeOutcome.BUSY, **ring)
        fake.set_callee(FAILED, CalleeOutcome.FAILED, **ring)
        fake.set_callee(CANCELED, CalleeOutcome.NO_ANSWER, queue_s=2 * RING_S)
        fake.set_callee(ANSWERED, CalleeOutcome.ANSWER, **ring)
        config = gateway_config(
            echo_brain.url, twilio_account_sid=ACCOUNT_SID, twilio_api_base_url=fake.base_url
        )
        async with (
            serve_gateway(config) as gw,
            httpx.AsyncClient(base_url=gw.url, timeout=10) as client,
        ):
            auth = {"Authorization": f"Bearer {await tenant_key(client, 'ringers')}"}
            placed: dict[str, dict[str, Any]] = {}
            for to in (NO_ANSWER, BUSY, FAILED, CANCELED, ANSWERED):
                body = {"to": to, "from": CALLER_ID, "provider": "twilio"}
                answer = await client.post("/v1/calls", json=body, headers=auth)
                assert answer.status_code == 201, answer.text
                placed[to] = answer.json()
                assert parse_money(placed[to]["spend"]["reserved"]) > 0

            await asyncio.sleep(RING_S)
            deleted = await client.delete(f"/v1/calls/{placed[CANCELED]['id']}", headers=auth)
            assert deleted.status_code == 202, deleted.text

            async def final(to: str) -> dict[str, Any]:
                url = f"/v1/calls/{placed[to]['id']}"
                body: dict[str, Any] = {}

                def settled() -> bool:
                    return body.get("spend", {}).get("settled") is not None

                async def poll() -> None:
                    while not settled():
                        body.update((await client.get(url, headers=auth)).json())
                        await asyncio.sleep(0.25)

                await asyncio.wait_for(poll(), timeout=30)
                return body

            for to, reason in (
                (NO_ANSWER, "no_answer"),
                (BUSY, "busy"),
                (FAILED, "failed"),
                (CANCELED, "canceled"),
            ):
                call = await final(to)
                assert (call["end_reason"], call["spend"]["settled"]) == (reason, "0.000000"), (
                    to,
                    call,
                )
                assert call["status"] == "failed" and call["answered_at"] is None

            answered = await final(ANSWERED)
            assert answered["end_reason"] not in ("lease_expired", "no_answer"), answered
            assert answered["answered_at"] is not None
            talk_ms = _ms(answered["ended_at"]) - _ms(answered["answered_at"])
            assert 0 < talk_ms < 60_000, answered  # one outbound billing minute
            rate = config.spend.prices.telephony_rate("twilio", "outbound")
            settled = parse_money(answered["spend"]["settled"])
            assert settled == rate.cost(round(talk_ms)), answered
            assert settled < parse_money(answered["spend"]["reserved"])

            store = gw.state.spend_store
            assert store is not None
            ledger = await store.ledger(1_000)
            assert not [e for e in ledger if e["type"] == "reap"], ledger
            spend = (await client.get("/v1/spend", headers=auth)).json()
            assert spend["today"]["reserved"] == "0.000000", spend
            assert parse_money(spend["today"]["spent"]) == settled
            await eventually(lambda: not gw.state.media_watchers, timeout_s=5)
