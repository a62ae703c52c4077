"""The per-call object: the asyncio driver of one call's media engine, tap client and spend.

One ``Call`` exists per live media stream. It is provider-neutral: a trunk
adapter feeds it :mod:`protocols.ingress` and gives it a ``CallEdge`` to send
commands back. Everything done to the audio (transforms, reflex loop,
playout, pacer, ledger, mark and clear policy) is the sans-I/O
:class:`~gateway.media_engine.MediaEngine`; this module only feeds it events
with the time and carries out the commands it returns. It owns two tasks (the brain
connection and the pacer), an optional grace watchdog, the spend meter when
the call is metered, and one short task per tool call in flight; ``end()``
leaves none behind. The reflex loop decides the caller's turns, the tool
registry answers the brain's proposals, and the call's :class:`CallSpend`
extends its reservation, ends it when money or time runs out, and settles it.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from rutster.gateway.call_trail import CallTrail
from rutster.gateway.config import GatewayConfig
from rutster.gateway.event_bus import CallEvent, EventBus
from rutster.gateway.media_engine import (
    BadInput,
    BrainAudio,
    EngineCommand,
    MediaEngine,
    PlayoutOverflow,
)
from rutster.gateway.metrics import GatewayMetrics
from rutster.gateway.reflex import ReflexLoop
from rutster.gateway.tap_client import TapClient
from rutster.gateway.tool_registry import ToolOutcome, ToolRegistry, check_schemas_paced
from rutster.media.echo_gate import EchoGate, EchoGateConfig
from rutster.media.formats import samples_to_ms
from rutster.media.pacer import Pacer
from rutster.media.playout import PlayoutBuffer
from rutster.media.vad import SPEECH_THRESHOLD, make_detector
from rutster.protocols.call_control import CallControlFailure, ProviderCallControl, SupportsGoodbye
from rutster.protocols.ingress import (
    AudioReceived,
    DtmfReceived,
    IngressCommand,
    IngressEvent,
    MarkPlayed,
    StreamConnected,
    StreamStarted,
    StreamStopped,
)
from rutster.protocols.tap import (
    AdvisorySpeechStarted,
    AdvisorySpeechStopped,
    AudioClear,
    AudioOut,
    AudioSpec,
    BrainError,
    BrainEvent,
    BrainHello,
    Bye,
    CallInfo,
    Dtmf,
    FunctionCall,
    Hello,
    SessionEndReason,
    SpeechStarted,
    SpeechStopped,
    ToolStatus,
    ToolsUpdate,
    Usage,
)
from rutster.protocols.tool_catalog import TOOL_CATALOG
from rutster.spend.gate import CallSpend
from rutster.spend.store import StoreUnavailable

log = logging.getLogger(__name__)

#: Ending a call: cancel its tasks and wait this long, up to this many rounds (a task
#: that swallowed a cancel gets it again). Tasks stop in microseconds normally; 2 s
#: covers a Redis call in flight (socket timeout 0.5 s x retries, spend/store.py).
TASK_STOP_WAIT_S = 2.0
TASK_STOP_ROUNDS = 3
#: How often the grace watchdog looks at the brain's state (when a grace period is set).
GRACE_CHECK_INTERVAL_S = 0.25
#: Event types that become durable receipts in Redis (beside the in-memory trail):
#: admission, spend, tools, brain errors, the turn decisions and barge-ins, the end.
RECEIPT_STAGES = frozenset({"call", "tool", "brain", "spend"})
RECEIPT_REFLEX_TYPES = frozenset(
    {"turn_ended", "barge_in_confirmed", "barge_in_resumed", "answer_cut"}
)
#: Receipts buffered between flushes; beyond it the oldest are dropped (counted).
#: Seed decision: a flush happens every spend tick (1 s), far below this.
MAX_PENDING_RECEIPTS = 256
#: Spend end reasons (the meter's) and the session_end reason the brain gets for each.
SPEND_END_REASONS = {
    "budget_exhausted": SessionEndReason.BUDGET_EXHAUSTED,
    "max_duration": SessionEndReason.MAX_DURATION,
}


#: The shortest wait the pacer arms for a deadline (s). uvloop, uvicorn's event loop
#: wherever it is installed (``uvicorn[standard]`` installs it), keeps time and timers
#: in whole milliseconds (libuv's ``uv_now`` and ``uv_timer_start``; uvloop's
#: ``call_later`` rounds the delay to a millisecond), so a timer fires up to ~0.7 ms
#: before a deadline read on ``time.monotonic()`` (measured: 30 % of 200 timers), and
#: re-arming for the fraction left asks for a 0 ms timer that fires at once, again and
#: again until the deadline passes (measured: 109 re-arms for 0.45 ms; in 10 echo
#: calls 64 % of the pacer's polls released nothing). Waiting at least 1 ms costs a
#: frame at most that much lateness, well inside the pacer's lead.
MIN_PACER_WAIT_S = 0.001


def _fire(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(True)


def monotonic_ms() -> float:
    """The gateway's clock: monotonic milliseconds."""
    return time.monotonic() * 1000.0


class CallEdge(Protocol):
    """How a call talks back to its provider leg (one per trunk adapter)."""

    async def send(self, command: IngressCommand) -> None:
        """Send one command (audio, mark, clear) to the provider."""

    async def close(self, reason: str) -> None:
        """End the provider leg's media stream."""


class Call:
    """One live call, from its ``StreamStarted`` to ``end()``."""

    def __init__(
        self,
        started: StreamStarted,
        *,
        tap_url: str,
        config: GatewayConfig,
        metrics: GatewayMetrics,
        edge: CallEdge,
        call_control: ProviderCallControl | None = None,
        clock_ms: Callable[[], float] = monotonic_ms,
        spend: CallSpend | None = None,
        goodbye_text: str | None = None,
    ) -> None:
        self.context = started.call
        self.session_id = "ses_" + secrets.token_hex(8)
        #: The public call id (``call_…``) when the spend gate admitted the call.
        self.call_id = spend.call_id if spend is not None else None
        #: This call's spend (None: not metered, e.g. unit tests of the media path).
        self.spend = spend
        self._goodbye_text = goodbye_text
        self._pending_receipts: list[dict[str, str | int | float | bool | None]] = []
        self.receipts_dropped = 0
        self.tap_url = tap_url
        self._config = config
        self._metrics = metrics
        self._edge = edge
        self._call_control = call_control
        self._clock_ms = clock_ms
        self.tap = TapClient(
            tap_url,
            make_hello=self._hello,
            on_event=self._on_brain_event,
            metrics=metrics,
            clock_ms=clock_ms,
            call_label=self.session_id,
        )
        # Pacer wake-ups: a flag plus a bare future (cheaper than Event + timeout; the
        # pacer wakes 1.1-2.1 times a frame sent, 55-105 times a second in an echo call:
        # rutster_pacer_polls_total, MIN_PACER_WAIT_S).
        self._wake_pending = False
        self._waiter: asyncio.Future[bool] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._ending = False
        self.ended = asyncio.Event()
        self.end_reason: SessionEndReason | None = None
        self.started_ms = clock_ms()
        self.tools: ToolsUpdate | None = None
        self.bus = EventBus(self.session_id, clock_ms=clock_ms)
        self.trail = CallTrail(self.session_id)
        self.bus.subscribe(self.trail.on_event)
        self.bus.subscribe(metrics.on_call_event)
        if spend is not None:
            self.bus.subscribe(self._keep_receipt)
        #: The call's media, sans-I/O: this class only carries out what it returns.
        self.engine = MediaEngine(
            started.media_format,
            detector=make_detector(config.vad, config.silero_engine),
            echo=EchoGate(EchoGateConfig(canceller=config.echo_canceller)),
            publish=self.bus.publish,
            speech_threshold=SPEECH_THRESHOLD,
            config=config.media_engine,
        )
        self._brain_up = False
        self.tool_registry = ToolRegistry(
            {"hangup": self._tool_hangup, "transfer": self._tool_transfer},
            own_schemas={name: TOOL_CATALOG[name].parameters for name in ("hangup", "transfer")},
            limits=config.tool_limits,
            clock_ms=clock_ms,
        )
        self._tool_tasks: set[asyncio.Task[None]] = set()
        self._hanging_up = False
        #: Ends the call when one of its own tasks died of a bug (kept so it is not GC'd).
        self._failure_end: asyncio.Task[None] | None = None
        self.brain: BrainHello | None = None
        # Counters for the end-of-call log line and tests (Prometheus has the totals).
        self._frames_to_brain = 0
        self._underruns_reported = 0
        self._underrun_ms_reported = 0.0

    @property
    def frames_to_brain(self) -> int:
        """Caller frames sent to the brain, the call's opening (held until it answered) too."""
        return self._frames_to_brain + self.tap.opening_frames_sent

    # ---- lifecycle ----------------------------------------------------------

    def clock_ms(self) -> float:
        """The call's clock (monotonic ms unless a test gave another)."""
        return self._clock_ms()

    @property
    def reflex(self) -> ReflexLoop:
        """The call's reflex loop (inside its media engine)."""
        return self.engine.reflex

    @property
    def playout(self) -> PlayoutBuffer:
        """The call's playout buffer (inside its media engine)."""
        return self.engine.playout

    @property
    def pacer(self) -> Pacer:
        """The call's pacer (inside its media engine)."""
        return self.engine.pacer

    @property
    def frames_in(self) -> int:
        """Canonical caller frames received."""
        return self.engine.frames_in

    @property
    def frames_out(self) -> int:
        """Canonical frames sent to the caller."""
        return self.engine.frames_out

    @property
    def marks_sent(self) -> int:
        """Provider marks placed."""
        return self.engine.marks_sent

    @property
    def last_mark_played(self) -> str | None:
        """The name of the last mark the provider echoed."""
        return self.engine.last_mark_played

    @property
    def tasks(self) -> tuple[asyncio.Task[None], ...]:
        """The asyncio tasks this call owns (all done after ``end()``)."""
        return tuple(self._tasks)

    async def start(self) -> None:
        """Start dialling the brain and the pacer."""
        self._metrics.active_calls.inc()
        self._metrics.calls_total.inc()
        label = self.session_id
        self._tasks.append(asyncio.create_task(self.tap.run(), name=f"{label}:tap"))
        self._tasks.append(asyncio.create_task(self._pace(), name=f"{label}:pacer"))
        if self._config.brain_grace_ms > 0:
            self._tasks.append(asyncio.create_task(self._watch_grace(), name=f"{label}:grace"))
        if self.spend is not None:
            self._tasks.append(asyncio.create_task(self._meter(), name=f"{label}:spend"))
        for task in self._tasks:
            task.add_done_callback(self._on_task_done)
        self._metrics.call_tasks.inc(len(self._tasks))
        self.bus.publish(
            "call",
            "call_started",
            {"provider": self.context.provider, "direction": self.context.direction.value},
        )
        log.info(
            "call %s started: provider=%s call_id=%s direction=%s brain=%s",
            label,
            self.context.provider,
            self.context.call_id,
            self.context.direction.value,
            self.tap_url,
        )

    async def end(self, reason: SessionEndReason) -> None:
        """End the call: ``session_end`` to the brain, close the tap, stop all tasks.

        Idempotent: a second call waits for the first to finish.
        """
        if self._ending:
            await self.ended.wait()
            return
        self._ending = True
        self.end_reason = reason
        self.bus.publish(
            "call", "call_ended", {"reason": reason.value, "turns": self.reflex.counters.turns}
        )
        try:
            await self.tap.close(reason)
        finally:
            current = asyncio.current_task()
            for tool_task in list(self._tool_tasks):
                if tool_task is not current:
                    tool_task.cancel()
            await self._stop_tasks([t for t in self._tasks if t is not current])
            self._metrics.call_tasks.dec(len(self._tasks))
            self._metrics.active_calls.dec()
            self._report_underruns()
            if self.spend is not None:
                await self._settle(reason)
            self.engine.close()  # frees its audio history now, not at the GC's next full pass
            self.ended.set()
            log.info(
                "call %s ended (%s): %.1fs, frames in=%d to_brain=%d out=%d, "
                "underruns=%d, overflow_dropped_ms=%d, brain_connections=%d",
                self.session_id,
                reason.value,
                (self._clock_ms() - self.started_ms) / 1000,
                self.frames_in,
                self.frames_to_brain,
                self.frames_out,
                self.pacer.underruns,
                samples_to_ms(self.playout.dropped_samples),
                self.tap.connections,
            )

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        """A call task that dies of an exception ends the call: fail closed.

        Without this a crashed meter would leave the call running unmetered until the
        lease reaper charged it in full, and a crashed pacer would leave the caller in
        silence. Cancellation (the normal end) and a clean return are not failures.
        """
        if task.cancelled() or self._ending or self._failure_end is not None:
            return
        exc = task.exception()
        if exc is None:
            return
        self._metrics.call_task_failures.labels(task=task.get_name().rsplit(":", 1)[-1]).inc()
        log.error(
            "call %s: task %s failed; ending the call",
            self.session_id,
            task.get_name(),
            exc_info=exc,
        )
        self._failure_end = asyncio.create_task(
            self._end_after_failure(), name=f"{self.session_id}:failure-end"
        )

    async def _end_after_failure(self) -> None:
        self._hanging_up = True
        await self.end(SessionEndReason.ERROR)
        await self.hang_up_provider(reason="internal error")

    async def _stop_tasks(self, tasks: list[asyncio.Task[None]]) -> None:
        """Cancel the call's tasks and wait for them, cancelling again if one swallowed it.

        A library that turns a cancellation into another exception (seen under CPU load:
        a Redis call's timeout racing the cancel) would leave its task running and this
        call never ended, its reservation later reaped at full price. So: bounded waits,
        re-cancel, and every loop also checks ``_ending``.
        """
        pending = set(tasks)
        for _ in range(TASK_STOP_ROUNDS):
            if not pending:
                return
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=TASK_STOP_WAIT_S)
        if pending:
            log.error(
                "call %s: tasks would not stop: %s",
                self.session_id,
                ", ".join(sorted(t.get_name() for t in pending)),
            )

    def _hello(self, resume: bool) -> Hello:
        ctx = self.context
        return Hello(
            session_id=self.session_id,
            resume=resume,
            call=CallInfo(
                id=ctx.call_id,
                direction=ctx.direction.value,
                from_=ctx.from_,
                to=ctx.to,
                provider=ctx.provider,
            ),
            audio=AudioSpec(),
        )

    # ---- provider -> core ---------------------------------------------------

    async def on_ingress(self, event: IngressEvent) -> None:
        """Handle one event from the provider leg."""
        if isinstance(event, AudioReceived):
            await self._on_audio(event)
        elif isinstance(event, DtmfReceived | MarkPlayed):
            await self._carry_out(self.engine.on_ingress(event, self._clock_ms()))
        elif isinstance(event, StreamStopped):
            await self.end(SessionEndReason.CALLER_HANGUP)
        elif isinstance(event, StreamConnected | StreamStarted):
            # The adapter consumed these before the call existed; a repeat is harmless.
            pass

    async def _on_audio(self, event: AudioReceived) -> None:
        tap = self.tap
        engine = self.engine
        if tap.connected != self._brain_up:
            self._brain_up = tap.connected
            engine.set_brain_connected(tap.connected)
        before = engine.frames_in
        commands = engine.on_ingress(event, self._clock_ms())
        received = engine.frames_in - before
        sent = 0
        for command in commands:
            if isinstance(command, BrainAudio):
                if await tap.send_audio_in(command.frame):
                    sent += 1
            else:
                await self._carry_out_one(command)
        if engine.wants_poll:
            self._wake()
        if received:
            self._frames_to_brain += sent
            self._metrics.frames_in.inc(received)
            if sent:
                self._metrics.frames_to_brain.inc(sent)

    async def _carry_out(self, commands: list[EngineCommand]) -> None:
        """Carry out what the media engine decided, in order."""
        for command in commands:
            await self._carry_out_one(command)
        if self.engine.wants_poll:
            self._wake()

    async def _carry_out_one(self, command: EngineCommand) -> None:
        if isinstance(command, SpeechStarted):
            await self.tap.send(command, kind="speech_started")
        elif isinstance(command, SpeechStopped):
            self.tool_registry.turn_ended()
            await self.tap.send(command, kind="speech_stopped")
        elif isinstance(command, Dtmf):
            await self.tap.send(command, kind="dtmf")
        elif isinstance(command, BrainAudio):
            await self.tap.send_audio_in(command.frame)
        elif isinstance(command, PlayoutOverflow):
            if command.first:
                log.warning(
                    "call %s: brain is sending audio faster than the %d ms playout buffer "
                    "drains; dropping the oldest unplayed audio (counted)",
                    self.session_id,
                    self.playout.max_ms,
                )
            self._metrics.playout_overflow_drops.inc()
            self._metrics.playout_overflow_dropped_ms.inc(samples_to_ms(command.dropped_samples))
        elif isinstance(command, BadInput):
            self._metrics.bad_messages.labels("provider", command.reason).inc()
        else:  # provider commands come from poll(), sent by the pacer task
            await self._edge.send(command)

    # ---- brain -> core ------------------------------------------------------

    async def _on_brain_event(self, event: BrainEvent) -> None:
        if isinstance(event, AudioOut):
            await self._carry_out(self.engine.on_brain(event, self._clock_ms()))
            return
        self._metrics.brain_events.labels(type(event).__name__).inc()
        if isinstance(event, AudioClear):
            await self._carry_out(self.engine.on_brain(event, self._clock_ms()))
        elif isinstance(event, FunctionCall):
            if not self.tool_registry.claim(event.id):
                # One answer per call id (TAP_PROTOCOL.md): a repeat is dropped, counted.
                self.tool_registry.duplicates_dropped += 1
                self._metrics.bad_messages.labels("brain", "duplicate_call_id").inc()
                return
            # Tools run beside the brain connection: a slow provider request must
            # not hold up the audio the brain keeps sending.
            task = asyncio.create_task(
                self._run_tool(event), name=f"{self.session_id}:tool:{event.name[:32]}"
            )
            self._tool_tasks.add(task)
            task.add_done_callback(self._tool_tasks.discard)
        elif isinstance(event, ToolsUpdate):
            self.tools = event
            await check_schemas_paced(event)
            invalid = self.tool_registry.update_catalog(event)
            if invalid:
                self._metrics.bad_messages.labels("brain", "invalid_tool_schema").inc(len(invalid))
                log.warning(
                    "call %s: brain tools with an invalid JSON Schema ignored: %s",
                    self.session_id,
                    ", ".join(name[:64] for name in invalid),
                )
        elif isinstance(event, BrainHello):
            self.brain = event
            if event.ignored:
                # Declarations this core does not understand read as the defaults.
                self._metrics.bad_messages.labels("brain", "ignored_declaration").inc(
                    len(event.ignored)
                )
            await self._carry_out(self.engine.on_brain(event, self._clock_ms()))
            log.info(
                "call %s: brain is %s %s (turns=%s, interruptible=%s)",
                self.session_id,
                event.name,
                event.version,
                event.turns.value,
                event.interruptible,
            )
        elif isinstance(event, BrainError):
            self.bus.publish("brain", "brain_error", {"code": event.code})
            log.warning(
                "call %s: brain reports error %.64s: %.200s",
                self.session_id,
                event.code,
                event.message,
            )
        elif isinstance(event, Bye):
            log.info("call %s: brain said bye (%.64s)", self.session_id, event.reason)
        elif isinstance(event, Usage):
            if self.spend is not None:
                # Billed up to the meter's ceiling; a clamped report becomes a
                # usage_anomaly receipt (and metric) through the bus, never an error.
                self.spend.on_usage(event, round(self._clock_ms()), publish=self._publish_spend)
        elif isinstance(event, AdvisorySpeechStopped) and self.engine.brain_turns:
            # A brain that owns turns ends them: the per-turn tool budget starts again.
            self.tool_registry.turn_ended()
        elif isinstance(event, AdvisorySpeechStarted | AdvisorySpeechStopped):
            # Advisory only: the core owns turns (doctrine 1).
            pass

    # ---- tools ----------------------------------------------------------------

    async def _run_tool(self, call: FunctionCall) -> None:
        self.reflex.on_tool_started()
        try:
            output, receipt = await self.tool_registry.dispose(call)
        finally:
            self.reflex.on_tool_finished()
        self.bus.publish("tool", "tool_call", receipt.as_payload())
        await self.tap.send(output, kind="function_call_output")
        if receipt.status is not ToolStatus.OK:
            return
        if receipt.tool == "hangup":
            if receipt.reason == "stream_closed":
                await self._edge.close("hangup tool")
            # After a REST hang-up the provider stops the stream itself; the route
            # then sees the stop (or the next frame after the end) and closes.
            await self.end(SessionEndReason.HANGUP_TOOL)
        elif receipt.tool == "transfer":
            await self.end(SessionEndReason.TRANSFERRED)

    async def _tool_hangup(self, args: dict[str, Any]) -> ToolOutcome:
        if self._ending or self._hanging_up:
            return ToolOutcome(
                ToolStatus.ERROR, {"error": "the call is already ending"}, "already_ending"
            )
        self._hanging_up = True
        if self._call_control is None:
            # No provider credentials: closing the media stream ends the call, since
            # nothing follows <Connect><Stream> in the TwiML we answered with.
            return ToolOutcome(ToolStatus.OK, {"channel": "stream_closed"}, "stream_closed")
        try:
            channel = await self._call_control.hang_up(self.context.call_id)
        except CallControlFailure as exc:
            if exc.reason == "already_ended":
                return ToolOutcome(
                    ToolStatus.ERROR, {"error": "the call has already ended"}, "already_ended"
                )
            self._hanging_up = False
            return ToolOutcome(
                ToolStatus.ERROR, {"error": f"hang-up failed ({exc.reason})"}, exc.reason
            )
        except BaseException:
            self._hanging_up = False  # timed out or cancelled: a retry may go ahead
            raise
        return ToolOutcome(ToolStatus.OK, {"channel": channel}, "ok")

    async def _tool_transfer(self, args: dict[str, Any]) -> ToolOutcome:
        destination = str(args["destination"])
        if not self._config.transfer_allowlist.allows(destination):
            return ToolOutcome(
                ToolStatus.REJECTED,
                {"error": "that destination is not on the operator's transfer allowlist"},
                "destination_not_allowed",
            )
        if self._ending or self._hanging_up:
            return ToolOutcome(
                ToolStatus.ERROR, {"error": "the call is already ending"}, "already_ending"
            )
        if self._call_control is None:
            return ToolOutcome(
                ToolStatus.ERROR,
                {"error": "transfers need provider call control, which is not configured"},
                "no_call_control",
            )
        try:
            channel = await self._call_control.transfer(self.context.call_id, destination)
        except CallControlFailure as exc:
            return ToolOutcome(
                ToolStatus.ERROR, {"error": f"transfer failed ({exc.reason})"}, exc.reason
            )
        self._hanging_up = True
        return ToolOutcome(ToolStatus.OK, {"channel": channel}, "ok")

    # ---- spend ----------------------------------------------------------------

    async def _meter(self) -> None:
        """Every tick: extend the reservation, renew the lease, end the call when told."""
        spend = self.spend
        assert spend is not None
        tick_s = spend.gate.policy.tick_ms / 1000.0
        while not self._ending:
            await asyncio.sleep(tick_s)
            if self._ending:
                return
            end = await spend.tick(round(self._clock_ms()), publish=self._publish_spend)
            await self._flush_receipts()
            if end is not None:
                await self._end_for_money(end.reason)
                return

    def _publish_spend(self, type_: str, payload: Mapping[str, int | str]) -> None:
        self.bus.publish("spend", type_, payload)

    async def _end_for_money(self, reason: str) -> None:
        """Money or time ran out: tell the brain why, then end the provider leg."""
        assert self.spend is not None
        snap = self.spend.snapshot(round(self._clock_ms()))
        self.bus.publish(
            "spend",
            "limit_reached",
            {"reason": reason, "cost": snap.cost, "reserved": snap.reserved},
        )
        log.info(
            "call %s: ending (%s) at cost %d micros of %d reserved",
            self.session_id,
            reason,
            snap.cost,
            snap.reserved,
        )
        self._hanging_up = True
        await self.end(SPEND_END_REASONS.get(reason, SessionEndReason.BUDGET_EXHAUSTED))
        await self.hang_up_provider(self._goodbye_text, reason=reason)

    async def hang_up_provider(self, goodbye: str | None = None, *, reason: str) -> None:
        """End the provider leg: a short goodbye and hang-up through call control when
        configured, a plain REST hang-up, or else close the media stream."""
        control = self._call_control
        try:
            if control is None:
                await self._edge.close(reason)
            elif goodbye and isinstance(control, SupportsGoodbye):
                await control.say_and_hang_up(self.context.call_id, goodbye)
            else:
                await control.hang_up(self.context.call_id)
        except CallControlFailure as exc:
            if exc.reason != "already_ended":
                log.warning(
                    "call %s: provider hang-up failed (%s); closing the media stream",
                    self.session_id,
                    exc.reason,
                )
            await self._edge.close(reason)

    def _keep_receipt(self, event: CallEvent) -> None:
        if event.stage not in RECEIPT_STAGES and not (
            event.stage == "reflex" and event.type in RECEIPT_REFLEX_TYPES
        ):
            return
        if len(self._pending_receipts) >= MAX_PENDING_RECEIPTS:
            self._pending_receipts.pop(0)
            self.receipts_dropped += 1
        self._pending_receipts.append(
            {"at_ms": event.at_ms, "stage": event.stage, "type": event.type, **event.payload}
        )

    async def _flush_receipts(self) -> None:
        """Write buffered receipts to Redis (best effort: kept for the next flush if down)."""
        spend = self.spend
        if spend is None or not self._pending_receipts:
            return
        store = spend.gate.store
        while self._pending_receipts:
            try:
                ok = await store.add_receipt(spend.call_id, self._pending_receipts[0])
            except (ValueError, StoreUnavailable):
                ok = False
            if not ok:
                return
            self._pending_receipts.pop(0)

    async def _settle(self, reason: SessionEndReason) -> None:
        spend = self.spend
        assert spend is not None
        # Never above the reservation: cost beyond it (usage reported after the last
        # tick) is published as an over_reservation anomaly before the settlement.
        actual = await spend.settle(
            round(self._clock_ms()), reason.value, publish=self._publish_spend
        )
        self.bus.publish("spend", "settled", {"actual": actual, "reason": reason.value})
        await self._flush_receipts()

    # ---- the pacer ----------------------------------------------------------

    def _wake(self) -> None:
        """New audio or a clear: make the pacer poll now."""
        self._wake_pending = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(False)

    async def _pace(self) -> None:
        """Send what the engine's pacer releases, waking at its deadlines or when woken."""
        engine = self.engine
        pacer = engine.pacer
        edge = self._edge
        loop = asyncio.get_running_loop()
        clock = self._clock_ms
        lateness = self._metrics.pacer_lateness
        frames_out_metric = self._metrics.frames_out
        polls_metric = self._metrics.pacer_polls
        while not self._ending:
            self._wake_pending = False
            before = engine.frames_out
            polls_metric.inc()
            for command in engine.poll(clock()):
                await edge.send(command)
            if engine.frames_out != before:
                frames_out_metric.inc(engine.frames_out - before)
            if pacer.underruns != self._underruns_reported:
                self._report_underruns()
            now = clock()
            deadline = engine.next_deadline()
            if self._wake_pending:
                continue
            delay_s = None if deadline is None else (deadline - now) / 1000.0
            if delay_s is not None and delay_s <= 0:
                await asyncio.sleep(0)
                continue
            waiter: asyncio.Future[bool] = loop.create_future()
            self._waiter = waiter
            timer = (
                None
                if delay_s is None
                else loop.call_later(max(delay_s, MIN_PACER_WAIT_S), _fire, waiter)
            )
            try:
                timed_out = await waiter
            finally:
                self._waiter = None
                if timer is not None:
                    timer.cancel()
            if timed_out and deadline is not None:
                lateness.observe(max(0.0, clock() - deadline) / 1000.0)

    def _report_underruns(self) -> None:
        new = self.pacer.underruns - self._underruns_reported
        if new:
            self._metrics.playout_underruns.inc(new)
            self._metrics.playout_underrun_ms.inc(
                self.pacer.underrun_ms - self._underrun_ms_reported
            )
            self._underruns_reported = self.pacer.underruns
            self._underrun_ms_reported = self.pacer.underrun_ms

    async def _watch_grace(self) -> None:
        grace = self._config.brain_grace_ms
        while not self._ending:
            await asyncio.sleep(GRACE_CHECK_INTERVAL_S)
            down = self.tap.down_since_ms
            if down is not None and self._clock_ms() - down > grace:
                log.warning(
                    "call %s: brain unreachable for more than %d ms; ending the call",
                    self.session_id,
                    grace,
                )
                await self._edge.close("brain unavailable")
                await self.end(SessionEndReason.ERROR)
                return
