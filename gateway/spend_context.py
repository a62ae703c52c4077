"""A call's admission, carried from the voice webhook to its media socket.

The webhook admits the call (spend gate) and the media socket, possibly on
another gateway process, meters it. What the socket needs (call id, tenant,
caps, first reservation) travels in a ``<Parameter>`` of the TwiML and is
bound into the stream token's HMAC, so it cannot be altered on the way and
the socket needs no Redis read to start metering (calls still start while
Redis is briefly away, on what they were admitted with).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rutster.spend.tenant_id import is_tenant_id

#: ``<Parameter>`` name carrying the encoded context into ``start.customParameters``.
PARAM_SPEND = "rutster_spend"
#: Format version (first field), so a rolling upgrade can tell formats apart.
CONTEXT_VERSION = "v1"
_CALL_ID = re.compile(r"call_[0-9a-f]{1,64}")
_DIRECTIONS = ("inbound", "outbound")
#: Most characters an encoded context may have (call id + tenant + numbers).
MAX_CONTEXT_CHARS = 256


class BadSpendContext(ValueError):
    """The parameter is missing or malformed."""


@dataclass(frozen=True, slots=True)
class SpendContext:
    """What the media socket needs to meter an admitted call."""

    call_id: str
    tenant: str
    direction: str
    max_duration_s: int
    max_cost: int
    first_quantum: int
    #: Admitted while Redis was down (fail-open policy).
    degraded: bool = False

    def encode(self) -> str:
        """``v1|call_id|tenant|direction|max_duration_s|max_cost|quantum|degraded``."""
        return "|".join(
            (
                CONTEXT_VERSION,
                self.call_id,
                self.tenant,
                self.direction,
                str(self.max_duration_s),
                str(self.max_cost),
                str(self.first_quantum),
                "1" if self.degraded else "0",
            )
        )

    @classmethod
    def decode(cls, text: str | None) -> SpendContext:
        """Parse :meth:`encode`'s output; :class:`BadSpendContext` if it is not one."""
        if not text or len(text) > MAX_CONTEXT_CHARS:
            raise BadSpendContext("missing or oversized spend context")
        parts = text.split("|")
        if len(parts) != 8 or parts[0] != CONTEXT_VERSION:
            raise BadSpendContext("spend context has the wrong shape")
        _, call_id, tenant, direction, duration, cost, quantum, degraded = parts
        if not _CALL_ID.fullmatch(call_id) or not is_tenant_id(tenant):
            raise BadSpendContext("spend context has a malformed call id or tenant")
        if direction not in _DIRECTIONS or degraded not in ("0", "1"):
            raise BadSpendContext("spend context has a malformed direction or flag")
        numbers = []
        for raw in (duration, cost, quantum):
            if not raw.isdigit() or len(raw) > 16:
                raise BadSpendContext("spend context has a malformed number")
            numbers.append(int(raw))
        return cls(call_id, tenant, direction, numbers[0], numbers[1], numbers[2], degraded == "1")
