"""SIP legs end to end: a real pjsua2 phone <-> ``rutster sip-worker`` <-> gateway <-> brain.

Everything runs on loopback: the gateway under uvicorn in this process, the
worker and the phone (``SipPeerProcess``) each in their own process.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np
import pytest
from websockets.asyncio.server import ServerConnection

from rutster.gateway.transfer_allowlist import TransferAllowlist
from rutster.protocols.tap import (
    AudioIn,
    Dtmf,
    FunctionCall,
    FunctionCallOutput,
    Hello,
    SessionEnd,
    SessionEndReason,
    TapEncoder,
    ToolsUpdate,
)
from rutster.protocols.tool_catalog import HANGUP_TOOL
from rutster.tools.launcher import free_port
from rutster.tools.sip_load_generator import analyse_echo
from rutster.tools.sip_peer import SipPeerProcess
from tests.conftest import TEST_ADMIN_KEY, eventually
from tests.realtime_echo import check_sip_echo, realtime_echo
from tests.sip_stack import sip_stack, speech_16k
from tests.support.overload import overload, relieve
from tests.support.recording_brain import RecordingBrain, TransferBrain

SPEECH = Path(__file__).parent / "fixtures" / "audio" / "caller_speech_8k.wav"
ADMIN = {"Authorization": f"Bearer {TEST_ADMIN_KEY}"}


class SipBrain(RecordingBrain):
    """Echoes audio, offers the hang-up tool, and hangs up when the caller presses 9."""

    async def respond(self, ws: ServerConnection, encoder: TapEncoder, event: object) -> None:
        if isinstance(event, Hello):
            await ws.send(encoder.encode(ToolsUpdate((HANGUP_TOOL,)), 0.0))
        elif isinstance(event, Dtmf) and event.digit == "9":
            await ws.send(encoder.encode(FunctionCall("bye1", "hangup", {}), 0.0))
        else:
            await super().respond(ws, encoder, event)


def _digits(brain: RecordingBrain) -> list[str]:
    return [e.digit for e in brain.of_type(Dtmf) if isinstance(e, Dtmf)]


async def _tenant_headers(http: httpx.AsyncClient) -> dict[str, str]:
    created = await http.post(
        "/v1/admin/keys", json={"tenant": "default", "label": "sip-e2e"}, headers=ADMIN
    )
    assert created.status_code == 201, created.text
    return {"Authorization": f"Bearer {created.json()['key']}"}


@realtime_echo
async def test_inbound_call_hears_the_echo_brain_and_dtmf_reaches_it() -> None:
    speech = speech_16k(str(SPEECH), 3.0)
    async with SipBrain() as brain, sip_stack(brain.url) as stack, SipPeerProcess() as peer:
        call = await peer.place_call(
            stack.uri(), speech=speech, loop=False, headers={"X-Campaign": "spring"}
        )
        assert call.sip_code == 200 and call.answered
        await eventually(lambda: len(brain.of_type(AudioIn)) > 150, 10)  # 3 s of caller audio
        await peer.send_dtmf(call, "1#")
        await eventually(
            lambda: [e.digit for e in brain.of_type(Dtmf) if isinstance(e, Dtmf)] == ["1", "#"], 5
        )
        await eventually(lambda: len(brain.of_type(AudioIn)) > 200, 10)
        heard = await peer.received_audio(call)
        hello = brain.of_type(Hello)[0]
        assert isinstance(hello, Hello)
        assert hello.call.provider == "sip" and hello.call.direction == "in"
        assert hello.call.to.startswith("sip:+15550001111@")
        live = next(iter(stack.gateway.state.calls.values()))
        assert live.context.provider == "sip"
        await peer.hang_up(call)
        end = await peer.wait_ended(call, 5)
        await eventually(lambda: bool(brain.of_type(SessionEnd)), 5)
        await eventually(lambda: not stack.gateway.state.calls, 5)
    back, corr, lag_ms = analyse_echo(speech, heard)
    assert back and corr is not None and lag_ms is not None
    check_sip_echo(corr, "(the caller did not hear its echo)")
    assert 0 < lag_ms < 500  # round trip through worker, gateway and brain
    assert end.by == "local"
    session_end = brain.of_type(SessionEnd)[0]
    assert isinstance(session_end, SessionEnd)
    assert session_end.reason is SessionEndReason.CALLER_HANGUP


async def test_brain_hangup_tool_sends_bye_to_the_caller() -> None:
    async with SipBrain() as brain, sip_stack(brain.url) as stack, SipPeerProcess() as peer:
        call = await peer.place_call(stack.uri(), speech=speech_16k(str(SPEECH), 1.0))
        await eventually(lambda: bool(brain.of_type(AudioIn)), 10)
        await peer.send_dtmf(call, "9")
        end = await peer.wait_ended(call, 10)
        await eventually(lambda: not stack.gateway.state.calls, 5)
        # The brain reads in order: on a loaded box it may still be behind on the
        # caller audio sent before the answer (a CI run asserted before it got there).
        await eventually(lambda: bool(brain.of_type(SessionEnd)), 5)
        store = stack.gateway.state.spend_store
        assert store is not None
        outputs = [e for e in brain.events if isinstance(e, FunctionCallOutput)]
    assert end.by == "remote"  # the gateway side sent BYE
    assert outputs, [type(e).__name__ for e in brain.events if not isinstance(e, AudioIn)]
    assert outputs and outputs[0].status == "ok"
    assert outputs[0].result == {"channel": "completed"}


async def test_api_delete_ends_a_live_sip_call_with_bye() -> None:
    metrics_port = free_port()
    extra = {"RUTSTER_SIP_METRICS_PORT": str(metrics_port)}
    async with (
        SipBrain() as brain,
        sip_stack(brain.url, worker_extra_env=extra) as stack,
        SipPeerProcess() as peer,
    ):
        call = await peer.place_call(stack.uri(), speech=speech_16k(str(SPEECH), 1.0))
        await eventually(lambda: len(stack.gateway.state.calls_by_id) == 1, 10)
        call_id = next(iter(stack.gateway.state.calls_by_id))
        async with httpx.AsyncClient(base_url=stack.gateway.url) as http:
            deleted = await http.delete(f"/v1/calls/{call_id}", headers=ADMIN)
            assert deleted.status_code == 202, deleted.text
            end = await peer.wait_ended(call, 10)
            await eventually(lambda: not stack.gateway.state.calls, 5)
            record = (await http.get(f"/v1/calls/{call_id}", headers=ADMIN)).json()
            health = (await http.get("/healthz")).json()
            worker_metrics = ""
            for _ in range(50):  # the worker forgets the leg once its socket has closed
                worker_metrics = (await http.get(f"http://127.0.0.1:{metrics_port}/metrics")).text
                if "rutster_sip_active_legs 0.0" in worker_metrics:
                    break
                await asyncio.sleep(0.1)
    assert health["sip_workers"] == 1
    assert 'rutster_sip_invites_total{outcome="admitted"} 1.0' in worker_metrics
    assert "rutster_sip_active_legs 0.0" in worker_metrics
    assert end.by == "remote"
    assert record["status"] == "ended" and record["provider"] == "sip"
    assert record["end_reason"] == "api_hangup"


async def test_outbound_call_through_the_api_reaches_the_peer() -> None:
    async with SipBrain() as brain, sip_stack(brain.url) as stack, SipPeerProcess() as peer:
        speech = speech_16k(str(SPEECH), 2.0)
        await peer.answer_incoming(200, after_ms=100, speech=speech, loop=False)
        async with httpx.AsyncClient(base_url=stack.gateway.url) as http:
            created = await http.post(
                "/v1/calls",
                headers=await _tenant_headers(http),
                json={"to": peer.sip_uri, "from": "+15550002222", "provider": "sip"},
            )
            assert created.status_code == 201, created.text
            call_id = created.json()["id"]
            incoming = await peer.next_incoming(10)
            await eventually(lambda: len(brain.of_type(AudioIn)) > 50, 10)
            hello = brain.of_type(Hello)[0]
            live = (await http.get(f"/v1/calls/{call_id}", headers=ADMIN)).json()
            await peer.hang_up(incoming.handle)
            await eventually(lambda: not stack.gateway.state.calls, 10)
            ended = (await http.get(f"/v1/calls/{call_id}", headers=ADMIN)).json()
    assert isinstance(hello, Hello) and hello.call.direction == "out"
    assert hello.call.provider == "sip"
    assert "+15550002222" in incoming.from_uri
    assert live["status"] == "in_progress"
    assert ended["status"] == "ended" and ended["end_reason"] == "caller_hangup"
    heard = np.frombuffer(
        b"".join(e.pcm for e in brain.of_type(AudioIn) if isinstance(e, AudioIn)), dtype=np.int16
    )
    assert np.abs(heard).max() > 1000  # the callee's speech reached the brain


async def test_outbound_call_to_a_busy_peer_is_settled_at_zero() -> None:
    async with SipBrain() as brain, sip_stack(brain.url) as stack, SipPeerProcess() as peer:
        await peer.answer_incoming(486)
        async with httpx.AsyncClient(base_url=stack.gateway.url) as http:
            created = await http.post(
                "/v1/calls",
                headers=await _tenant_headers(http),
                json={"to": peer.sip_uri, "from": "+15550002222", "provider": "sip"},
            )
            call_id = created.json()["id"]

            async def status() -> str:
                body = (await http.get(f"/v1/calls/{call_id}", headers=ADMIN)).json()
                return str(body["status"])

            for _ in range(100):
                if await status() == "failed":
                    break
                await asyncio.sleep(0.1)
            record = (await http.get(f"/v1/calls/{call_id}", headers=ADMIN)).json()
    assert record["status"] == "failed", record
    assert record["end_reason"] == "busy"
    assert record["spend"]["cost"] == "0.000000"
    assert not brain.of_type(Hello)


@pytest.mark.parametrize(("refusal", "code"), [("reject", 603), ("busy", 486)])
async def test_refused_admission_gets_the_sip_failure_code(refusal: str, code: int) -> None:
    from tests.conftest import spend_settings

    async with (
        SipBrain() as brain,
        sip_stack(brain.url, spend=spend_settings(refusal_response=refusal)) as stack,
        SipPeerProcess() as peer,
    ):
        store = stack.gateway.state.spend_store
        assert store is not None
        await store.set_kill_switch(True)
        call = await peer.place_call(stack.uri())
        await store.set_kill_switch(False)
    assert call.sip_code == code
    assert not call.answered
    assert not brain.of_type(Hello)


async def test_brain_transfer_tool_refers_the_caller_to_another_line() -> None:
    async with (
        TransferBrain() as brain,
        SipPeerProcess() as caller,
        SipPeerProcess(user="desk") as desk,
    ):
        brain.destination = desk.sip_uri
        await desk.answer_incoming(200)
        allow = TransferAllowlist.parse(desk.sip_uri)
        async with sip_stack(brain.url, transfer_allowlist=allow) as stack:
            call = await caller.place_call(stack.uri(), speech=speech_16k(str(SPEECH), 1.0))
            await eventually(lambda: bool(brain.of_type(AudioIn)), 10)
            await caller.send_dtmf(call, "0")
            transferred = await desk.next_incoming(10)  # the caller, REFERred to the desk
            end = await caller.wait_ended(call, 10)
            await eventually(lambda: not stack.gateway.state.calls, 5)
            # The in-process brain may still be reading queued caller audio (a full CI
            # run once asserted before it had read the tool's output).
            await eventually(lambda: bool(brain.of_type(SessionEnd)), 5)
    outputs = [e for e in brain.events if isinstance(e, FunctionCallOutput)]
    assert outputs and outputs[0].status == "ok", outputs
    assert outputs[0].result == {"channel": "transferring"}
    assert "peer@" in transferred.from_uri  # the original caller now talks to the desk
    assert end.by == "remote"  # we ended our leg after the REFER succeeded
    session_end = brain.of_type(SessionEnd)[0]
    assert isinstance(session_end, SessionEnd)
    assert session_end.reason is SessionEndReason.TRANSFERRED


async def test_an_overloaded_node_answers_503_so_the_trunk_tries_another() -> None:
    async with SipBrain() as brain, sip_stack(brain.url) as stack, SipPeerProcess() as peer:
        overload(stack.gateway.state)
        try:
            call = await peer.place_call(stack.uri())
        finally:
            relieve(stack.gateway.state)
        refused = stack.gateway.metric(
            "rutster_admissions_total", outcome="refused", reason="node_overloaded"
        )
    assert call.sip_code == 503 and not call.answered
    assert refused == 1
    assert not brain.of_type(Hello)
