"""The tools a brain may offer its model, with the JSON Schemas the core validates against.

The brain proposes, the core disposes (docs/ARCHITECTURE.md): a brain advertises
these in ``tools.update`` and the gateway's tool registry checks every
``function_call`` against the latest catalog and its own implementations. The
names here are the ones the gateway implements (``gateway/tool_registry.py``); a brain
in another language copies them from ``docs/TAP_PROTOCOL.md``.
"""

from __future__ import annotations

from collections.abc import Iterable

from rutster.protocols.tap import ToolSpec

#: Longest free-text reason a model may give for hanging up. Seed decision: a
#: sentence; the core records only the tool name, never the text (receipts are
#: content-free), so this bounds what the model can stuff into a call.
MAX_REASON_CHARS = 200
#: Longest transfer destination: a SIP URI's practical limit (RFC 3261 has none;
#: Twilio's ``<Sip>`` noun documents 255 characters). E.164 numbers are ≤ 16.
MAX_DESTINATION_CHARS = 255

HANGUP_TOOL = ToolSpec(
    name="hangup",
    description=(
        "End the phone call. Use it when the caller says goodbye, asks to end the call, "
        "or the conversation is clearly over. Say goodbye before calling it."
    ),
    parameters={
        "type": "object",
        "properties": {
            "reason": {
                "type": "string",
                "maxLength": MAX_REASON_CHARS,
                "description": "Why the call is ending, in a few words.",
            }
        },
        "additionalProperties": False,
    },
)

TRANSFER_TOOL = ToolSpec(
    name="transfer",
    description=(
        "Transfer the caller to a person or another line. Only destinations the operator "
        "allows will work; tell the caller you are transferring them first."
    ),
    parameters={
        "type": "object",
        "properties": {
            "destination": {
                "type": "string",
                "maxLength": MAX_DESTINATION_CHARS,
                "description": (
                    "E.164 phone number (+15551234567) or SIP URI (sip:desk@pbx.example)."
                ),
            }
        },
        "required": ["destination"],
        "additionalProperties": False,
    },
)

#: Every tool a brain can offer, by name.
TOOL_CATALOG: dict[str, ToolSpec] = {tool.name: tool for tool in (HANGUP_TOOL, TRANSFER_TOOL)}
#: What ``RUTSTER_BRAIN_TOOLS`` means when unset: hanging up is always safe to offer.
DEFAULT_TOOL_NAMES = ("hangup",)


def select_tools(names: Iterable[str]) -> tuple[ToolSpec, ...]:
    """The catalog entries for ``names`` in order; ``ValueError`` names an unknown one."""
    chosen: list[ToolSpec] = []
    for raw in names:
        name = raw.strip()
        if not name:
            continue
        if name not in TOOL_CATALOG:
            known = ", ".join(sorted(TOOL_CATALOG))
            raise ValueError(f"unknown tool {name!r}; known tools: {known}")
        if TOOL_CATALOG[name] not in chosen:
            chosen.append(TOOL_CATALOG[name])
    return tuple(chosen)


def parse_tool_list(value: str | None) -> tuple[ToolSpec, ...]:
    """Parse ``RUTSTER_BRAIN_TOOLS`` (comma-separated names; unset → the default; empty → none)."""
    if value is None:
        return select_tools(DEFAULT_TOOL_NAMES)
    return select_tools(value.split(","))
