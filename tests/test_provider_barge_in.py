"""Barge-in on every text-stream provider's wire: the provider gets its own ``clear``.

tests/test_barge_in_e2e.py plays the reported call on Twilio; here the first two of
its interruptions are played on Telnyx (``clear``), Plivo (``clearAudio``,
answered by ``clearedAudio``) and Vonage (``clear``, answered by ``websocket:cleared``;
audio in binary L16 frames at 16 kHz), against the realtime brain (MOCK Realtime server):
each must reach the provider as its clear and be confirmed.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rutster.tools.launcher import LOOPBACK, free_port, realtime_brain_process
from rutster.tools.plivo_simulator import PlivoSimulator
from rutster.tools.realtime_mock_server import MockRealtimeServer
from rutster.tools.telnyx_simulator import TelnyxSimulator
from rutster.tools.twilio_simulator import BargeIn, BargeInCaller, TwilioSimulator
from rutster.tools.vonage_simulator import VonageSimulator
from tests.conftest import eventually, gateway_config, serve_gateway
from tests.support.fake_plivo_rest import FAKE_AUTH_TOKEN
from tests.test_barge_in_e2e import BARGE_INS, OPENING, REPLY_MS, utterance

TELNYX_SIGNER = TelnyxSimulator.new_signer()
VONAGE_SECRET = "vonage-signature-secret-for-barge-in"
#: Per provider: the gateway's environment, and its simulator for a gateway URL.
PROVIDERS: dict[str, tuple[dict[str, str], Callable[[str], TwilioSimulator]]] = {
    "telnyx": (
        {"TELNYX_PUBLIC_KEY": TELNYX_SIGNER.public_key_b64},
        lambda url: TelnyxSimulator(url, signer=TELNYX_SIGNER),
    ),
    "plivo": (
        {"PLIVO_AUTH_TOKEN": FAKE_AUTH_TOKEN},
        lambda url: PlivoSimulator(url, auth_token=FAKE_AUTH_TOKEN),
    ),
    "vonage": (
        {"VONAGE_SIGNATURE_SECRET": VONAGE_SECRET},
        lambda url: VonageSimulator(url, signature_secret=VONAGE_SECRET),
    ),
}


@pytest.mark.parametrize("provider", sorted(PROVIDERS))
async def test_a_caller_barging_in_gets_the_providers_clear(
    speech_pcm: bytes, provider: str
) -> None:
    env, simulator = PROVIDERS[provider]
    barge_ins = [
        BargeIn(after_ms, utterance(speech_pcm, start_s, seconds))
        for start_s, seconds, after_ms in BARGE_INS[:2]
    ]
    caller = BargeInCaller(utterance(speech_pcm, *OPENING), barge_ins)
    async with MockRealtimeServer(reply_ms=REPLY_MS) as mock:
        port = free_port()
        with realtime_brain_process(mock.websocket_base_url, port):
            config = gateway_config(f"ws://{LOOPBACK}:{port}/realtime", env=env)
            async with serve_gateway(config) as gateway:
                result = await simulator(gateway.url).place_reactive_call(caller, max_s=40.0)
                await eventually(lambda: not gateway.state.calls)
                (trail,) = gateway.state.recent_trails.values()
    assert len(result.clear_times_ms) >= 2, result.clear_times_ms
    assert len(trail.of_type("barge_in_confirmed")) == 2
