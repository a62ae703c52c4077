"""The tap ↔ OpenAI Realtime mapping, without sockets (brains/realtime/translator.py)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from rutster.brains.realtime.config import RealtimeBrainConfig
from rutster.brains.realtime.translator import (
    ERROR_AUTH_FAILED,
    ERROR_UPSTREAM,
    MIN_COMMIT_MS,
    RealtimeTranslator,
    session_update,
)
from rutster.protocols.tap import (
    AdvisorySpeechStarted,
    AdvisorySpeechStopped,
    AudioIn,
    AudioOut,
    BrainError,
    Dtmf,
    FunctionCall,
    FunctionCallOutput,
    SpeechStarted,
    SpeechStopped,
    ToolStatus,
    Usage,
)
from rutster.protocols.tool_catalog import HANGUP_TOOL

FRAME = b"\x01\x00" * 480  # 20 ms at 24 kHz
CONFIG = RealtimeBrainConfig(api_key="k", tools=(HANGUP_TOOL,))


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def delta(item: str, pcm: bytes, response: str = "resp_1") -> dict[str, Any]:
    return {
        "type": "response.output_audio.delta",
        "item_id": item,
        "response_id": response,
        "output_index": 0,
        "content_index": 0,
        "delta": base64.b64encode(pcm).decode(),
    }


def created(rid: str = "resp_1") -> dict[str, Any]:
    return {"type": "response.created", "response": {"id": rid, "status": "in_progress"}}


def done(rid: str = "resp_1", status: str = "completed") -> dict[str, Any]:
    return {
        "type": "response.done",
        "response": {
            "id": rid,
            "status": status,
            "usage": {
                "total_tokens": 30,
                "input_tokens": 20,
                "output_tokens": 10,
                "input_token_details": {"text_tokens": 5, "audio_tokens": 15, "cached_tokens": 4},
                "output_token_details": {"text_tokens": 2, "audio_tokens": 8},
            },
        },
    }


def opened() -> RealtimeTranslator:
    t = RealtimeTranslator(CONFIG)
    t.open_session()
    return t


def test_session_update_hands_turns_to_the_gateway() -> None:
    event = session_update(CONFIG)
    session = event["session"]
    assert event["type"] == "session.update"
    assert session["type"] == "realtime"
    assert session["audio"]["input"]["turn_detection"] is None
    assert session["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert session["audio"]["output"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert session["audio"]["output"]["voice"] == "marin"
    assert session["tools"][0]["name"] == "hangup"
    assert session["tools"][0]["type"] == "function"
    assert "parameters" in session["tools"][0]
    json.dumps(event)  # wire-serialisable


def test_audio_in_is_appended_byte_for_byte() -> None:
    t = opened()
    out = t.from_core(AudioIn(FRAME)).to_openai
    assert types(out) == ["input_audio_buffer.append"]
    assert base64.b64decode(out[0]["audio"]) == FRAME


def test_end_of_turn_commits_and_asks_for_a_response() -> None:
    t = opened()
    for _ in range(MIN_COMMIT_MS // 20):
        t.from_core(AudioIn(FRAME))
    assert types(t.from_core(SpeechStopped()).to_openai) == [
        "input_audio_buffer.commit",
        "response.create",
    ]


def test_too_short_a_turn_is_cleared_not_committed() -> None:
    t = opened()
    t.from_core(AudioIn(FRAME))
    assert types(t.from_core(SpeechStopped()).to_openai) == ["input_audio_buffer.clear"]
    assert t.from_core(SpeechStopped()).to_openai == []


def test_output_audio_carries_its_item_and_is_split_to_tap_limits() -> None:
    t = opened()
    t.from_openai(created())
    pcm = b"\x02\x00" * 30_000  # 1.25 s: more than one audio_out may carry
    events = t.from_openai(delta("item_a", pcm)).to_core
    assert all(isinstance(e, AudioOut) and e.item == "item_a" for e in events)
    assert b"".join(e.pcm for e in events if isinstance(e, AudioOut)) == pcm
    assert max(len(e.pcm) for e in events if isinstance(e, AudioOut)) <= 48_000
    assert t.item_audio_ms("item_a") == 1250


def test_odd_byte_deltas_are_rejoined() -> None:
    t = opened()
    first = t.from_openai(delta("i", b"\x01\x00\x02")).to_core
    second = t.from_openai(delta("i", b"\x00\x03\x00")).to_core
    pcm = b"".join(e.pcm for e in first + second if isinstance(e, AudioOut))
    assert pcm == b"\x01\x00\x02\x00\x03\x00"


def test_interruption_cancels_and_truncates_at_what_was_heard() -> None:
    t = opened()
    t.from_openai(created())
    t.from_openai(delta("item_a", b"\x00\x00" * 24_000))  # 1000 ms sent
    out = t.from_core(SpeechStarted(interrupted=True, item="item_a", played_ms=640)).to_openai
    assert types(out) == ["response.cancel", "conversation.item.truncate"]
    assert out[1] == {
        "type": "conversation.item.truncate",
        "item_id": "item_a",
        "content_index": 0,
        "audio_end_ms": 640,
    }


def test_truncation_never_exceeds_the_audio_sent() -> None:
    t = opened()
    t.from_openai(delta("item_a", b"\x00\x00" * 2_400))  # 100 ms
    out = t.from_core(SpeechStarted(interrupted=True, item="item_a", played_ms=5_000)).to_openai
    assert out[-1]["audio_end_ms"] == 100


def test_interruption_of_an_unknown_item_only_cancels() -> None:
    t = opened()
    t.from_openai(created())
    out = t.from_core(SpeechStarted(interrupted=True, item="not_ours", played_ms=10)).to_openai
    assert types(out) == ["response.cancel"]
    assert t.from_core(SpeechStarted(interrupted=False)).to_openai == []


def test_function_calls_wait_for_a_completed_response() -> None:
    t = opened()
    t.from_openai(created("resp_9"))
    held = t.from_openai(
        {
            "type": "response.function_call_arguments.done",
            "call_id": "call_1",
            "name": "hangup",
            "arguments": '{"reason": "bye"}',
            "item_id": "fc_1",
            "response_id": "resp_9",
            "output_index": 0,
        }
    )
    assert held.to_core == []
    after = t.from_openai(done("resp_9")).to_core
    assert FunctionCall("call_1", "hangup", {"reason": "bye"}) in after
    assert any(isinstance(e, Usage) for e in after)


def test_function_calls_of_a_cancelled_response_never_reach_the_core() -> None:
    t = opened()
    t.from_openai(created("resp_9"))
    t.from_openai(
        {
            "type": "response.function_call_arguments.done",
            "call_id": "call_1",
            "name": "hangup",
            "arguments": "{}",
            "response_id": "resp_9",
        }
    )
    after = t.from_openai(done("resp_9", status="cancelled")).to_core
    assert not any(isinstance(e, FunctionCall) for e in after)
    assert t.dropped_function_calls == 1


def test_non_object_arguments_are_answered_to_the_model_directly() -> None:
    t = opened()
    out = t.from_openai(
        {
            "type": "response.function_call_arguments.done",
            "call_id": "call_2",
            "name": "hangup",
            "arguments": "[1, 2",
            "response_id": "resp_1",
        }
    )
    assert out.to_core == []
    assert out.to_openai[0]["item"]["call_id"] == "call_2"
    assert "error" in out.to_openai[0]["item"]["output"]


def test_function_call_output_goes_back_and_asks_for_a_response() -> None:
    t = opened()
    out = t.from_core(FunctionCallOutput("call_1", ToolStatus.REJECTED, {"error": "no"}))
    assert types(out.to_openai) == ["conversation.item.create", "response.create"]
    item = out.to_openai[0]["item"]
    assert item["type"] == "function_call_output"
    assert item["call_id"] == "call_1"
    assert json.loads(item["output"]) == {"status": "rejected", "result": {"error": "no"}}


def test_response_create_waits_while_a_response_is_active() -> None:
    t = opened()
    t.from_openai(created("resp_1"))
    out = t.from_core(FunctionCallOutput("c", ToolStatus.OK, {}))
    assert types(out.to_openai) == ["conversation.item.create"]
    assert types(t.from_openai(done("resp_1")).to_openai) == ["response.create"]


def test_new_turn_during_a_response_cancels_it_then_answers_the_new_turn() -> None:
    t = opened()
    t.from_openai(created("resp_1"))
    for _ in range(10):
        t.from_core(AudioIn(FRAME))
    out = t.from_core(SpeechStopped()).to_openai
    assert types(out) == ["response.cancel", "input_audio_buffer.commit"]
    assert types(t.from_openai(done("resp_1", "cancelled")).to_openai) == ["response.create"]


def test_every_response_done_reports_usage_cancelled_too() -> None:
    t = opened()
    t.from_openai(created())
    usage = [e for e in t.from_openai(done(status="cancelled")).to_core if isinstance(e, Usage)]
    assert usage == [
        Usage(
            model="gpt-realtime",
            input_audio_tokens=15,
            output_audio_tokens=8,
            input_text_tokens=5,
            output_text_tokens=2,
            cached_input_tokens=4,
        )
    ]


def test_openai_speech_events_are_advisory() -> None:
    t = opened()
    started = t.from_openai({"type": "input_audio_buffer.speech_started", "audio_start_ms": 1})
    stopped = t.from_openai({"type": "input_audio_buffer.speech_stopped", "audio_end_ms": 2})
    assert started.to_core == [AdvisorySpeechStarted()]
    assert stopped.to_core == [AdvisorySpeechStopped()]
    assert started.to_openai == stopped.to_openai == []


@pytest.mark.parametrize(
    ("code", "tap_code"),
    [("invalid_api_key", ERROR_AUTH_FAILED), ("invalid_value", ERROR_UPSTREAM)],
)
def test_upstream_errors_become_tap_errors(code: str, tap_code: str) -> None:
    t = opened()
    out = t.from_openai(
        {"type": "error", "error": {"type": "invalid_request_error", "code": code, "message": "m"}}
    ).to_core
    assert len(out) == 1 and isinstance(out[0], BrainError)
    assert out[0].code == tap_code


def test_unknown_and_malformed_server_events_are_counted_not_fatal() -> None:
    t = opened()
    assert t.from_openai({"type": "some.future.event"}).to_core == []
    assert t.from_openai({"no": "type"}).to_core == []
    assert t.from_openai({"type": "response.output_audio.delta", "item_id": 3}).to_core == []
    bad_b64 = {"type": "response.output_audio.delta", "item_id": "i", "delta": "!!!"}
    assert t.from_openai(bad_b64).to_core == []
    assert t.from_openai({"type": "response.done", "response": "x"}).to_core == []
    assert t.unknown_openai_events == 1
    assert t.bad_openai_events == 4


def test_dtmf_becomes_a_conversation_note() -> None:
    out = opened().from_core(Dtmf("7")).to_openai
    assert types(out) == ["conversation.item.create"]
    assert "7" in out[0]["item"]["content"][0]["text"]


def test_reopening_forgets_the_old_session() -> None:
    t = opened()
    t.from_openai(created())
    t.from_openai(delta("item_a", FRAME))
    assert types(t.open_session().to_openai) == ["session.update"]
    assert t.active_response is None
    assert t.item_audio_ms("item_a") is None
