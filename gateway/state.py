"""What one gateway app holds while it runs: config, metrics, live calls."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.call import Call
from gateway.config import GatewayConfig
from gateway.metrics import GatewayMetrics


@dataclass
class GatewayState:
    """Shared by every handler of one app (``app.state.gateway``)."""

    config: GatewayConfig
    metrics: GatewayMetrics = field(default_factory=GatewayMetrics)
    calls: dict[str, Call] = field(default_factory=dict)
