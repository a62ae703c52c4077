"""WebSocket close codes (RFC 6455 §7.4.1) and limits used on the gateway's sockets."""

from __future__ import annotations

CLOSE_NORMAL = 1000
CLOSE_PROTOCOL_ERROR = 1002
CLOSE_POLICY_VIOLATION = 1008
#: The peer sent a message over the size limit (uvicorn closes with it).
CLOSE_MESSAGE_TOO_BIG = 1009
#: Sent by uvicorn to every WebSocket when the server shuts down.
CLOSE_SERVICE_RESTART = 1012
#: RFC 6455 §5.5: a close frame's body is at most 125 bytes, 2 of them the code.
MAX_CLOSE_REASON_CHARS = 120
