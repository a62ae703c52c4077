"""One log record, one line: peers cannot forge log lines.

Brains, providers and callers choose strings that reach log messages (an
error message, a ``bye`` reason, a hello's name, a tool's id and name). A line
break in one of them would start what reads as a new, forged log line. The
formatter here escapes every control character (C0, DEL, C1, and the Unicode
line and paragraph separators) in the message line as ``\\xNN`` / ``\\uNNNN``;
a traceback appended to the record keeps its own line breaks (it is ours).
"""

from __future__ import annotations

import logging

__all__ = ["LOG_FORMAT", "OneLineFormatter", "escape_controls", "setup_logging"]

#: The format every rutster process logs with.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_ESCAPES = {code: f"\\x{code:02x}" for code in (*range(0x00, 0x20), *range(0x7F, 0xA0))} | {
    0x2028: "\\u2028",
    0x2029: "\\u2029",
}


def escape_controls(text: str) -> str:
    """``text`` with every control character escaped (one printable line)."""
    return text.translate(_ESCAPES)


class OneLineFormatter(logging.Formatter):
    """A :class:`logging.Formatter` whose message line carries no control character."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return escape_controls(super().formatMessage(record))


def setup_logging(level: str) -> None:
    """Log to stderr at ``level`` (a name such as ``"info"``), one line per record."""
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO))
    for handler in logging.getLogger().handlers:
        handler.setFormatter(OneLineFormatter(LOG_FORMAT))
