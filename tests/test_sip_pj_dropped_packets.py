"""trunk/sip/pj_dropped_packets.py without pjsip: what the hook does to the buffer pjsip hands it.

pjsip calls the hook with a ``pjsip_tp_dropped_data`` pointing into its receive buffer; here a
ctypes buffer stands in for it, so the in-place rewrite is checked byte for byte. The same
hook against a live pjsip is in tests/test_sip_ua.py and tests/test_sip_security.py.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Iterator

import pytest

from rutster.trunk.sip import pj_dropped_packets
from rutster.trunk.sip.pj_dropped_packets import PJSIP_EINVALIDMSG, DroppedPacketHook

REFUSED = b"INVITE sip:x SIP/2.0\r\nAuthorization: Basic eA==\r\nCall-ID: c\r\n\r\n"
REPAIRED = b"INVITE sip:x SIP/2.0\r\nCall-ID: c\r\n\r\n"


@pytest.fixture
def buffer() -> Iterator[ctypes.Array[ctypes.c_char]]:
    # pjsip's buffer is NUL-terminated after the message; keep that byte to see it untouched.
    yield ctypes.create_string_buffer(REFUSED, len(REFUSED) + 1)


def _dropped(
    buffer: ctypes.Array[ctypes.c_char], status: int = PJSIP_EINVALIDMSG
) -> pj_dropped_packets._DroppedData:
    return pj_dropped_packets._DroppedData(
        None, ctypes.cast(buffer, ctypes.c_void_p), len(REFUSED), status
    )


def _call_as_pjsip(hook: DroppedPacketHook, data: pj_dropped_packets._DroppedData) -> None:
    """What pjsip does: call the C callback with a pointer, with ``hook`` the active one."""
    pj_dropped_packets._active = hook
    try:
        pj_dropped_packets._CALLBACK(ctypes.pointer(data))
    finally:
        pj_dropped_packets._active = None


def test_a_repaired_request_ends_where_the_refused_one_ended(
    buffer: ctypes.Array[ctypes.c_char],
) -> None:
    hook = DroppedPacketHook(lambda refused: REPAIRED if refused == REFUSED else None)
    data = _dropped(buffer)
    _call_as_pjsip(hook, data)
    skipped = len(REFUSED) - len(REPAIRED)
    # pjsip skips `len` bytes and parses what follows, up to the end of the refused message.
    assert data.len == skipped
    assert buffer.raw[skipped : len(REFUSED)] == REPAIRED
    assert buffer.raw[len(REFUSED)] == 0
    assert (hook.repaired, hook.left_dropped, hook.failed) == (1, 0, 0)


@pytest.mark.parametrize(
    "repair",
    [lambda refused: None, lambda refused: refused, lambda refused: refused + b"x", lambda _: b""],
    ids=["none", "same length", "longer", "empty"],
)
def test_anything_but_a_shorter_request_leaves_the_packet_dropped_untouched(
    buffer: ctypes.Array[ctypes.c_char], repair: pj_dropped_packets.Repair
) -> None:
    hook = DroppedPacketHook(repair)
    data = _dropped(buffer)
    _call_as_pjsip(hook, data)
    assert data.len == len(REFUSED)
    assert buffer.raw[: len(REFUSED)] == REFUSED
    assert (hook.repaired, hook.left_dropped) == (0, 1)


def test_other_drops_are_not_looked_at(buffer: ctypes.Array[ctypes.c_char]) -> None:
    seen: list[bytes] = []

    def repair(refused: bytes) -> bytes | None:
        seen.append(refused)
        return None

    hook = DroppedPacketHook(repair)
    _call_as_pjsip(hook, _dropped(buffer, status=PJSIP_EINVALIDMSG + 1))
    assert seen == []
    assert (hook.repaired, hook.left_dropped) == (0, 0)


def test_a_failing_repair_is_one_log_line_and_never_reaches_pjsip(
    buffer: ctypes.Array[ctypes.c_char], caplog: pytest.LogCaptureFixture
) -> None:
    def repair(refused: bytes) -> bytes | None:
        raise ValueError("bad\nline")

    hook = DroppedPacketHook(repair)
    data = _dropped(buffer)
    with caplog.at_level(logging.ERROR, logger=pj_dropped_packets.__name__):
        _call_as_pjsip(hook, data)
    assert hook.failed == 1
    assert data.len == len(REFUSED)
    assert buffer.raw[: len(REFUSED)] == REFUSED
    [record] = caplog.records
    assert record.exc_info is None
    assert "stays dropped" in record.getMessage()


def test_with_no_hook_active_the_callback_does_nothing(buffer: ctypes.Array[ctypes.c_char]) -> None:
    data = _dropped(buffer)
    pj_dropped_packets._CALLBACK(ctypes.pointer(data))
    assert data.len == len(REFUSED)
