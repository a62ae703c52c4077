"""Tool calls through a live call, from a brain that abuses them (flood, repeats, bad schemas)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from websockets.asyncio.server import ServerConnection

from rutster.protocols.tap import (
    MAX_ID_CHARS,
    FunctionCall,
    FunctionCallOutput,
    Hello,
    SessionEnd,
    TapEncoder,
    ToolSpec,
    ToolsUpdate,
)
from rutster.protocols.tool_catalog import HANGUP_TOOL, TRANSFER_TOOL
from rutster.tools.twilio_simulator import new_sid
from tests.conftest import (
    TEST_AUTH_TOKEN,
    RunningGateway,
    eventually,
    gateway_config,
    serve_gateway,
)
from tests.support.fake_twilio_rest import FakeTwilioRest
from tests.support.recording_brain import RecordingBrain
from tests.test_gateway_calls import start_stream


class ScriptedToolBrain(RecordingBrain):
    """Answers ``hello`` with a catalog, then sends whatever ``script`` returns."""

    def __init__(self, catalog: tuple[ToolSpec, ...], script: Callable[[], list[Any]]) -> None:
        super().__init__()
        self.catalog = catalog
        self.script = script

    async def respond(self, ws: ServerConnection, encoder: TapEncoder, event: object) -> None:
        """``hello`` → the catalog and the scripted proposals; nothing else."""
        if isinstance(event, Hello):
            await ws.send(encoder.encode(ToolsUpdate(self.catalog), 0.0))
            for proposal in self.script():
                # A str goes on the wire as it is (what no encoder of ours would send).
                await ws.send(
                    proposal if isinstance(proposal, str) else encoder.encode(proposal, 0.0)
                )

    def outputs(self) -> list[FunctionCallOutput]:
        return [e for e in self.events if isinstance(e, FunctionCallOutput)]


async def run(brain: ScriptedToolBrain, wanted: int) -> RunningGateway:
    async with serve_gateway(gateway_config(brain.url)) as gw:
        ws, _, _ = await start_stream(gw)
        await eventually(lambda: len(brain.outputs()) >= wanted, 10)
        await eventually(lambda: len(gw.state.calls) == 1)
        assert not next(iter(gw.state.calls.values())).ended.is_set()
        await ws.close()
        await eventually(lambda: not gw.state.calls)
        return gw


async def test_a_flood_of_proposals_gets_one_answer_each_within_budgets() -> None:
    flood = [
        FunctionCall(f"call_{n}", "transfer", {"destination": "+19005550000"}) for n in range(60)
    ]
    async with ScriptedToolBrain((TRANSFER_TOOL,), lambda: flood) as brain:
        gw = await run(brain, 60)
    outputs = brain.outputs()
    assert sorted(o.id for o in outputs) == sorted(f.id for f in flood)
    (trail,) = gw.state.recent_trails.values()
    reasons = [e.payload["reason"] for e in trail.of_type("tool_call")]
    # No turn has ended: 3 fit the per-turn budget (refused by policy), the rest are over it.
    assert reasons.count("destination_not_allowed") == 3
    assert reasons.count("turn_budget") == 57
    assert not any(isinstance(e, SessionEnd) for e in brain.events[:-1])


async def test_repeated_call_ids_are_answered_once() -> None:
    repeats = [FunctionCall("same", "launch", {}) for _ in range(20)]
    async with ScriptedToolBrain((HANGUP_TOOL,), lambda: repeats) as brain:
        gw = await run(brain, 1)
        dropped = gw.metric(
            "rutster_bad_messages_total", source="brain", reason="duplicate_call_id"
        )
    assert len(brain.outputs()) == 1
    assert brain.outputs()[0].status == "not_implemented"
    assert dropped == 19


async def test_a_tool_with_an_invalid_schema_is_not_callable() -> None:
    # The codec checks only that parameters are an object schema; the registry
    # checks the rest with jsonschema.
    broken = ToolSpec(
        "hangup", "d", {"type": "object", "properties": {"x": {"type": "not-a-type"}}}
    )
    proposal = [FunctionCall("c1", "hangup", {})]
    async with ScriptedToolBrain((broken,), lambda: proposal) as brain:
        gw = await run(brain, 1)
        invalid = gw.metric(
            "rutster_bad_messages_total", source="brain", reason="invalid_tool_schema"
        )
    assert brain.outputs()[0].status == "not_implemented"
    assert invalid == 1


async def test_a_second_hangup_while_the_first_runs_gets_an_error_once() -> None:
    account = "AC" + "2" * 32
    proposals = [FunctionCall("h1", "hangup", {}), FunctionCall("h2", "hangup", {})]
    fake = FakeTwilioRest(account_sid=account, auth_token=TEST_AUTH_TOKEN, delay_s=0.3)
    async with fake, ScriptedToolBrain((HANGUP_TOOL,), lambda: proposals) as brain:
        config = gateway_config(
            brain.url, twilio_account_sid=account, twilio_api_base_url=fake.base_url
        )
        async with serve_gateway(config) as gw:
            call_sid = new_sid("CA")
            fake.register_call(call_sid)
            ws, _, _ = await start_stream(gw, call_sid=call_sid)
            await eventually(lambda: len(brain.outputs()) == 2, 10)
            await eventually(lambda: any(isinstance(e, SessionEnd) for e in brain.events))
            await ws.close()
            await eventually(lambda: not gw.state.calls)
    by_id = {o.id: o for o in brain.outputs()}
    assert by_id["h1"].status == "ok"
    assert by_id["h2"].status == "error"
    assert by_id["h2"].result == {"error": "the call is already ending"}
    (end,) = [e for e in brain.events if isinstance(e, SessionEnd)]
    assert end.reason == "hangup_tool"
    assert [r.form.get("Status") for r in fake.requests] == ["completed"]


async def test_an_oversized_call_id_is_refused_and_the_next_call_is_answered() -> None:
    # Issue 14, finding 9: 30,000 "é" fit the brain's frame as raw UTF-8 (60 KB), the
    # answer escaped (180 KB) did not, and the tool task died unanswered.
    hostile = json.dumps(
        {"v": 1, "type": "function_call", "seq": 0, "ts": 0, "id": "é" * 30_000,
         "name": "hangup", "args": {}},
        ensure_ascii=False,
    )  # fmt: skip
    longest = FunctionCall("ü" * MAX_ID_CHARS, "launch", {})
    proposals = [hostile, longest, FunctionCall("next", "launch", {})]
    async with ScriptedToolBrain((HANGUP_TOOL,), lambda: proposals) as brain:
        gw = await run(brain, 2)
        refused = gw.metric("rutster_bad_messages_total", source="brain", reason="bad_field")
        drops = gw.metric("rutster_tap_send_drops_total", kind="function_call_output")
    assert sorted(o.id for o in brain.outputs()) == sorted([longest.id, "next"])
    assert refused == 1
    assert drops == 0
