"""TwiML documents the voice webhook answers with.

Built with :mod:`xml.etree.ElementTree`, which escapes text and attribute values;
untrusted values (caller numbers, messages) are never spliced into XML strings.
ElementTree does not reject characters XML 1.0 forbids (NUL, most C0 controls,
lone surrogates), so those are refused here rather than producing a document
Twilio cannot parse.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from urllib.parse import SplitResult, urlsplit

#: Declaration Twilio's own helper library emits (twilio-python ``TwiML.to_xml``).
XML_DECLARATION = '<?xml version="1.0" encoding="UTF-8"?>'

#: Schemes a ``<Stream url>`` may use: Twilio wants ``wss``; ``ws`` is kept for local testing.
STREAM_URL_SCHEMES = frozenset({"ws", "wss"})

#: Schemes a stream ``statusCallback`` may use (Twilio POSTs a form there, PROVIDERS.md §1.2).
STATUS_CALLBACK_SCHEMES = frozenset({"http", "https"})

#: ``<Reject reason>`` values Twilio accepts (TwiML ``<Reject>`` docs; twilio-python ``reject``).
REJECT_REASONS = frozenset({"rejected", "busy"})

#: Characters outside the XML 1.0 ``Char`` production (W3C XML 1.0 §2.2).
_INVALID_XML_CHARS = re.compile("[^\t\n\r\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def connect_stream_twiml(
    stream_url: str,
    parameters: Mapping[str, str],
    *,
    stream_name: str | None = None,
    status_callback: str | None = None,
) -> str:
    """``<Connect><Stream>``: fork the call to our media socket, bidirectionally.

    ``parameters`` become ``<Parameter>`` children, delivered in
    ``start.customParameters``. Raises ``ValueError`` for a stream URL that is not
    an absolute ``ws://``/``wss://`` URL, or that has a query string or fragment
    (Twilio does not support a query string on stream URLs, PROVIDERS.md §1.2).
    """
    split = _split_url(stream_url, "stream_url")
    if split.scheme not in STREAM_URL_SCHEMES or not split.hostname:
        raise ValueError("stream_url must be an absolute ws:// or wss:// URL")
    if "?" in stream_url or "#" in stream_url:
        raise ValueError("stream_url must not have a query string or fragment; use parameters")
    stream_attrs = {"url": _xml_text(stream_url, "stream_url")}
    if stream_name is not None:
        stream_attrs["name"] = _xml_text(stream_name, "stream_name")
    if status_callback is not None:
        callback = _split_url(status_callback, "status_callback")
        if callback.scheme not in STATUS_CALLBACK_SCHEMES or not callback.hostname:
            raise ValueError("status_callback must be an absolute http:// or https:// URL")
        stream_attrs["statusCallback"] = _xml_text(status_callback, "status_callback")

    response = ET.Element("Response")
    connect = ET.SubElement(response, "Connect")
    stream = ET.SubElement(connect, "Stream", stream_attrs)
    for name, value in parameters.items():
        if not name:
            raise ValueError("parameter names must not be empty")
        ET.SubElement(
            stream,
            "Parameter",
            {"name": _xml_text(name, "parameter name"), "value": _xml_text(value, "parameter")},
        )
    return _document(response)


def reject_twiml(reason: str = "rejected") -> str:
    """``<Reject>``: refuse the call without answering it (no charge for the caller)."""
    if reason not in REJECT_REASONS:
        raise ValueError(f"reject reason must be one of {sorted(REJECT_REASONS)}")
    response = ET.Element("Response")
    ET.SubElement(response, "Reject", {"reason": reason})
    return _document(response)


def say_hangup_twiml(message: str) -> str:
    """``<Say>`` a short message, then ``<Hangup/>``."""
    if not message.strip():
        raise ValueError("message must not be empty")
    response = ET.Element("Response")
    say = ET.SubElement(response, "Say")
    say.text = _xml_text(message, "message")
    ET.SubElement(response, "Hangup")
    return _document(response)


def _split_url(url: str, what: str) -> SplitResult:
    """Parse ``url``, turning a malformed port or IPv6 host into ``ValueError`` with context."""
    try:
        split = urlsplit(url)
        split.port  # noqa: B018 - reading the port is what validates it
    except ValueError as exc:
        raise ValueError(f"{what} is not a valid URL") from exc
    return split


def _xml_text(value: str, what: str) -> str:
    """Return ``value`` if XML can carry it; ``ValueError`` otherwise."""
    if _INVALID_XML_CHARS.search(value):
        raise ValueError(f"{what} contains a character XML cannot carry")
    return value


def _document(root: ET.Element) -> str:
    return XML_DECLARATION + ET.tostring(root, encoding="unicode")
