"""pjsip's dropped-packet hook: a request its parser refused can be handed back, repaired.

Why: pjsua2's Python API has no hook between pjsip's parser and a packet it drops, so a request
with a header pjsip cannot parse (a ``Basic`` Authorization) is lost before the worker sees it
and the caller retransmits for 32 s. pjsip's C API has one: ``pjsip_tpmgr_set_drop_data_cb``
(pjsip/include/pjsip/sip_transport.h, pjproject 2.x). The pjsua2 wheel's extension module
exports it, and it is reached here through ctypes, as ``trunk/sip/source_filter.py`` reaches
pjsua's sockets.

How pjsip uses the hook (``pjsip_tpmgr_receive_packet``, pjsip/src/pjsip/sip_transport.c): on a
syntax error it calls the callback with ``pjsip_tp_dropped_data`` (transport, data, len,
status ``PJSIP_EINVALIDMSG``). If the callback sets ``len`` to p, shorter than the message,
pjsip consumes only the first p bytes and parses the rest of the buffer as the next message,
with the same receive data, so with the packet's real source address. A repaired request
that is shorter than the original, written at the end of the refused message, is therefore
parsed exactly as if it had arrived that way; the p bytes before it are skipped.

Threads and lifetime: with ``threadCnt = 0`` pjsip reads its SIP sockets only inside
``libHandleEvents``, on the user agent's own Python thread, and ctypes takes the GIL for the
callback in any case. The C callback is one module-level object that is never freed, and
:meth:`DroppedPacketHook.uninstall` clears it in pjsip before ``libDestroy``: pjsip never holds
a pointer to freed code. (Reading the dropped packets from pjsua's log through a Python
``LogWriter`` was tried first and taken back after a crash inside the writer; see
docs/SIP.md.)
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable

import pjsua2  # type: ignore[import-untyped]  # SWIG module without stubs

__all__ = ["PJSIP_EINVALIDMSG", "DroppedPacketHook", "Repair"]

_log = logging.getLogger(__name__)

#: pjsip/include/pjsip/sip_errno.h: ``PJSIP_EINVALIDMSG`` ("Invalid message/syntax error"),
#: the status pjsip gives a packet its parser refused (tests check the text pjsua2 gives it).
PJSIP_EINVALIDMSG = 171020

#: Given a refused message, the repaired one (strictly shorter), or None to leave it dropped.
Repair = Callable[[bytes], bytes | None]


class _DroppedData(ctypes.Structure):
    """``pjsip_tp_dropped_data`` (pjsip/include/pjsip/sip_transport.h)."""

    _fields_ = [
        ("tp", ctypes.c_void_p),  # pjsip_transport *
        ("data", ctypes.c_void_p),  # void *: the refused message, inside pjsip's receive buffer
        ("len", ctypes.c_size_t),  # pj_size_t: its length; the callback may shorten it
        ("status", ctypes.c_int),  # pj_status_t
    ]


#: ``pjsip_tp_on_rx_dropped_cb``: ``void (*)(pjsip_tp_dropped_data *data)``.
_DropCallback = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DroppedData))

#: The hook pjsip's callback serves (one pjsua2 Endpoint per process, so at most one).
_active: DroppedPacketHook | None = None


def _on_dropped(data: ctypes._Pointer[_DroppedData]) -> None:
    hook = _active
    if hook is None:
        return
    try:
        hook.on_dropped(data.contents)
    except Exception as exc:  # an exception must never cross back into pjsip's C frames
        # One line, no traceback: the packet is a peer's (issue 14, finding 8).
        hook.failed += 1
        _log.error("the dropped-packet hook failed (%r); the packet stays dropped", exc)


#: The one C callback object; module-level so it outlives every Endpoint.
_CALLBACK = _DropCallback(_on_dropped)


def _library() -> ctypes.CDLL:
    """The already loaded pjsua2 extension module, which links pjsip in and exports its API."""
    lib = ctypes.CDLL(pjsua2._pjsua2.__file__)
    lib.pjsua_get_pjsip_endpt.restype = ctypes.c_void_p
    lib.pjsua_get_pjsip_endpt.argtypes = []
    lib.pjsip_endpt_get_tpmgr.restype = ctypes.c_void_p
    lib.pjsip_endpt_get_tpmgr.argtypes = [ctypes.c_void_p]
    lib.pjsip_tpmgr_set_drop_data_cb.restype = ctypes.c_int
    lib.pjsip_tpmgr_set_drop_data_cb.argtypes = [ctypes.c_void_p, _DropCallback]
    return lib


class DroppedPacketHook:
    """Repairs the messages pjsip's parser refuses, with ``repair``, and hands them back.

    Install on the pjsua thread after ``libInit``; uninstall before ``libDestroy``. Counts
    what it repaired, what it left dropped, and its own failures.
    """

    def __init__(self, repair: Repair) -> None:
        self._repair = repair
        self._tpmgr: int | None = None
        #: Refused messages handed back repaired.
        self.repaired = 0
        #: Refused messages ``repair`` could not repair: they stay dropped, as pjsip decided.
        self.left_dropped = 0
        #: Exceptions inside the hook (each packet concerned stays dropped).
        self.failed = 0

    def install(self) -> None:
        """Point pjsip's dropped-data callback at this hook (after ``libInit``)."""
        global _active
        lib = _library()
        tpmgr = lib.pjsip_endpt_get_tpmgr(lib.pjsua_get_pjsip_endpt())
        if not tpmgr:
            raise RuntimeError("pjsip has no transport manager: install after libInit")
        _active = self
        status = lib.pjsip_tpmgr_set_drop_data_cb(tpmgr, _CALLBACK)
        if status != 0:
            _active = None
            raise RuntimeError(f"pjsip_tpmgr_set_drop_data_cb failed with status {status}")
        self._tpmgr = tpmgr

    def uninstall(self) -> None:
        """Clear pjsip's callback (before ``libDestroy``); harmless if never installed."""
        global _active
        if self._tpmgr is not None:
            _library().pjsip_tpmgr_set_drop_data_cb(self._tpmgr, _DropCallback())
            self._tpmgr = None
        if _active is self:
            _active = None

    def on_dropped(self, data: _DroppedData) -> None:
        """One message pjsip is about to drop (pjsua thread, inside ``libHandleEvents``)."""
        if data.status != PJSIP_EINVALIDMSG or not data.data or data.len == 0:
            return  # keep-alive newlines, overflows, missing headers: not ours to touch
        refused = ctypes.string_at(data.data, data.len)
        repaired = self._repair(refused)
        if repaired is None or not 0 < len(repaired) < len(refused):
            self.left_dropped += 1
            return
        skipped = len(refused) - len(repaired)
        ctypes.memmove(data.data + skipped, repaired, len(repaired))
        data.len = skipped
        self.repaired += 1
