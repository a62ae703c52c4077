"""Keep the API key out of logs, whatever the log level.

The ``websockets`` library logs every handshake header at DEBUG, and the SDK's
handshake carries ``Authorization: Bearer <key>``. Rather than trust every
deployment to keep those loggers above DEBUG, a filter on them rewrites the
header's value before any handler sees the record.
"""

from __future__ import annotations

import logging
import re

#: Loggers that print handshake headers (websockets' client and server sides).
HEADER_LOGGERS = ("websockets.client", "websockets.server")
_AUTH_HEADER = re.compile(r"(?i)\b(authorization|api-key|openai-api-key)(\s*[:=]\s*)(.+)")
REDACTED = "[redacted]"


class AuthorizationRedactor(logging.Filter):
    """Rewrites credential headers in a record's message; never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = _AUTH_HEADER.sub(lambda m: m.group(1) + m.group(2) + REDACTED, message)
        if redacted != message:
            record.msg = redacted
            record.args = None
        return True


_REDACTOR = AuthorizationRedactor()


def install_redaction() -> None:
    """Attach the redactor to every header-logging logger (idempotent)."""
    for name in HEADER_LOGGERS:
        logger = logging.getLogger(name)
        if _REDACTOR not in logger.filters:
            logger.addFilter(_REDACTOR)
