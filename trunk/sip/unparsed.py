"""Requests pjsip's parser refused: read them from its log, answer them statelessly (sans-I/O).

Why this exists: pjsip drops a request carrying a header it cannot parse (an ``Authorization``
whose scheme is not Digest, such as ``Basic`` or ``Bearer``; a broken ``Via``) in its transport
layer, before any module or pjsua2 callback sees it. Nothing answers, and the caller retransmits
for 32 s (RFC 3261 §17.1.1.2, Timer B = 64*T1). pjsua2 has no hook at that point, but pjsip
logs each such packet from ``pjsip_tpmgr_receive_packet`` (pjsip/src/pjsip/sip_transport.c):

- level 2: ``Dropping <n> bytes packet from <TRANSPORT> <ip>:<port> : <parse error>``
- level 4, right after it: ``Dropped packet:<the packet's text>`` then ``-- end of packet.``

:class:`DroppedPacketReader` pairs those two lines into an :class:`UnparsedRequest`;
:func:`stateless_answer` builds the answer RFC 3261 §8.2.6 describes (the request's Via, From,
To, Call-ID and CSeq copied, a To tag added). The user agent (``trunk/sip/ua.py``) feeds the
reader from its pjsua2 log writer and sends the answer from its own SIP socket, to the packet's
source address only (never to a Via it did not come from: no reflection). Both line formats are
pinned by ``tests/test_sip_unparsed.py`` against the installed pjsua2.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

#: The level-2 line (the format string of pjsip 2.15's sip_transport.c).
_DROPPING_RE = re.compile(r"Dropping (\d+) bytes packet from (\w+) (\S+):(\d+) : ([^\r\n]*)")
#: What precedes the packet's text in the level-4 line, and what ends it.
_DROPPED_PREFIX = "Dropped packet:"
_END_OF_PACKET = "\n-- end of packet."
#: pjsip's log level of each line (PJ_LOG(2, ...) and PJ_LOG(4, ...) there).
DROPPING_LOG_LEVEL = 2
DROPPED_PACKET_LOG_LEVEL = 4
#: The parse error kept per request (characters): pjsip's own message is one short line.
MAX_REASON_CHARS = 200
#: A request line: method, URI, version (RFC 3261 §7.1); anything else (a response) is not
#: answered.
_REQUEST_LINE_RE = re.compile(r"^([A-Za-z0-9.!%*_+`'~-]+) \S+ SIP/2\.0$")
#: RFC 3261 §7.3.3 compact forms of the headers an answer copies.
_COMPACT = {"v": "via", "f": "from", "t": "to", "i": "call-id"}
#: Headers a stateless answer copies (RFC 3261 §8.2.6.2), in the order they are written.
_COPIED = ("via", "from", "to", "call-id", "cseq")
#: Reason phrases of the codes a worker answers with (RFC 3261 §21).
_PHRASES = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 503: "Service Unavailable"}


@dataclass(frozen=True, slots=True)
class UnparsedRequest:
    """A request pjsip dropped as unparseable, as its log showed it."""

    #: pjsip's transport name: ``UDP``, ``TCP``, ``TLS``.
    transport: str
    #: Where the packet came from, ``ip:port``.
    source: str
    #: pjsip's parse error, one line.
    reason: str
    #: The request line's method (upper-cased).
    method: str
    #: The Authorization header's value, None when there is none.
    authorization: str | None
    #: The request's header lines, unfolded (the body is not kept).
    header_lines: tuple[str, ...]


class DroppedPacketReader:
    """Pairs pjsip's "Dropping ..." and "Dropped packet:" log lines into requests.

    Feed it every pjsip log message (decorated or not); :meth:`feed` returns an
    :class:`UnparsedRequest` when a dropped packet was a request. Responses, blank keep-alives and
    lines with no "Dropping" line before them give None. Not thread-safe: pjsip logs both lines
    from the thread that read the packet, and the worker's user agent reads every socket from
    its one pjsua thread.
    """

    def __init__(self) -> None:
        self._pending: tuple[str, str, str] | None = None
        #: Dropped packets seen (requests or not).
        self.packets = 0

    def feed(self, message: str) -> UnparsedRequest | None:
        """One pjsip log message; a request when it completes one."""
        at = message.find(_DROPPED_PREFIX)
        if at < 0:
            found = _DROPPING_RE.search(message)
            if found is not None:
                transport, ip, port, reason = found.group(2, 3, 4, 5)
                self._pending = (transport.upper(), f"{ip}:{port}", reason[:MAX_REASON_CHARS])
                self.packets += 1
            return None
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        text = message[at + len(_DROPPED_PREFIX) :]
        end = text.rfind(_END_OF_PACKET)
        if end >= 0:
            text = text[:end]
        return _request_of(text, *pending)


def _request_of(text: str, transport: str, source: str, reason: str) -> UnparsedRequest | None:
    head = re.split(r"\r?\n\r?\n", text, maxsplit=1)[0]
    lines = re.split(r"\r?\n", head)
    match = _REQUEST_LINE_RE.match(lines[0].strip()) if lines else None
    if match is None:
        return None
    unfolded: list[str] = []
    for line in lines[1:]:
        if line[:1] in (" ", "\t") and unfolded:
            unfolded[-1] += " " + line.strip()
        elif line.strip():
            unfolded.append(line.strip())
    authorization = None
    for line in unfolded:
        name, _, value = line.partition(":")
        if name.strip().lower() == "authorization":
            authorization = value.strip()
            break
    return UnparsedRequest(
        transport=transport,
        source=source,
        reason=reason,
        method=match.group(1).upper(),
        authorization=authorization,
        header_lines=tuple(unfolded),
    )


def stateless_answer(
    request: UnparsedRequest,
    status: int,
    to_tag: str,
    headers: Sequence[tuple[str, str]] = (),
) -> bytes | None:
    """The final answer to ``request`` (RFC 3261 §8.2.6), or None when it cannot have one.

    None for ACK (never answered, §17.2.1) and for a request missing any of Via, From, To,
    Call-ID or CSeq (the caller could not match an answer to its transaction). ``to_tag`` is
    added to To when the request's To has no tag; ``headers`` are added as they are.
    """
    if request.method == "ACK" or not 300 <= status <= 699:
        return None
    copied: dict[str, list[str]] = {name: [] for name in _COPIED}
    for line in request.header_lines:
        name, sep, value = line.partition(":")
        key = name.strip().lower()
        key = _COMPACT.get(key, key)
        if sep and key in copied:
            copied[key].append(value.strip())
    if any(not values for values in copied.values()):
        return None
    to = copied["to"][0]
    if not re.search(r";\s*tag\s*=", to, re.IGNORECASE):
        to = f"{to};tag={to_tag}"
    phrase = _PHRASES.get(status, "Rejected")
    out = [f"SIP/2.0 {status} {phrase}"]
    out += [f"Via: {via}" for via in copied["via"]]
    out += [
        f"From: {copied['from'][0]}",
        f"To: {to}",
        f"Call-ID: {copied['call-id'][0]}",
        f"CSeq: {copied['cseq'][0]}",
    ]
    out += [f"{name}: {value}" for name, value in headers]
    out += ["Content-Length: 0", "", ""]
    return "\r\n".join(out).encode("utf-8", errors="replace")
