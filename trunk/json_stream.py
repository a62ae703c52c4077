"""Shared parsing of the CPaaS media streams that speak JSON text frames.

Twilio, Telnyx and Plivo each send one JSON object per text frame with an ``event``
name and base64 audio (docs/PROVIDERS.md §1.3, §2.3, §4.3). Their codecs
(``trunk/<provider>/codec.py``) differ in field names and rules; what they parse
the same way is here: the frame itself (size bound, JSON, an object with a string
``event``), typed fields, base64 payloads under a size bound, decimal numbers sent
as strings, and labels of peer-supplied values fit for logs and metrics. Every
error is an :class:`~protocols.ingress.IngressProtocolError` with a stable reason.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from rutster.protocols.ingress import IngressProtocolError

__all__ = [
    "MAX_LABEL_CHARS",
    "bad_start",
    "label",
    "number",
    "object_field",
    "parse_frame",
    "payload",
    "string_field",
]

#: Longest peer-supplied value passed on to logs and metric labels.
MAX_LABEL_CHARS = 64
#: Longest decimal string read as a number: 18 digits stay under 2**63.
_MAX_DIGITS = 18


def parse_frame(text: str, max_chars: int) -> tuple[dict[str, Any], str]:
    """One text frame's JSON object and its ``event`` name.

    Raises ``too_large`` (checked before parsing), ``malformed_json``,
    ``not_an_object``, ``missing_event`` or ``bad_field``.
    """
    if len(text) > max_chars:
        raise IngressProtocolError(
            "too_large", f"text frame of {len(text)} chars exceeds {max_chars}"
        )
    try:
        message = json.loads(text)
    except json.JSONDecodeError as exc:
        raise IngressProtocolError(
            "malformed_json", f"invalid JSON at position {exc.pos}: {exc.msg}"
        ) from None
    except (ValueError, RecursionError):
        # Integers over the int-string digit limit, nesting deeper than the parser's stack.
        raise IngressProtocolError("malformed_json", "JSON the parser refuses") from None
    if not isinstance(message, dict):
        raise IngressProtocolError(
            "not_an_object", f"expected a JSON object, got {type(message).__name__}"
        )
    event = message.get("event")
    if event is None:
        raise IngressProtocolError("missing_event", "message has no 'event' field")
    if not isinstance(event, str):
        raise IngressProtocolError("bad_field", "'event' is not a string")
    return message, event


def object_field(message: dict[str, Any], key: str) -> dict[str, Any]:
    """``message[key]``, which must be an object (``bad_field`` otherwise)."""
    value = message.get(key)
    if not isinstance(value, dict):
        raise IngressProtocolError("bad_field", f"{key!r} is missing or not an object")
    return value


def string_field(container: dict[str, Any], key: str, where: str) -> str:
    """``container[key]``, which must be a string (``bad_field`` otherwise)."""
    value = container.get(key)
    if not isinstance(value, str):
        raise IngressProtocolError("bad_field", f"{where}.{key} is missing or not a string")
    return value


def payload(media: dict[str, Any], max_bytes: int) -> bytes:
    """``media.payload`` decoded from base64: ``bad_field``, ``bad_base64`` or
    ``payload_too_large`` when it is not audio we take."""
    text = media.get("payload")
    if not isinstance(text, str):
        raise IngressProtocolError("bad_field", "media.payload is missing or not a string")
    try:
        audio = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):  # ValueError: non-ASCII text
        raise IngressProtocolError("bad_base64", "media.payload is not valid base64") from None
    if len(audio) > max_bytes:
        raise IngressProtocolError(
            "payload_too_large", f"media payload of {len(audio)} bytes exceeds {max_bytes}"
        )
    return audio


def number(value: object, where: str) -> int | None:
    """A non-negative integer sent as a number or a decimal string; None if absent."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    # isascii+isdigit: int() would also take "+5", " 5", "5_0" and non-ASCII digits.
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= _MAX_DIGITS:
        return int(value)
    raise IngressProtocolError("bad_field", f"{where} is not a non-negative integer")


def bad_start(message: str) -> IngressProtocolError:
    """A ``start`` the call cannot be set up from: fatal, the socket is closed."""
    return IngressProtocolError("bad_start", message, fatal=True)


def label(value: object) -> str:
    """A peer-supplied value, shortened for logs and metric labels."""
    if isinstance(value, str):
        return value[:MAX_LABEL_CHARS]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)[:MAX_LABEL_CHARS]
    return type(value).__name__
