"""A SIP message's header section as lines (RFC 3261 §7.3), shared by the user agent's
INVITE reader (``trunk/sip/ua.py``) and the unparsed-request reader (``trunk/sip/unparsed.py``).
Hand-written: pjsua2 exposes a received message only as text, and no kept Python library
parses SIP headers.
"""

from __future__ import annotations

import re

#: RFC 3261 §7.3.3 compact header forms, expanded so lookups use one name.
COMPACT_HEADERS = {
    "i": "call-id",
    "f": "from",
    "t": "to",
    "m": "contact",
    "v": "via",
    "l": "content-length",
    "c": "content-type",
    "k": "supported",
    "s": "subject",
    "e": "content-encoding",
    "o": "event",
    "r": "refer-to",
    "b": "referred-by",
    "u": "allow-events",
    "x": "session-expires",
}


def split_header_lines(message: str) -> tuple[str, list[str]]:
    """The start line and the header lines of ``message``, folded lines unfolded
    (RFC 3261 §7.3.1), each stripped, blank ones dropped; the body is left out."""
    head = re.split(r"\r?\n\r?\n", message, maxsplit=1)[0]
    lines = re.split(r"\r?\n", head)
    start_line = lines[0].strip() if lines else ""
    unfolded: list[str] = []
    for line in lines[1:]:
        if line[:1] in (" ", "\t") and unfolded:
            unfolded[-1] += " " + line.strip()
        elif line.strip():
            unfolded.append(line.strip())
    return start_line, unfolded
