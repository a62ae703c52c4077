"""The API's call resource says which provider carried a call, as the record says it."""

from __future__ import annotations

import pytest

from rutster.gateway.api.routes import call_resource
from rutster.gateway.api.schemas import CALL_SCHEMA
from rutster.gateway.api.validation import validator_for
from rutster.gateway.config import GatewayConfig
from rutster.gateway.state import GatewayState
from rutster.spend.store import call_record

RAW = {
    "tenant": "acme",
    "status": "ended",
    "direction": "outbound",
    "caller": "+15557654321",
    "to": "+15551234567",
    "created_ms": "1764900000000",
    "answered_ms": "1764900001000",
    "ended_ms": "1764900031000",
    "end_reason": "completed",
    "reserved": "0",
    "cost": "12500",
    "spent": "12500",
    "seq": "3",
    "max_cost": "1000000",
    "max_duration_s": "600",
}


@pytest.mark.parametrize(
    ("stored", "shown"),
    [
        ("twilio", "twilio"),
        ("sip", "sip"),
        # Recorded by a newer gateway node during a rolling upgrade: shown as it is,
        # not as "twilio" (what this resource used to show for any provider it did not know).
        ("telnyx", "telnyx"),
        ("", "unknown"),
        ("Not a name!", "unknown"),
    ],
)
def test_the_provider_is_the_records(stored: str, shown: str) -> None:
    resource = call_resource(
        GatewayState(config=GatewayConfig()),
        call_record("call_0123abcd", {**RAW, "provider": stored}),
    )
    assert resource["provider"] == shown
    validator_for(CALL_SCHEMA).validate(resource)  # the documented response shape
