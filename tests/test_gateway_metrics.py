"""Gateway metrics: what peers can and cannot do to them."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from rutster.gateway.app import create_app
from rutster.gateway.config import GatewayConfig
from rutster.gateway.event_bus import CallEvent
from rutster.gateway.metrics import OTHER_TOOL_LABEL, GatewayMetrics
from rutster.media import compiled, silero_kernel
from rutster.protocols.tool_catalog import TOOL_CATALOG


def _tool_call(tool: str, status: str = "not_implemented") -> CallEvent:
    return CallEvent("s1", 0, "tool", "tool_call", {"tool": tool, "status": status})


def test_invented_tool_names_do_not_grow_the_metrics() -> None:
    """Issue 14, finding 6: every tool name a brain invented became a new
    ``rutster_tool_calls_total`` series (2,000 names: /metrics 9 KB -> 356 KB, never
    shrinking). Only the gateway's own tools are labelled; the rest count as other."""
    metrics = GatewayMetrics()
    before = len(generate_latest(metrics.registry))
    for n in range(2_000):
        metrics.on_call_event(_tool_call(f"invented_{n}"))
    for name in TOOL_CATALOG:
        metrics.on_call_event(_tool_call(name, "ok"))
    grown = len(generate_latest(metrics.registry)) - before
    assert grown < 2_000, grown
    sample = metrics.registry.get_sample_value
    assert (
        sample("rutster_tool_calls_total", {"tool": OTHER_TOOL_LABEL, "status": "not_implemented"})
        == 2_000
    )
    for name in TOOL_CATALOG:
        assert sample("rutster_tool_calls_total", {"tool": name, "status": "ok"}) == 1


def test_the_metrics_say_whether_the_compiled_kernels_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert "rutster_compiled_kernels 1.0" in generate_latest(GatewayMetrics().registry).decode()
    monkeypatch.setattr(compiled, "KERNELS", None)  # a build without a C compiler
    assert "rutster_compiled_kernels 0.0" in generate_latest(GatewayMetrics().registry).decode()


def test_the_metrics_say_whether_silero_runs_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    built = silero_kernel.KERNEL is not None
    text = generate_latest(GatewayMetrics().registry).decode()
    assert f"rutster_silero_compiled {1.0 if built else 0.0}" in text
    monkeypatch.setattr(silero_kernel, "KERNEL", None)  # not built, or no AVX2/FMA
    assert "rutster_silero_compiled 0.0" in generate_latest(GatewayMetrics().registry).decode()


def test_the_silero_metric_follows_the_configured_engine() -> None:
    forced = create_app(GatewayConfig.from_env({"RUTSTER_SILERO_ENGINE": "onnxruntime"}))
    sample = forced.state.gateway.metrics.registry.get_sample_value
    assert sample("rutster_silero_compiled") == 0.0
    default = create_app(GatewayConfig.from_env({}))
    expected = 1.0 if silero_kernel.KERNEL is not None else 0.0
    assert (
        default.state.gateway.metrics.registry.get_sample_value("rutster_silero_compiled")
        == expected
    )
