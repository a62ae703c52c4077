"""bench/reflex_cost.py: replays reproduce the recorded call, and every part is measured."""

from __future__ import annotations

from bench.reflex_cost import measure, scenarios


def test_a_replayed_call_gives_the_recorded_outputs_and_positive_costs() -> None:
    # The clean interruption call: caller, assistant, pauses, clears and marks all run.
    name, build = next((n, b) for n, b in scenarios("tune") if n.endswith("clean line"))
    cost = measure(name, build(), repeats=1)  # raises if a replay's outputs differ
    assert cost.frames > 1_000
    assert cost.engine_ns > 0 and cost.echo_ns > 0 and cost.vad_ns > 0
    assert cost.inbound_ns > 0 and cost.outbound_ns > 0
    assert 0 < cost.silero_windows < cost.frames


def test_the_echo_brain_call_replays_with_the_brains_hello() -> None:
    # The rig gives the engine the echo brain's hello as it is built: the replay must too,
    # or caller speech cuts the echo (the brain is not interruptible) and the replay
    # measures another call.
    name, build = next((n, b) for n, b in scenarios("tune") if n.startswith("echo brain"))
    rig = build()
    cost = measure(name, rig, repeats=1)  # raises if a replay's outputs differ
    assert rig.clears_ms == []  # never interrupted
    assert all(v.delay_ms is None for v in rig.verdicts)  # no line echo to find
    # Every caller frame comes back and is played: the outbound side runs on every frame.
    assert rig.engine.frames_out >= cost.frames - 10
    assert cost.outbound_ns > 0 and cost.echo_ns > 0
