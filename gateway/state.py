"""What one gateway app holds while it runs: config, metrics, live calls."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from gateway.call import Call
from gateway.call_trail import CallTrail
from gateway.config import GatewayConfig
from gateway.metrics import GatewayMetrics
from trunk.call_control import ProviderCallControl

#: Trails of ended calls kept in memory for inspection. Seed decision: the last
#: few hundred calls; durable receipts are the spend gate's ledger (Redis).
MAX_RECENT_TRAILS = 500


@dataclass
class GatewayState:
    """Shared by every handler of one app (``app.state.gateway``)."""

    config: GatewayConfig
    metrics: GatewayMetrics = field(default_factory=GatewayMetrics)
    calls: dict[str, Call] = field(default_factory=dict)
    #: Twilio REST call control (None without TWILIO_ACCOUNT_SID + auth token).
    twilio_call_control: ProviderCallControl | None = None
    recent_trails: OrderedDict[str, CallTrail] = field(default_factory=OrderedDict)

    def remember_trail(self, trail: CallTrail) -> None:
        """Keep an ended call's trail, dropping the oldest beyond the bound."""
        self.recent_trails[trail.session_id] = trail
        while len(self.recent_trails) > MAX_RECENT_TRAILS:
            self.recent_trails.popitem(last=False)
