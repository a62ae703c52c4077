"""TeXML documents the Telnyx answer webhook replies with (docs/PROVIDERS.md §2.1).

TeXML is Telnyx's Twilio-compatible XML. ``<Connect><Stream>`` forks the call to
our media socket both ways: ``bidirectionalMode="rtp"`` is required, or Telnyx
takes the raw audio we send for MP3 and the caller hears nothing (§2.1), and the
codec is pinned to PCMU at 8 kHz both ways, the one format the stream codec
(``trunk/telnyx/codec.py``) accepts. Built with :mod:`xml.etree.ElementTree`, which
escapes text and attribute values; characters XML 1.0 cannot carry are refused.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Mapping

from rutster.trunk.xml_documents import checked_text, connect_stream_document, xml_document

__all__ = [
    "REJECT_REASONS",
    "connect_stream_texml",
    "reject_texml",
    "say_hangup_texml",
]

#: ``<Reject reason>`` values (TeXML follows TwiML's ``<Reject>``: ``rejected``, ``busy``).
REJECT_REASONS = frozenset({"rejected", "busy"})
#: Stream attributes our codec relies on (§2.1): RTP mode, PCMU at 8 kHz both ways.
STREAM_ATTRIBUTES = {
    "bidirectionalMode": "rtp",
    "codec": "PCMU",
    "bidirectionalCodec": "PCMU",
    "bidirectionalSamplingRate": "8000",
}


def connect_stream_texml(stream_url: str, parameters: Mapping[str, str]) -> str:
    """``<Connect><Stream>`` to ``stream_url`` carrying ``parameters`` as ``<Parameter>``s.

    Raises ``ValueError`` for a URL that is not ``ws``/``wss`` or a value XML cannot carry.
    """
    if not stream_url.startswith(("wss://", "ws://")):
        raise ValueError("the stream URL must be ws:// or wss://")
    return connect_stream_document(
        {"url": checked_text(stream_url, "stream URL"), **STREAM_ATTRIBUTES}, parameters
    )


def reject_texml(reason: str) -> str:
    """``<Reject>``: refuse the call before it is answered (no charge for the caller)."""
    if reason not in REJECT_REASONS:
        raise ValueError(f"reject reason must be one of {sorted(REJECT_REASONS)}")
    response = ET.Element("Response")
    ET.SubElement(response, "Reject", {"reason": reason})
    return xml_document(response)


def say_hangup_texml(text: str) -> str:
    """``<Say>`` a sentence, then ``<Hangup/>``."""
    response = ET.Element("Response")
    ET.SubElement(response, "Say").text = checked_text(text, "say text")
    ET.SubElement(response, "Hangup")
    return xml_document(response)
