"""The NCCO the Vonage answer webhook replies with (docs/PROVIDERS.md §3.2).

``connect`` to a ``websocket`` endpoint: L16 at 16 kHz both ways, our headers
(the call's uuid) echoed in the socket's first message, and
``authorization: {"type": "vonage"}`` so that the handshake carries a JWT the
gateway can check. A refused call gets a ``talk`` (``RUTSTER_REFUSAL_RESPONSE=say``)
or an empty NCCO: nothing to do, so Vonage ends the call.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

__all__ = ["connect_websocket_ncco", "empty_ncco", "talk_ncco"]


def connect_websocket_ncco(uri: str, headers: Mapping[str, str], content_type: str) -> str:
    """``[connect → websocket]`` to ``uri`` (ws/wss)."""
    if not uri.startswith(("wss://", "ws://")):
        raise ValueError("the websocket URI must be ws:// or wss://")
    endpoint = {
        "type": "websocket",
        "uri": uri,
        "content-type": content_type,
        "headers": dict(headers),
        "authorization": {"type": "vonage"},
    }
    return json.dumps([{"action": "connect", "endpoint": [endpoint]}])


def talk_ncco(text: str) -> str:
    """``[talk]``: say ``text``; the call ends after it."""
    return json.dumps([{"action": "talk", "text": text}])


def empty_ncco() -> str:
    """``[]``: nothing to do; the call ends."""
    return "[]"
