"""The Kamailio dispatcher (infra/kamailio) in front of real SIP workers, end to end.

A pjsua2 phone calls Kamailio's one address; Kamailio spreads the INVITEs over
two ``rutster sip-worker`` processes, which bridge them to the gateway and an
echoing brain. In-dialog requests (ACK, BYE) follow Kamailio's Record-Route;
RTP flows directly between the phone and the worker. Skipped with the reason
when Kamailio cannot be installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from rutster.tools.sip_load_generator import analyse_echo
from rutster.tools.sip_peer import SipPeerProcess
from tests.conftest import eventually
from tests.realtime_echo import check_sip_echo, realtime_echo
from tests.sip_stack import sip_stack, speech_16k
from tests.test_sip_e2e import SPEECH, SipBrain
from tests.test_sip_kamailio import (
    CONFIG,
    LOOPBACK,
    free_udp_port,
    kamailio_binary,
    options_answered,
)

#: Time Kamailio gets to answer its first OPTIONS after starting.
KAMAILIO_START_S = 15.0


@contextlib.contextmanager
def kamailio_in_front(worker_ports: list[int], work: Path) -> Iterator[int]:
    """Kamailio on a free loopback UDP port dispatching to the SIP workers listening on
    ``worker_ports``; its port."""
    binary = kamailio_binary()
    ds_list = work / "dispatcher.list"
    ds_list.write_text(
        "".join(
            f"1 sip:{LOOPBACK}:{port} 0 0 duid=w{i};maxload=4\n"
            for i, port in enumerate(worker_ports)
        )
    )
    port = free_udp_port()
    argv = [
        str(binary),
        *("-DD", "-E", "-f", str(CONFIG)),
        *("-P", str(work / "kamailio.pid"), "-Y", str(work), "-w", str(work)),
        *("-m", "32", "-M", "8"),
        *("-A", f"LISTEN=udp:{LOOPBACK}:{port}", "-A", f'DISPATCHER_LIST="{ds_list}"'),
        *("-A", "CHILDREN=2"),
    ]
    log = (work / "kamailio.log").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + KAMAILIO_START_S
        while options_answered(port) != 200:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError((work / "kamailio.log").read_text()[-2000:])
        yield port
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@realtime_echo
async def test_kamailio_spreads_real_calls_over_two_workers(tmp_path: Path) -> None:
    speech = speech_16k(str(SPEECH), 3.0)
    async with SipBrain() as brain, sip_stack(brain.url, workers=2) as stack:
        with kamailio_in_front([w.port for w in stack.workers], tmp_path) as port:
            async with SipPeerProcess() as peer:
                uri = f"sip:+15550001111@{LOOPBACK}:{port}"
                calls = [await peer.place_call(uri, speech=speech, loop=False) for _ in range(2)]
                assert all(c.sip_code == 200 for c in calls), calls
                links = [stack.gateway.state.sip_workers.get(f"w{i}") for i in range(2)]
                await eventually(lambda: all(lk is not None and lk.active == 1 for lk in links), 5)
                await asyncio.sleep(3.5)  # the whole utterance and its echo
                heard = [await peer.received_audio(c) for c in calls]
                for call in calls:
                    await peer.hang_up(call)  # BYE through Kamailio's Record-Route
                ends = [await peer.wait_ended(c, 5) for c in calls]
                await eventually(lambda: not stack.gateway.state.calls, 10)
    for audio in heard:
        back, corr, _ = analyse_echo(speech, audio)
        assert back
        check_sip_echo(corr)
    assert all(end.by == "local" and end.sip_code == 200 for end in ends), ends
