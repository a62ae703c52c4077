"""The per-call object: ingress events ↔ media transforms ↔ tap client ↔ playout ↔ pacer.

One ``Call`` exists per live media stream. It is provider-neutral: a trunk
adapter feeds it :mod:`trunk.events` and gives it a ``CallEdge`` to send
commands back. The sans-I/O parts (transforms, ``PlayoutBuffer``, ``Pacer``)
do the work; this module is the asyncio glue. It owns two tasks (the brain
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

from brains.tap import (
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
from brains.tool_catalog import TOOL_CATALOG
from gateway.call_trail import CallTrail
from gateway.config import GatewayConfig
from gateway.event_bus import CallEvent, EventBus
from gateway.metrics import GatewayMetrics
from gateway.reflex import ClearProvider, ReflexAction, ReflexLoop, WakePacer
from gateway.tap_client import TapClient
from gateway.tool_registry import ToolOutcome, ToolRegistry
from media.echo_gate import EchoGate, EchoGateConfig
from media.formats import samples_to_ms
from media.pacer import Pacer, PacerState
from media.playout import PlayoutBuffer
from media.transform import InboundTransform, OutboundTransform
from media.vad import SPEECH_THRESHOLD, make_detector
from spend.gate import CallSpend
from spend.store import StoreUnavailable
from trunk.call_control import CallControlFailure, ProviderCallControl, SupportsGoodbye
from trunk.events import (
    AudioReceived,
    ClearPlayback,
    DtmfReceived,
    IngressCommand,
    IngressEvent,
    MarkPlayed,
    PlaceMark,
    PlayAudio,
    StreamConnected,
    StreamStarted,
    StreamStopped,
)

log = logging.getLogger(__name__)

#: Release the outbound resampler's held tail when the provider has this little
#: audio left to play and nothing more is buffered: early enough that the tail
#: arrives before the caller's queue runs dry, late enough that a brain which is
#: merely a little late (echo: one frame at a time) is not cut by inserted silence.
DRAIN_LEAD_MS = 10.0
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
        self._inbound = InboundTransform(started.media_format)
        self._outbound = OutboundTransform(started.media_format)
        self.playout = PlayoutBuffer(max_ms=config.playout_max_ms)
        self.pacer = Pacer(
            self.playout, lead_ms=config.pacer_lead_ms, start_ms=config.pacer_start_ms
        )
        self.tap = TapClient(
            tap_url,
            make_hello=self._hello,
            on_event=self._on_brain_event,
            metrics=metrics,
            clock_ms=clock_ms,
            call_label=self.session_id,
        )
        # Pacer wake-ups: a flag plus a bare future (cheaper than Event + timeout,
        # measured: the pacer wakes ~50 times a second per call).
        self._wake_pending = False
        self._waiter: asyncio.Future[bool] | None = None
        self._clear_pending = False
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
        self.reflex = ReflexLoop(
            playout=self.playout,
            pacer=self.pacer,
            detector=make_detector(config.vad),
            echo=EchoGate(EchoGateConfig(canceller=config.echo_canceller)),
            publish=self.bus.publish,
            speech_threshold=SPEECH_THRESHOLD,
            config=config.reflex,
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
        self.brain: BrainHello | None = None
        # Counters for the end-of-call log line and tests (Prometheus has the totals).
        self.frames_in = 0
        self.frames_to_brain = 0
        self.frames_out = 0
        self.marks_sent = 0
        self.last_mark_played: str | None = None
        self._underruns_reported = 0
        self._underrun_ms_reported = 0.0

    # ---- lifecycle ----------------------------------------------------------

    def clock_ms(self) -> float:
        """The call's clock (monotonic ms unless a test gave another)."""
        return self._clock_ms()

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
            await self._on_audio(event.payload)
        elif isinstance(event, DtmfReceived):
            await self.tap.send(Dtmf(event.digit), kind="dtmf")
            await self._act(self.reflex.on_dtmf(self._clock_ms()))
        elif isinstance(event, MarkPlayed):
            self.last_mark_played = event.name
            if event.name.isdigit():  # our marks are named by the frame count sent
                self.reflex.on_mark(int(event.name) - 1, self._clock_ms())
        elif isinstance(event, StreamStopped):
            await self.end(SessionEndReason.CALLER_HANGUP)
        elif isinstance(event, StreamConnected | StreamStarted):
            # The adapter consumed these before the call existed; a repeat is harmless.
            pass

    async def _on_audio(self, payload: bytes) -> None:
        try:
            frames = self._inbound.process(payload)
        except ValueError:
            self._metrics.bad_messages.labels("provider", "bad_audio").inc()
            return
        tap = self.tap
        sent = 0
        now = self._clock_ms()
        if tap.connected != self._brain_up:
            self._brain_up = tap.connected
            if tap.connected:
                self.reflex.on_brain_up()
            else:
                self.reflex.on_brain_down()
        reflex = self.reflex
        for frame in frames:
            if await tap.send_audio_in(frame):
                sent += 1
            actions = reflex.on_caller_frame(frame, now)
            if actions:
                await self._act(actions)
        if frames:
            self.frames_in += len(frames)
            self.frames_to_brain += sent
            self._metrics.frames_in.inc(len(frames))
            if sent:
                self._metrics.frames_to_brain.inc(sent)

    async def _act(self, actions: list[ReflexAction]) -> None:
        """Carry out what the reflex loop decided, in order."""
        for action in actions:
            if isinstance(action, ClearProvider):
                self._outbound.reset()  # drop the resampler's held tail of the cut audio
                self._clear_pending = True
                self._wake()
            elif isinstance(action, WakePacer):
                self._wake()
            elif isinstance(action, SpeechStarted):
                await self.tap.send(action, kind="speech_started")
            elif isinstance(action, SpeechStopped):
                self.tool_registry.turn_ended()
                await self.tap.send(action, kind="speech_stopped")

    # ---- brain -> core ------------------------------------------------------

    async def _on_brain_event(self, event: BrainEvent) -> None:
        if isinstance(event, AudioOut):
            accepted, actions = self.reflex.accept_assistant_audio(event.item, self._clock_ms())
            if actions:
                await self._act(actions)
            if not accepted:
                return
            dropped = self.playout.push(event.pcm, event.item)
            if dropped:
                if self.playout.overflow_events == 1:
                    log.warning(
                        "call %s: brain is sending audio faster than the %d ms playout buffer "
                        "drains; dropping the oldest unplayed audio (counted)",
                        self.session_id,
                        self.playout.max_ms,
                    )
                self._metrics.playout_overflow_drops.inc()
                self._metrics.playout_overflow_dropped_ms.inc(samples_to_ms(dropped))
            self._wake()
            return
        self._metrics.brain_events.labels(type(event).__name__).inc()
        if isinstance(event, AudioClear):
            await self._act(self.reflex.on_audio_clear(self._clock_ms()))
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
            log.info("call %s: brain is %s %s", self.session_id, event.name, event.version)
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
                self.spend.on_usage(event, round(self._clock_ms()))
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
        actual = await spend.settle(round(self._clock_ms()), reason.value)
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
        pacer = self.pacer
        edge = self._edge
        loop = asyncio.get_running_loop()
        clock = self._clock_ms
        mark_every = self._config.mark_every_frames
        lateness = self._metrics.pacer_lateness
        frames_out_metric = self._metrics.frames_out
        reflex = self.reflex
        tail_pending = False
        while not self._ending:
            self._wake_pending = False
            if self._clear_pending:
                self._clear_pending = False
                tail_pending = False  # the resampler was reset: nothing of the cut audio left
                await edge.send(ClearPlayback())
            now = clock()
            frames = [] if reflex.paused else pacer.poll(now)
            for frame in frames:
                reflex.on_frame_sent(frame, now)
                payload = self._outbound.process(frame.pcm)
                if payload:
                    await edge.send(PlayAudio(payload))
                self.frames_out += 1
                if self.frames_out % mark_every == 0:
                    self.marks_sent += 1
                    await edge.send(PlaceMark(str(self.frames_out)))
            if frames:
                frames_out_metric.inc(len(frames))
                tail_pending = True
            elif (
                tail_pending
                and self.playout.buffered_samples == 0
                and (
                    pacer.state is not PacerState.PLAYING
                    or pacer.lead_ms_now(clock()) <= DRAIN_LEAD_MS
                )
            ):
                # Playout is about to run dry: release the ~25 ms the resampler still holds.
                tail_pending = False
                await edge.send(PlayAudio(self._outbound.drain()))
            if pacer.underruns != self._underruns_reported:
                self._report_underruns()
            now = clock()
            deadline = None if reflex.paused else pacer.next_poll_ms(now)
            if tail_pending and self.playout.buffered_samples == 0 and deadline is not None:
                deadline = min(deadline, now + pacer.lead_ms_now(now) - DRAIN_LEAD_MS)
            if self._wake_pending:
                continue
            delay_s = None if deadline is None else (deadline - now) / 1000.0
            if delay_s is not None and delay_s <= 0:
                await asyncio.sleep(0)
                continue
            waiter: asyncio.Future[bool] = loop.create_future()
            self._waiter = waiter
            timer = None if delay_s is None else loop.call_later(delay_s, _fire, waiter)
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
