"""The in-core tool registry and the transfer allowlist (gateway/tool_registry.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rutster.gateway.tool_registry import (
    MAX_CATALOG_TOOLS,
    ToolLimits,
    ToolOutcome,
    ToolRegistry,
    check_schemas_paced,
)
from rutster.gateway.transfer_allowlist import TransferAllowlist, normalize_destination
from rutster.protocols.tap import FunctionCall, ToolSpec, ToolStatus, ToolsUpdate
from rutster.protocols.tool_catalog import HANGUP_TOOL, TOOL_CATALOG, TRANSFER_TOOL, parse_tool_list


async def _ok(args: dict[str, Any]) -> ToolOutcome:
    return ToolOutcome(ToolStatus.OK, {"echo": sorted(args)}, "ok")


def registry(**limits: int) -> ToolRegistry:
    reg = ToolRegistry(
        {"hangup": _ok, "transfer": _ok},
        own_schemas={n: TOOL_CATALOG[n].parameters for n in ("hangup", "transfer")},
        limits=ToolLimits(**limits),
    )
    reg.update_catalog(ToolsUpdate((HANGUP_TOOL, TRANSFER_TOOL)))
    return reg


async def test_a_valid_call_runs_and_leaves_a_content_free_receipt() -> None:
    out, receipt = await registry().dispose(FunctionCall("c1", "hangup", {"reason": "secret"}))
    assert out.status is ToolStatus.OK and out.id == "c1"
    payload = receipt.as_payload()
    assert payload["tool"] == "hangup" and payload["status"] == "ok"
    assert "secret" not in repr(payload)
    assert set(payload) == {"call_id", "tool", "status", "reason", "duration_ms", "truncated"}


async def test_unknown_tool_is_not_implemented() -> None:
    out, receipt = await registry().dispose(FunctionCall("c1", "launch_missiles", {}))
    assert out.status is ToolStatus.NOT_IMPLEMENTED
    assert receipt.reason == "not_in_catalog"


async def test_catalog_tool_without_implementation_is_not_implemented() -> None:
    reg = registry()
    extra = ToolSpec("lookup", "d", {"type": "object"})
    reg.update_catalog(ToolsUpdate((HANGUP_TOOL, extra)))
    out, receipt = await reg.dispose(FunctionCall("c1", "lookup", {}))
    assert out.status is ToolStatus.NOT_IMPLEMENTED and receipt.reason == "no_implementation"


async def test_the_latest_catalog_wins() -> None:
    reg = registry()
    reg.update_catalog(ToolsUpdate((HANGUP_TOOL,)))
    out, _ = await reg.dispose(FunctionCall("c1", "transfer", {"destination": "+15551234567"}))
    assert out.status is ToolStatus.NOT_IMPLEMENTED


@pytest.mark.parametrize(
    ("name", "args", "fragment"),
    [
        ("transfer", {}, "'destination' is a required property"),
        ("transfer", {"destination": 5}, "destination: 5 is not of type 'string'"),
        ("hangup", {"reason": "x", "extra": 1}, "Additional properties"),
        ("hangup", {"reason": "x" * 500}, "reason: value fails 'maxLength': 200"),
    ],
)
async def test_schema_failures_are_errors_with_the_validation_message(
    name: str, args: dict[str, Any], fragment: str
) -> None:
    out, receipt = await registry().dispose(FunctionCall("c1", name, args))
    assert out.status is ToolStatus.ERROR
    assert receipt.reason == "invalid_args"
    assert isinstance(out.result, dict) and fragment in str(out.result["error"])


async def test_the_gateway_schema_applies_even_if_the_brain_widens_it() -> None:
    reg = registry()
    loose = ToolSpec("hangup", "d", {"type": "object"})  # accepts anything
    reg.update_catalog(ToolsUpdate((loose,)))
    out, _ = await reg.dispose(FunctionCall("c1", "hangup", {"reason": 42}))
    assert out.status is ToolStatus.ERROR


def test_invalid_brain_schemas_are_dropped_from_the_catalog() -> None:
    reg = registry()
    bad = ToolSpec("hangup", "d", {"type": "no-such-type"})
    assert reg.update_catalog(ToolsUpdate((bad, TRANSFER_TOOL))) == ["hangup"]
    assert reg.catalog == ("transfer",)


async def test_per_turn_budget_rejects_and_resets_on_a_new_turn() -> None:
    reg = registry(calls_per_turn=2)
    statuses = [
        (await reg.dispose(FunctionCall(f"c{i}", "hangup", {})))[0].status for i in range(3)
    ]
    assert statuses == [ToolStatus.OK, ToolStatus.OK, ToolStatus.REJECTED]
    reg.turn_ended()
    assert (await reg.dispose(FunctionCall("c9", "hangup", {})))[0].status is ToolStatus.OK


async def test_per_call_budget_is_final() -> None:
    reg = registry(calls_per_turn=10, calls_per_call=2)
    for i in range(2):
        await reg.dispose(FunctionCall(f"c{i}", "hangup", {}))
        reg.turn_ended()
    out, receipt = await reg.dispose(FunctionCall("c3", "hangup", {}))
    assert out.status is ToolStatus.REJECTED and receipt.reason == "call_budget"


async def test_a_slow_tool_times_out_as_an_error() -> None:
    async def slow(args: dict[str, Any]) -> ToolOutcome:
        await asyncio.sleep(10)
        raise AssertionError("not reached")

    reg = ToolRegistry({"hangup": slow}, own_schemas={}, limits=ToolLimits(timeout_ms=50))
    reg.update_catalog(ToolsUpdate((HANGUP_TOOL,)))
    out, receipt = await reg.dispose(FunctionCall("c1", "hangup", {}))
    assert out.status is ToolStatus.ERROR and receipt.reason == "timeout"
    assert 40 <= receipt.duration_ms < 1000


async def test_a_crashing_tool_is_an_error_not_a_crash() -> None:
    async def broken(args: dict[str, Any]) -> ToolOutcome:
        raise RuntimeError("bug")

    reg = ToolRegistry({"hangup": broken}, own_schemas={})
    reg.update_catalog(ToolsUpdate((HANGUP_TOOL,)))
    out, receipt = await reg.dispose(FunctionCall("c1", "hangup", {}))
    assert out.status is ToolStatus.ERROR and receipt.reason == "internal_error"


async def test_big_results_are_truncated_and_marked() -> None:
    async def chatty(args: dict[str, Any]) -> ToolOutcome:
        return ToolOutcome(ToolStatus.OK, {"text": "é" * 5_000}, "ok")

    reg = ToolRegistry({"hangup": chatty}, own_schemas={}, limits=ToolLimits(result_max_bytes=100))
    reg.update_catalog(ToolsUpdate((HANGUP_TOOL,)))
    out, receipt = await reg.dispose(FunctionCall("c1", "hangup", {}))
    assert receipt.truncated
    assert isinstance(out.result, dict) and out.result["truncated"] is True
    assert len(str(out.result["preview"]).encode()) <= 100


def test_each_call_id_is_answered_once() -> None:
    reg = registry()
    assert reg.claim("c1")
    assert not reg.claim("c1")
    assert reg.claim("c2")


def test_tool_list_parsing() -> None:
    assert [t.name for t in parse_tool_list(None)] == ["hangup"]
    assert [t.name for t in parse_tool_list("hangup, transfer,hangup")] == ["hangup", "transfer"]
    assert parse_tool_list("") == ()
    with pytest.raises(ValueError, match="unknown tool 'fly'"):
        parse_tool_list("hangup,fly")


def test_transfer_allowlist() -> None:
    allow = TransferAllowlist.parse("+15551234567, +4420*, SIP:Desk@PBX.example.com")
    assert allow.allows("+15551234567")
    assert not allow.allows("+15551234568")
    assert allow.allows("+442071234567")
    assert allow.allows("sip:Desk@pbx.EXAMPLE.com")
    assert not allow.allows("sip:other@pbx.example.com")
    assert not allow.allows("tel:+15551234567")
    assert not allow.allows("")
    assert not TransferAllowlist.parse("")
    assert not TransferAllowlist().allows("+15551234567")


@pytest.mark.parametrize("entry", ["sip:*", "+1 555", "*", "5551234567", "+*"])
def test_transfer_allowlist_refuses_bad_entries(entry: str) -> None:
    with pytest.raises(ValueError, match="bad transfer allowlist entry"):
        TransferAllowlist.parse(entry)


def test_destination_normalisation() -> None:
    assert normalize_destination(" +15551234567 ") == "+15551234567"
    assert normalize_destination("SIPS:a@B.C;transport=tls") == "sips:a@b.c;transport=tls"
    with pytest.raises(ValueError):
        normalize_destination("+0123")


async def test_brain_schema_patterns_are_not_evaluated() -> None:
    # A catastrophic-backtracking pattern would stall the loop if evaluated.
    evil = ToolSpec(
        "hangup",
        "d",
        {"type": "object", "properties": {"reason": {"type": "string", "pattern": "^(a+)+$"}}},
    )
    reg = registry()
    reg.update_catalog(ToolsUpdate((evil,)))
    out, _ = await reg.dispose(FunctionCall("c1", "hangup", {"reason": "a" * 60 + "!"}))
    assert out.status is ToolStatus.OK


# ---- cost of a catalog (issue 14, finding 1) ------------------------------------------


def _many_tools(n: int, salt: str) -> ToolsUpdate:
    """``n`` tools, each with its own schema (nothing remembered helps)."""
    return ToolsUpdate(
        tuple(
            ToolSpec(
                f"t{i}",
                "d",
                {
                    "type": "object",
                    "properties": {f"{salt}{i}_{k}": {"type": "string"} for k in range(10)},
                },
            )
            for i in range(n)
        )
    )


def test_a_catalog_keeps_at_most_max_catalog_tools() -> None:
    reg = registry()
    update = _many_tools(MAX_CATALOG_TOOLS + 5, "cap")
    left_out = reg.update_catalog(update)
    assert len(reg.catalog) == MAX_CATALOG_TOOLS
    assert left_out == [t.name for t in update.tools[MAX_CATALOG_TOOLS:]]


async def test_checking_a_large_catalog_never_holds_the_loop() -> None:
    # Unpaced, 120 tools held the loop 2.2 s. Paced, the longest hold is one check.
    update = _many_tools(MAX_CATALOG_TOOLS, "paced")
    gaps: list[float] = []
    done = False

    async def ticker() -> None:
        loop = asyncio.get_running_loop()
        last = loop.time()
        while not done:
            await asyncio.sleep(0)
            now = loop.time()
            gaps.append(now - last)
            last = now

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    started = asyncio.get_running_loop().time()
    await check_schemas_paced(update)
    took = asyncio.get_running_loop().time() - started
    done = True
    await tick
    reg = registry()
    assert reg.update_catalog(update) == []  # all remembered: no check left to do
    # The work was spread over many turns of the loop (one check a turn; counted, not
    # timed: with another test process on the core a turn can take tens of ms), and no
    # turn held it anything like the 2.2 s the unpaced checks did.
    assert len(gaps) >= MAX_CATALOG_TOOLS // 2, (len(gaps), took)
    assert max(gaps) < 0.25, max(gaps)
