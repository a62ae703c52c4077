"""What the gateway holds about its SIP workers: their control links and the live legs' edges.

Kept apart from the routes (``gateway/providers/sip.py``) so the gateway's
state can own a registry and a call control without importing Starlette handlers.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from starlette.websockets import WebSocket, WebSocketDisconnect

from rutster.base.ws_close import CLOSE_NORMAL, MAX_CLOSE_REASON_CHARS
from rutster.protocols.call_control import (
    CHANNEL_COMPLETED,
    CHANNEL_TRANSFERRING,
    CallControlFailure,
)
from rutster.protocols.ingress import IngressCommand
from rutster.trunk.sip.wire import ControlResult, HangUpLeg, SipMediaCodec, TransferLeg, WireError

#: Time the worker gets to report a BYE/REFER outcome: a SIP transaction over UDP
#: gives up after 64*T1 = 32 s (RFC 3261 §17.1.2.2); the tool waits far less and the
#: call ends anyway when the worker's BYE lands.
CONTROL_RESULT_TIMEOUT_S = 5.0


# ---- the workers ------------------------------------------------------------------------


@dataclass
class SipWorkerLink:
    """One connected SIP worker process, as its control channel shows it."""

    worker_id: str
    sip_uri: str
    capacity: int
    websocket: WebSocket
    active: int = 0
    #: Calls this gateway asked the worker to dial that have not reported back.
    dialling: set[str] = field(default_factory=set)

    @property
    def free(self) -> int:
        """Calls the worker can still take (its own count plus our pending dials)."""
        return self.capacity - self.active - len(self.dialling)

    async def send(self, text: str) -> bool:
        """Send one control frame; False when the worker is gone."""
        try:
            await self.websocket.send_text(text)
        except (WebSocketDisconnect, RuntimeError, OSError):
            return False
        return True


class SipWorkerRegistry:
    """The SIP workers connected to this gateway process."""

    def __init__(self) -> None:
        self._workers: dict[str, SipWorkerLink] = {}

    def add(self, link: SipWorkerLink) -> None:
        """Register a worker (a reconnect replaces the old link)."""
        self._workers[link.worker_id] = link

    def remove(self, link: SipWorkerLink) -> None:
        """Forget a worker whose control channel closed."""
        if self._workers.get(link.worker_id) is link:
            del self._workers[link.worker_id]

    def pick(self) -> SipWorkerLink | None:
        """The connected worker with the most free capacity, or None when all are full."""
        best = max(self._workers.values(), key=lambda w: w.free, default=None)
        return best if best is not None and best.free > 0 else None

    def get(self, worker_id: str) -> SipWorkerLink | None:
        """A connected worker by id."""
        return self._workers.get(worker_id)

    def links(self) -> list[SipWorkerLink]:
        """Every connected worker."""
        return list(self._workers.values())

    def __len__(self) -> int:
        return len(self._workers)


# ---- call control -------------------------------------------------------------------------


class SipEdge:
    """Sends core commands to the SIP worker over the call's media socket (the ``CallEdge``)."""

    def __init__(self, websocket: WebSocket, codec: SipMediaCodec) -> None:
        self._ws = websocket
        self._codec = codec
        self.closed = False
        self._results: dict[str, asyncio.Future[ControlResult]] = {}

    async def send(self, command: IngressCommand | HangUpLeg | TransferLeg) -> None:
        """Encode and send; a socket that is already gone makes this a no-op."""
        if self.closed:
            return
        try:
            encoded = self._codec.encode(command)
        except WireError as exc:
            # A command the worker would refuse (odd-length audio, a bad transfer target).
            raise CallControlFailure("bad_command", str(exc)) from None
        try:
            if isinstance(encoded, bytes):
                await self._ws.send_bytes(encoded)
            else:
                await self._ws.send_text(encoded)
        except (WebSocketDisconnect, RuntimeError, OSError):
            self.closed = True

    async def request(self, command: HangUpLeg | TransferLeg, op: str) -> ControlResult:
        """Send a call-control command and wait for the worker's ``control_result``."""
        if self.closed:
            raise CallControlFailure("already_ended", "the call's SIP leg is gone")
        waiter = asyncio.get_running_loop().create_future()
        self._results[op] = waiter
        try:
            await self.send(command)
            async with asyncio.timeout(CONTROL_RESULT_TIMEOUT_S):
                result: ControlResult = await waiter
                return result
        except TimeoutError:
            raise CallControlFailure("timeout", f"the SIP worker did not confirm {op}") from None
        finally:
            self._results.pop(op, None)

    def resolve(self, result: ControlResult) -> bool:
        """Hand a ``control_result`` to its waiter; False when nobody asked."""
        waiter = self._results.get(result.op)
        if waiter is None or waiter.done():
            return False
        waiter.set_result(result)
        return True

    def abandon(self) -> None:
        """The socket closed: wake every waiter with ``already_ended``."""
        self.closed = True
        for waiter in self._results.values():
            if not waiter.done():
                waiter.set_exception(CallControlFailure("already_ended", "the SIP leg ended"))

    async def close(self, reason: str) -> None:
        """Close the media socket; the worker then hangs the SIP leg up."""
        if self.closed:
            return
        self.abandon()
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
            await self._ws.close(CLOSE_NORMAL, reason[:MAX_CLOSE_REASON_CHARS])


class SipCallControl:
    """Hang up (BYE) or transfer (REFER) SIP calls held by this process."""

    def __init__(self) -> None:
        self._edges: dict[str, SipEdge] = {}

    def attach(self, call_id: str, edge: SipEdge) -> None:
        """Route call control for ``call_id`` over ``edge``."""
        self._edges[call_id] = edge

    def detach(self, call_id: str) -> None:
        """The call's media socket closed."""
        self._edges.pop(call_id, None)

    def _edge(self, call_id: str) -> SipEdge:
        edge = self._edges.get(call_id)
        if edge is None:
            raise CallControlFailure("already_ended", "no live SIP leg for that call")
        return edge

    async def hang_up(self, call_id: str) -> str:
        """Send BYE through the worker."""
        result = await self._edge(call_id).request(HangUpLeg(), "hangup")
        if not result.ok:
            raise CallControlFailure(result.reason or "sip_error", "the worker could not hang up")
        return CHANNEL_COMPLETED

    async def transfer(self, call_id: str, destination: str) -> str:
        """Send REFER to ``destination`` (a SIP URI, or E.164 dialled through the trunk)."""
        result = await self._edge(call_id).request(TransferLeg(destination), "transfer")
        if not result.ok:
            reason = result.reason or f"sip_{result.sip_code}"
            raise CallControlFailure(reason, f"the transfer was refused (SIP {result.sip_code})")
        return CHANNEL_TRANSFERRING
