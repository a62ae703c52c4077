"""A SipWorkerPool of two REAL ``rutster sip-worker`` processes: a crash of one spares the other.

Gateway (in-process, uvicorn) + echo brain (in-process) + the pool's two workers + a pjsua2
phone (``SipPeerProcess``): a call on worker 0 keeps echoing while worker 1 is SIGKILLed, and
the pool brings worker 1 back on the same port, where it takes a new call.
"""

from __future__ import annotations

import asyncio
import os
import signal

from rutster.brains.echo import EchoBrain
from rutster.tools.launcher import LOOPBACK
from rutster.tools.sip_load_generator import DEFAULT_SPEECH_PATH, analyse_echo, voiced_frames
from rutster.tools.sip_load_stack import free_port_block, wait_workers_connected
from rutster.tools.sip_peer import FRAME_BYTES, CallHandle, SipPeerProcess
from rutster.trunk.sip.cli import sip_worker_argv
from rutster.trunk.sip.pool import SipWorkerPool
from tests.conftest import RunningGateway, eventually, gateway_config, serve_gateway
from tests.realtime_echo import check_sip_echo, realtime_echo
from tests.sip_stack import TEST_SIP_SECRET, speech_16k, worker_env

#: 20 ms frames per second.
FRAMES_PER_S = 50
#: How long each "is audio still flowing" window listens: 2 s of looped speech holds
#: several words of the fixture, so its echo has well over 25 voiced frames.
LISTEN_S = 2.0


def _pool(gw: RunningGateway) -> SipWorkerPool:
    url = gw.url.replace("http://", "ws://")
    return SipWorkerPool(
        workers=2,
        base_port=free_port_block(2),
        command_for=lambda _index, port: sip_worker_argv(port, "warning"),
        env_for=lambda index, _port: {
            **worker_env(url),
            "RUTSTER_SIP_BIND": LOOPBACK,
            "RUTSTER_SIP_WORKER_ID": f"pool{index}",
        },
        # Back at once after the kill (the default's first step is 0.5 s too).
        restart_delays=(0.5,),
    )


async def _echo_flows(peer: SipPeerProcess, call: CallHandle) -> tuple[int, float]:
    """Listen LISTEN_S more seconds; (voiced frames heard in that window, its correlation
    with the speech the peer sends)."""
    start = len(await peer.received_audio(call))
    await asyncio.sleep(LISTEN_S)
    heard = await peer.received_audio(call)
    window = heard[start:]
    assert len(window) >= (LISTEN_S - 0.5) * FRAMES_PER_S * FRAME_BYTES, "audio stalled"
    # The echo of the whole call so far against everything sent: still the caller's voice.
    _, corr, _ = analyse_echo(await peer.sent_audio(call), heard)
    return voiced_frames(window), corr or 0.0


@realtime_echo
async def test_killing_one_worker_spares_the_other_and_the_pool_restarts_it() -> None:
    speech = speech_16k(str(DEFAULT_SPEECH_PATH), 10.0)
    async with EchoBrain() as brain:
        cfg = gateway_config(brain.url, barge_in=False, sip_secret=TEST_SIP_SECRET)
        async with serve_gateway(cfg) as gw, _pool(gw) as pool, SipPeerProcess() as peer:
            port0, port1 = pool.ports
            gw_port = int(gw.url.rsplit(":", 1)[1])
            await wait_workers_connected(pool, gw_port, timeout_s=30)
            assert len(gw.state.sip_workers) == 2

            call0 = await peer.place_call(f"sip:pool@{LOOPBACK}:{port0}", speech=speech)
            assert call0.answered and call0.sip_code == 200
            voiced, corr = await _echo_flows(peer, call0)
            assert voiced >= 25, voiced
            check_sip_echo(corr)

            victim = pool.status()[1]
            assert victim.alive and victim.pid is not None
            os.kill(victim.pid, signal.SIGKILL)
            # The gateway sees worker 1's control channel drop...
            await eventually(lambda: gw.state.sip_workers.get("pool1") is None, 10)
            # ...while worker 0's call goes on: the echo is still the caller's voice.
            voiced, corr = await _echo_flows(peer, call0)
            assert voiced >= 25, voiced
            check_sip_echo(corr)
            assert gw.state.sip_workers.get("pool0") is not None

            # Worker 1 is back, a new process on the same port, connected again.
            await eventually(
                lambda: pool.status()[1].alive and pool.status()[1].pid != victim.pid, 10
            )
            back = pool.status()[1]
            assert (back.port, back.restarts, back.last_exit_code) == (
                port1,
                1,
                -signal.SIGKILL,
            )
            await wait_workers_connected(pool, gw_port, timeout_s=30)
            assert gw.state.sip_workers.get("pool1") is not None

            call1 = await peer.place_call(f"sip:pool@{LOOPBACK}:{port1}", speech=speech)
            assert call1.answered and call1.sip_code == 200
            voiced, corr = await _echo_flows(peer, call1)
            assert voiced >= 25, voiced
            check_sip_echo(corr)
            # Worker 0 never restarted, and its call was never interrupted.
            assert pool.status()[0].restarts == 0
            voiced, corr = await _echo_flows(peer, call0)
            assert voiced >= 25, voiced
            check_sip_echo(corr)

            for call in (call0, call1):
                await peer.hang_up(call)
                end = await peer.wait_ended(call, 5)
                assert end.by == "local", end
