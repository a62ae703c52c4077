"""Prometheus metrics of one gateway app.

Each app owns its own ``CollectorRegistry`` so several apps can live in one
process (tests) without clashing. Labels are low-cardinality by construction:
``source`` and ``reason`` take values from fixed code paths, never from input.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from rutster.gateway.event_bus import CallEvent
from rutster.media import compiled, silero_kernel
from rutster.protocols.tool_catalog import TOOL_CATALOG

#: Pacer wake-up lateness buckets (seconds): fine below the 10 ms jitter goal of
#: the foundation issue, coarse above it.
PACER_LATENESS_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.1,
    0.25,
)


#: The ``tool`` label of a tool call to a name the gateway does not implement:
#: a brain may invent any number of names, and each label value is a series
#: kept for the life of the process.
OTHER_TOOL_LABEL = "other"


class GatewayMetrics:
    """The gateway's counters and gauges (served at ``GET /metrics``)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.active_calls = Gauge(
            "rutster_active_calls", "Calls with a live media stream", registry=r
        )
        self.draining = Gauge(
            "rutster_draining",
            "1 while this node drains (SIGTERM: admits nothing, lets its calls end)",
            registry=r,
        )
        self.compiled_kernels = Gauge(
            "rutster_compiled_kernels",
            "1 when the media path runs its compiled C kernels (media/_kernels.c), 0 when "
            "their numpy twins run (built with no C compiler: same verdicts, more CPU a call)",
            registry=r,
        )
        self.compiled_kernels.set(0 if compiled.KERNELS is None else 1)
        self.silero_compiled = Gauge(
            "rutster_silero_compiled",
            "1 when Silero VAD runs in its compiled kernel (media/_silero.c), 0 when in "
            "onnxruntime (not built, or no AVX2/FMA: the same decisions, ~3x its CPU)",
            registry=r,
        )
        self.silero_compiled.set(0 if silero_kernel.KERNEL is None else 1)
        self.call_tasks = Gauge(
            "rutster_call_tasks", "asyncio tasks owned by live calls (0 when idle)", registry=r
        )
        self.calls_total = Counter("rutster_calls", "Calls started", registry=r)
        self.call_task_failures = Counter(
            "rutster_call_task_failures",
            "Call tasks (tap, pacer, grace, spend) that died of an exception; each ended "
            "its call with session_end{error}",
            ["task"],
            registry=r,
        )
        self.frames_in = Counter(
            "rutster_frames_in", "Canonical 20 ms caller frames produced", registry=r
        )
        self.frames_to_brain = Counter(
            "rutster_frames_to_brain", "audio_in frames sent to brains", registry=r
        )
        self.frames_out = Counter(
            "rutster_frames_out", "Canonical 20 ms frames paced out to callers", registry=r
        )
        self.pacer_polls = Counter(
            "rutster_pacer_polls",
            "Times a call's pacer woke and ran the media engine's poll (against "
            "rutster_frames_out: wake-ups per frame sent)",
            registry=r,
        )
        self.playout_underruns = Counter(
            "rutster_playout_underruns", "Gaps inside a brain item heard by callers", registry=r
        )
        self.playout_underrun_ms = Counter(
            "rutster_playout_underrun_ms", "Milliseconds of such gaps", registry=r
        )
        self.playout_overflow_drops = Counter(
            "rutster_playout_overflow_drops",
            "Times the playout buffer dropped its oldest audio (brain flooding)",
            registry=r,
        )
        self.playout_overflow_dropped_ms = Counter(
            "rutster_playout_overflow_dropped_ms", "Milliseconds of audio dropped so", registry=r
        )
        self.tap_connects = Counter("rutster_tap_connects", "Brain connections opened", registry=r)
        self.tap_reconnects = Counter(
            "rutster_tap_reconnects", "Brain connections re-established after a loss", registry=r
        )
        self.tap_connect_failures = Counter(
            "rutster_tap_connect_failures", "Failed attempts to reach a brain", registry=r
        )
        self.tap_send_drops = Counter(
            "rutster_tap_send_drops",
            "Messages to a brain dropped (brain down or not reading)",
            ["kind"],
            registry=r,
        )
        self.unknown_events = Counter(
            "rutster_unknown_events",
            "Well-formed messages of an unknown type",
            ["source"],
            registry=r,
        )
        self.http_connections_closed = Counter(
            "rutster_http_connections_closed",
            "HTTP connections the gateway closed: a header or body deadline passed, "
            "or one source held too many (gateway/http_guard.py)",
            ["reason"],
            registry=r,
        )
        self.bad_messages = Counter(
            "rutster_bad_messages",
            "Malformed or out-of-protocol messages dropped or refused",
            ["source", "reason"],
            registry=r,
        )
        self.brain_events = Counter(
            "rutster_brain_events", "Brain messages received, by type", ["type"], registry=r
        )
        self.turn_events = Counter(
            "rutster_turn_events",
            "Turn decisions sent to brains (speech_started, turn_ended)",
            ["event"],
            registry=r,
        )
        self.tool_calls = Counter(
            "rutster_tool_calls",
            "Brain tool calls answered by the registry, by tool (gateway's, or other) and status",
            ["tool", "status"],
            registry=r,
        )
        self.reflex_transitions = Counter(
            "rutster_reflex_transitions",
            "Reflex-loop state changes, by from and to state",
            ["from_state", "to_state"],
            registry=r,
        )
        self.barge_ins = Counter(
            "rutster_barge_ins",
            "Barge-in steps: paused, confirmed, resumed (a noise burst), answer_cut",
            ["step"],
            registry=r,
        )
        self.signature_failures = Counter(
            "rutster_signature_failures",
            "Requests refused for a missing or invalid X-Twilio-Signature",
            ["endpoint"],
            registry=r,
        )
        self.stream_token_failures = Counter(
            "rutster_stream_token_failures",
            "Media sockets refused for a bad stream token",
            registry=r,
        )
        self.stream_token_replays = Counter(
            "rutster_stream_token_replays",
            "Media sockets refused because their call's stream token was already used "
            "(on any node: the mark is in Redis)",
            registry=r,
        )
        self.tap_url_rejections = Counter(
            "rutster_tap_url_rejections", "Brain URLs refused by the allowlist", registry=r
        )
        self.pacer_lateness = Histogram(
            "rutster_pacer_lateness_seconds",
            "How late the pacer woke for a frame deadline (outbound pacing jitter)",
            buckets=PACER_LATENESS_BUCKETS,
            registry=r,
        )
        self.admissions = Counter(
            "rutster_admissions",
            "Spend-gate admission decisions, by outcome and reason",
            ["outcome", "reason"],
            registry=r,
        )
        self.loop_busy = Gauge(
            "rutster_loop_busy_ratio",
            "Share of wall time the event loop's thread was on the CPU over the overload "
            "guard's window (NaN until it holds enough samples)",
            registry=r,
        )
        self.loop_lag = Gauge(
            "rutster_loop_lag_seconds",
            "How late the event loop woke (P90 over the overload guard's window)",
            registry=r,
        )
        self.capacity_estimate = Gauge(
            "rutster_capacity_estimate_calls",
            "Calls the event loop could hold at the guard's CPU limit at today's cost per "
            "call (NaN with too few calls to say)",
            registry=r,
        )
        self.spend_settled_micros = Counter(
            "rutster_spend_settled_micros",
            "Actual cost settled for ended calls (micro-USD)",
            registry=r,
        )
        self.spend_limit_ends = Counter(
            "rutster_spend_limit_ends",
            "Calls ended by the spend gate, by reason (budget_exhausted, max_duration)",
            ["reason"],
            registry=r,
        )
        self.spend_usage_anomalies = Counter(
            "rutster_spend_usage_anomalies",
            "Brain usage reports clamped as implausible, by kind (over_ceiling: more tokens "
            "than the call's audio can carry; over_reservation: cost above what was reserved)",
            ["kind"],
            registry=r,
        )
        self.spend_usage_excess_micros = Counter(
            "rutster_spend_usage_excess_micros",
            "Cost not settled because it came from clamped usage (micro-USD)",
            registry=r,
        )
        self.spend_store_errors = Gauge(
            "rutster_spend_store_errors",
            "Redis failures the spend gate met (admission, metering, settlement) since start",
            registry=r,
        )
        self.orphaned_calls = Gauge(
            "rutster_orphaned_calls_settled",
            "Calls of dead gateway nodes this node settled from their last reported cost "
            "(end reason node_lost) since start",
            registry=r,
        )
        self.api_auth_failures = Counter(
            "rutster_api_auth_failures", "REST API requests with an unknown key", registry=r
        )
        self.api_rate_limited = Counter(
            "rutster_api_rate_limited", "REST API requests refused by the rate limit", registry=r
        )
        self.api_store_unavailable = Counter(
            "rutster_api_store_unavailable",
            "REST API requests answered 503 because Redis was unreachable",
            registry=r,
        )

    def on_call_event(self, event: CallEvent) -> None:
        """Event-bus subscriber: count what the calls' buses carry."""
        kind = event.type
        payload = event.payload
        if kind == "state":
            self.reflex_transitions.labels(str(payload["from"]), str(payload["to"])).inc()
        elif kind in ("speech_started", "turn_ended"):
            self.turn_events.labels(kind).inc()
        elif kind.startswith("barge_in_"):
            self.barge_ins.labels(kind.removeprefix("barge_in_")).inc()
        elif kind == "answer_cut":
            self.barge_ins.labels("answer_cut").inc()
        elif kind == "limit_reached":
            self.spend_limit_ends.labels(str(payload["reason"])).inc()
        elif kind == "settled":
            actual = payload["actual"]
            if isinstance(actual, int) and actual > 0:
                self.spend_settled_micros.inc(actual)
        elif kind == "usage_anomaly":
            self.spend_usage_anomalies.labels(str(payload["kind"])).inc()
            if isinstance(excess := payload["excess_micros"], int) and excess > 0:
                self.spend_usage_excess_micros.inc(excess)
        elif kind == "tool_call":
            tool = str(payload["tool"])
            label = tool if tool in TOOL_CATALOG else OTHER_TOOL_LABEL
            self.tool_calls.labels(label, str(payload["status"])).inc()
