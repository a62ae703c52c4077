"""Prometheus metrics of one SIP worker process (``RUTSTER_SIP_METRICS_PORT`` serves them).

Own registry per worker so tests can run several in one process; labels are
low-cardinality reason labels only (no URIs, no source addresses).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server


class SipWorkerMetrics:
    """Counters a worker keeps about INVITEs, its gateway link and its media sockets."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.invites = Counter(
            "rutster_sip_invites",
            "INVITEs by outcome: an access-policy reason, admitted, refused or no_gateway",
            ["outcome"],
            registry=self.registry,
        )
        self.unparsed_requests = Counter(
            "rutster_sip_unparsed_requests",
            "Messages pjsip's parser refused, by outcome: a credential scheme (basic, bearer,"
            " other) taken out so the request could be answered, or unparseable (left dropped)",
            ["outcome"],
            registry=self.registry,
        )
        self.bad_messages = Counter(
            "rutster_sip_bad_messages",
            "Dropped messages from the gateway by channel and reason",
            ["channel", "reason"],
            registry=self.registry,
        )
        self.uplink_dropped = Counter(
            "rutster_sip_uplink_dropped_frames",
            "Caller frames dropped because the gateway socket fell behind",
            registry=self.registry,
        )
        self.active_legs = Gauge(
            "rutster_sip_active_legs", "SIP legs held by this worker", registry=self.registry
        )

    def serve(self, host: str, port: int) -> None:
        """Serve ``/metrics`` on ``host:port`` (a daemon thread)."""
        start_http_server(port, addr=host, registry=self.registry)
