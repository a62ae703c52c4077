"""The README's own commands, run as written, with default settings, as separate processes.

Each test reads one marked shell block (an HTML comment ``<!-- readme-commands: NAME -->``
right before a fenced block) out of README.md or docs/SIP.md, runs its commands as
subprocesses, places a call of recorded speech (``tests/fixtures/audio/caller_speech_8k.wav``)
and checks that the caller hears their own speech back, on time all call long:

- correlation of what the caller heard with what was said ≥ 0.9 per 2 s segment, but
  for a lone segment where a stall moved the delay and it was won back
  (:func:`tests.echo_checks.transient_steps_only`);
- no growing delay: the last good segment's lag is within :data:`MAX_LAG_DRIFT_MS` of the
  first's, and the first and last :data:`WINDOW_S` of the call are echoed;
- on the SIP path, whose pjsua2 jitter buffers may shift the lag by a frame when load
  changes, the same is judged per :data:`JB_SEGMENT_S` segment instead
  (:func:`segmented_echo`): most voiced segments at ≥ :data:`MIN_CORRELATION`, and the lag
  spread over the call ≤ :data:`JB_MAX_LAG_SPREAD_MS`;
- the gateway's ``/metrics`` show no barge-in pause (``rutster_barge_ins_total{step="paused"}``
  is 0 or absent): the echo brain's hello says ``interruptible: false``.

Blocks: ``real`` (README, "Running it for real": echo brain + gateway; the test plays
Twilio with the simulator, signing with the auth token the gateway was given), ``local``
(README, "Try it locally": echo brain + gateway + ``rutster call``, all three run as
written) and ``sip-local`` (docs/SIP.md: echo brain + gateway with a SIP secret + one
``rutster sip-worker``; the caller is the pjsua2 test phone, ``tools/sip_peer.py``).

What is substituted, and why; nothing else is (no reflex, VAD or barge-in setting, no flag):

- **Listen addresses.** Tests use free loopback ports, never 8080/8081/5060, and talk to
  loopback only, so ``--host 0.0.0.0`` becomes ``--host 127.0.0.1``. Moving a listener
  moves the address its clients use by default, so the same port goes there too:
  the brain's ``RUTSTER_BRAIN_BIND`` (set, or its value replaced); the gateway's ``--port``
  (replaced, or added), ``RUTSTER_PUBLIC_URL`` (replaced, or set to the default
  ``http://127.0.0.1:PORT``; a public ``https://gw.example.com`` is not reachable here) and
  the brain address in ``RUTSTER_TAP_URL`` (replaced, or set to the default
  ``ws://127.0.0.1:PORT/echo``); ``rutster call --gateway`` (replaced, or added); the
  worker's ``--sip-port`` (replaced, or added), ``RUTSTER_GATEWAY_URL`` (replaced, or set to
  the default ``ws://127.0.0.1:PORT``) and ``RUTSTER_SIP_BIND`` (127.0.0.1 when set).
- **Secret files.** A ``*_FILE`` variable under ``/run/secrets/`` points at a temporary file
  holding a fresh random secret instead (the same path gets the same file, so the gateway
  and its workers share one SIP secret). Relative secret files a block writes itself are
  left alone.
- **Working directory.** The commands run in a scratch folder holding symlinks ``.venv``
  and ``tests`` to this checkout: relative paths resolve as in a checkout, while what the
  commands write (the embedded Redis under ``.rutster/``, ``reply.wav``) lands in scratch.
  ``.venv/bin`` is first on ``PATH``, so a bare ``rutster`` is this venv's.
- **Inherited environment.** ``RUTSTER_*``, ``TWILIO_*``, ``OPENAI_*`` and ``REDIS_URL`` are
  removed from the test's own environment before the commands' variables are applied, so
  the defaults are the defaults.
- **Not run:** ``scripts/setup-venv`` (it builds the venv the test already runs in).

Services (``brain``, ``serve``, ``sip-worker``) are started in the block's order, each
once it listens; a trailing ``&`` is dropped. Other lines (``rutster call``, a shell line
that writes a secret file) run to completion. Every process is stopped in ``finally``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import shlex
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rutster.base.env_values import read_secret
from rutster.tools.launcher import LOOPBACK, Service, free_port, wait_healthy, wait_listening
from rutster.tools.twilio_simulator import TwilioSimulator, best_lag_correlation, read_wav_8k
from tests.echo_checks import transient_steps_only

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
SIP_DOC = ROOT / "docs" / "SIP.md"
SPEECH_WAV = ROOT / "tests" / "fixtures" / "audio" / "caller_speech_8k.wav"

MIN_CORRELATION = 0.9
#: Length of the first and last windows whose echo lags are compared.
WINDOW_S = 5.0
#: The most the echo lag may move between the first and the last window.
MAX_LAG_DRIFT_MS = 40.0
#: Correlation a window needs for its lag to mean anything.
MIN_WINDOW_CORRELATION = 0.8
#: Longest echo lag searched (the barge-in bug drifted to ~1.8 s).
MAX_LAG_S = 2.5
#: Seconds of speech the simulated (real block) and SIP calls speak (≥ 20 s).
CALL_SECONDS = 20.0
#: How long a service may take to listen, and a one-shot command to finish.
READY_TIMEOUT_S = 20.0
ONE_SHOT_TIMEOUT_S = 90.0
#: Inherited variables that would change the defaults.
SCRUBBED_PREFIXES = ("RUTSTER_", "TWILIO_", "OPENAI_")
SCRUBBED_NAMES = ("REDIS_URL",)
SERVICES = ("brain", "serve", "sip-worker")
ENV_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*", re.DOTALL)

# -- the marked blocks ----------------------------------------------------------------------


def marked_block(path: Path, name: str) -> str:
    """The fenced block right after ``<!-- readme-commands: NAME -->`` in ``path``."""
    text = path.read_text(encoding="utf-8")
    marker = f"<!-- readme-commands: {name} -->"
    at = text.find(marker)
    assert at >= 0, f"{path.name} has no {marker}"
    lines = text[at + len(marker) :].lstrip("\n").splitlines()
    assert lines and lines[0].startswith("```"), f"{marker} must be followed by a fenced block"
    end = next(i for i in range(1, len(lines)) if lines[i].startswith("```"))
    return "\n".join(lines[1:end])


# -- parsing and localising -----------------------------------------------------------------


@dataclass
class Command:
    """One logical line of a block: its variables, its words and the line as written."""

    env: dict[str, str]
    argv: list[str]
    line: str

    @property
    def rutster(self) -> bool:
        return Path(self.argv[0]).name == "rutster"

    @property
    def service(self) -> bool:
        return self.rutster and len(self.argv) > 1 and self.argv[1] in SERVICES

    @property
    def subcommand(self) -> str:
        """``brain echo``, ``serve``, ``call``...; a non-rutster line's program."""
        if not self.rutster:
            return self.argv[0]
        return " ".join(self.argv[1:3] if self.argv[1:2] == ["brain"] else self.argv[1:2])


def parse_block(block: str) -> list[Command]:
    """Logical lines (backslash continuations joined), comments and trailing ``&`` dropped,
    ``export NAME=VALUE`` applied to the lines after it."""
    exported: dict[str, str] = {}
    commands: list[Command] = []
    for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words and words[-1] == "&":
            words.pop()
        if not words:
            continue
        if words[0] == "export":
            for word in words[1:]:
                name, _, value = word.partition("=")
                exported[name] = value
            continue
        env = dict(exported)
        while words and ENV_ASSIGNMENT.fullmatch(words[0]):
            name, value = words.pop(0).split("=", 1)
            env[name] = value
        commands.append(Command(env, words, line.split(" #")[0].strip()))
    return commands


@dataclass
class Ports:
    brain: int = field(default_factory=free_port)
    gateway: int = field(default_factory=free_port)
    sip: int = field(default_factory=free_port)


def _set_option(argv: list[str], option: str, value: str) -> None:
    """Replace ``option``'s value (``--opt V`` or ``--opt=V``), or add it."""
    for i, word in enumerate(argv):
        if word == option:
            argv[i + 1] = value
            return
        if word.startswith(option + "="):
            argv[i] = f"{option}={value}"
            return
    argv += [option, value]


def _with_netloc(url: str, netloc: str) -> str:
    return urlunsplit(urlsplit(url)._replace(netloc=netloc))


@dataclass
class Localizer:
    """Applies the substitutions of the module docstring; records each one."""

    ports: Ports
    secrets_dir: Path
    secret_files: dict[str, Path] = field(default_factory=dict)
    done: list[str] = field(default_factory=list)

    def secret_file(self, path: str) -> Path:
        if path not in self.secret_files:
            local = self.secrets_dir / f"secret{len(self.secret_files)}"
            local.write_text(secrets.token_urlsafe(32) + "\n", encoding="utf-8")
            self.secret_files[path] = local
        return self.secret_files[path]

    def __call__(self, cmd: Command) -> Command:
        env, argv = dict(cmd.env), list(cmd.argv)
        for name, value in cmd.env.items():
            if name.endswith("_FILE") and value.startswith("/run/secrets/"):
                env[name] = str(self.secret_file(value))
        if cmd.rutster:
            self._listeners(cmd.subcommand, env, argv)
        changed = [f"{k}={v}" for k, v in env.items() if cmd.env.get(k) != v]
        if changed or argv != cmd.argv:
            self.done.append(f"{cmd.subcommand}: {' '.join(changed)} {shlex.join(argv)}")
        return Command(env, argv, cmd.line)

    def _listeners(self, sub: str, env: dict[str, str], argv: list[str]) -> None:
        brain = f"{LOOPBACK}:{self.ports.brain}"
        gateway = f"{LOOPBACK}:{self.ports.gateway}"
        if sub == "brain echo":
            if "--bind" in argv:
                _set_option(argv, "--bind", brain)
            else:
                env["RUTSTER_BRAIN_BIND"] = brain
        elif sub == "serve":
            if "--host" in argv:
                _set_option(argv, "--host", LOOPBACK)
            _set_option(argv, "--port", str(self.ports.gateway))
            env["RUTSTER_PUBLIC_URL"] = f"http://{gateway}"
            tap = env.get("RUTSTER_TAP_URL", f"ws://{brain}/echo")
            env["RUTSTER_TAP_URL"] = _with_netloc(tap, brain)
        elif sub == "sip-worker":
            _set_option(argv, "--sip-port", str(self.ports.sip))
            env["RUTSTER_GATEWAY_URL"] = _with_netloc(
                env.get("RUTSTER_GATEWAY_URL", f"ws://{gateway}"), gateway
            )
            if "RUTSTER_SIP_BIND" in env:
                env["RUTSTER_SIP_BIND"] = LOOPBACK
        elif sub == "call":
            _set_option(argv, "--gateway", f"http://{gateway}")
        else:
            raise AssertionError(f"the test does not know how to localise `rutster {sub}`")


# -- running --------------------------------------------------------------------------------


def _base_env(scratch: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(SCRUBBED_PREFIXES) and k not in SCRUBBED_NAMES
    }
    env["PATH"] = f"{scratch / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


@dataclass
class Stack:
    """A block's services, running in ``scratch``."""

    scratch: Path
    ports: Ports
    localizer: Localizer
    commands: list[Command]
    services: dict[str, Service] = field(default_factory=dict)

    @property
    def gateway_url(self) -> str:
        return f"http://{LOOPBACK}:{self.ports.gateway}"

    def env_of(self, sub: str) -> dict[str, str]:
        return next(c.env for c in self.commands if c.rutster and c.subcommand == sub)

    def one_shots(self) -> list[Command]:
        return [c for c in self.commands if c.rutster and not c.service]

    def run_one_shot(self, cmd: Command) -> subprocess.CompletedProcess[str]:
        if cmd.rutster:
            args: list[str] | str = cmd.argv
            shell = False
        else:  # a plain shell line (e.g. one writing a secret file): bash runs it as written
            args, shell = cmd.line, True
        done = subprocess.run(
            args,
            shell=shell,
            executable="/bin/bash" if shell else None,
            cwd=self.scratch,
            env={**_base_env(self.scratch), **cmd.env},
            capture_output=True,
            text=True,
            timeout=ONE_SHOT_TIMEOUT_S,
            check=False,
        )
        assert done.returncode == 0, f"{cmd.line!r} exited {done.returncode}: {done.stderr}"
        return done

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}:\n" + p.read_text(errors="replace")[-3000:]
            for p in sorted(self.scratch.glob("*.log"))
        )


def _listen_port(stack: Stack, sub: str) -> int:
    return {
        "brain echo": stack.ports.brain,
        "serve": stack.ports.gateway,
        "sip-worker": stack.ports.sip,
    }[sub]


@contextlib.contextmanager
def run_block(path: Path, name: str) -> Iterator[Stack]:
    """Start the block's services (and run its non-rutster lines) in a scratch folder."""
    commands = parse_block(marked_block(path, name))
    with tempfile.TemporaryDirectory(prefix=f"rutster-readme-{name}-") as tmp:
        scratch = Path(tmp) / "checkout"
        scratch.mkdir()
        (Path(tmp) / "secrets").mkdir()
        for entry in (".venv", "tests"):
            (scratch / entry).symlink_to(ROOT / entry)
        ports = Ports()
        localizer = Localizer(ports, Path(tmp) / "secrets")
        local = [c for c in (localizer(c) for c in commands) if c.argv[0] != "scripts/setup-venv"]
        stack = Stack(scratch, ports, localizer, local)
        try:
            for cmd in local:
                if cmd.service:
                    log = (scratch / f"{cmd.subcommand.replace(' ', '-')}.log").open("wb")
                    proc = subprocess.Popen(
                        cmd.argv,
                        cwd=scratch,
                        env={**_base_env(scratch), **cmd.env},
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                    log.close()
                    port = _listen_port(stack, cmd.subcommand)
                    stack.services[cmd.subcommand] = Service(proc, LOOPBACK, port)
                    if cmd.subcommand == "serve":  # it listens before its app has started
                        wait_healthy(LOOPBACK, port, "/healthz", READY_TIMEOUT_S, proc)
                    else:
                        wait_listening(LOOPBACK, port, READY_TIMEOUT_S, proc)
                elif not cmd.rutster:
                    stack.run_one_shot(cmd)
            print(f"\n[{name}] substituted: " + "; ".join(localizer.done))
            yield stack
        except BaseException:
            print(stack.logs())
            raise
        finally:
            for service in reversed(list(stack.services.values())):
                service.stop()


# -- measuring ------------------------------------------------------------------------------


@dataclass(frozen=True)
class EchoFigures:
    correlation: float
    lag_ms: float
    first: tuple[float, float]  # (correlation, lag ms) over the first window
    last: tuple[float, float]  # the same over the last window

    def __str__(self) -> str:
        return (
            f"correlation {self.correlation:.3f} at {self.lag_ms:.1f} ms; "
            f"first {WINDOW_S:.0f} s: {self.first[0]:.3f} at {self.first[1]:.1f} ms; "
            f"last {WINDOW_S:.0f} s: {self.last[0]:.3f} at {self.last[1]:.1f} ms"
        )


def echo_figures(sent: bytes, heard: bytes, rate: int) -> EchoFigures:
    """Whole-call correlation and lag, and those of the first and last windows.

    ``heard`` is on ``sent``'s timeline (both start at the call's first frame), so a
    window of ``sent`` starting at ``t`` is searched in ``heard`` from ``t`` on.
    """
    max_lag = int(MAX_LAG_S * rate)
    corr, lag = best_lag_correlation(sent, heard, max_lag_samples=max_lag)
    win = int(WINDOW_S * rate) * 2

    def window(start: int) -> tuple[float, float]:
        c, lag_samples = best_lag_correlation(
            sent[start : start + win],
            heard[start : start + win + 2 * max_lag],
            max_lag_samples=max_lag,
        )
        return c, lag_samples * 1000.0 / rate

    return EchoFigures(corr, lag * 1000.0 / rate, window(0), window(len(sent) - win))


#: Segment length of the lag timeline printed with every result (diagnosis only).
TIMELINE_SEGMENT_S = 2.0


def lag_segments(sent: bytes, heard: bytes, rate: int) -> list[tuple[float, int]]:
    """(correlation, lag in samples) of each :data:`TIMELINE_SEGMENT_S` segment of ``sent``."""
    seg = int(TIMELINE_SEGMENT_S * rate) * 2
    max_lag = int(MAX_LAG_S * rate)
    return [
        best_lag_correlation(
            sent[start : start + seg],
            heard[start : start + seg + 2 * max_lag],
            max_lag_samples=max_lag,
        )
        for start in range(0, len(sent) - seg + 1, seg)
    ]


def lag_timeline(sent: bytes, heard: bytes, rate: int) -> str:
    """``t s: lag ms (correlation)`` per segment: where a lag step happened, if any."""
    return ", ".join(
        f"{i * TIMELINE_SEGMENT_S:.0f}s {lag * 1000 / rate:.0f}ms ({c:.2f})"
        for i, (c, lag) in enumerate(lag_segments(sent, heard, rate))
    )


def assert_echo_on_time(label: str, sent: bytes, heard: bytes, rate: int) -> None:
    """Echoed whole and on time, segment by segment (tests/echo_checks.py's rule: a
    lone segment where a stall moved the delay passes if the delay was won back)."""
    figures = echo_figures(sent, heard, rate)
    timeline = lag_timeline(sent, heard, rate)
    print(f"[{label}] {figures}\n[{label}] lag per {TIMELINE_SEGMENT_S:.0f} s: {timeline}")
    max_step = round(MAX_LAG_DRIFT_MS * rate / 1000)
    problem = transient_steps_only(lag_segments(sent, heard, rate), max_step, f"{label}: ")
    assert problem is None, f"{problem}: {timeline}"
    for name, (corr, _) in (("first", figures.first), ("last", figures.last)):
        assert corr >= MIN_WINDOW_CORRELATION, (
            f"{label}: the {name} window is not echoed: {figures}"
        )


#: Segment length of the jitter-buffered (SIP) check: a word or two of the fixture, the same
#: figure ``tools/sip_load_generator.py`` measured (``CORRELATION_SEGMENT_S``): short enough
#: that a 10-20 ms jitter-buffer resync cuts only the one segment it falls in.
JB_SEGMENT_S = 0.5
#: Share of the voiced segments that must come back at :data:`MIN_CORRELATION` or better.
#: A resync halves the correlation of the segment it falls in (two lags in one segment); the
#: failing CI run had 5 such steps in 20 s, i.e. 5 of ~35 voiced segments. Seed decision.
JB_MIN_GOOD_SHARE = 0.75
#: Most the echo lag may spread over the call: two 20 ms jitter-buffer frames either way of
#: its start. Any growing delay (the 1.8 s of the barge-in bug, a 40 ms step per underrun)
#: exceeds it.
JB_MAX_LAG_SPREAD_MS = 40.0
#: A segment is judged only when this share of its 20 ms frames is voiced (pauses between
#: sentences carry nothing to correlate); same seed as the load generator's.
JB_SEGMENT_MIN_VOICED = 0.25
#: RMS above which a 20 ms frame counts as voiced (about -45 dBFS; the simulator's seed).
JB_VOICED_RMS = 180.0


@dataclass(frozen=True)
class SegmentedEcho:
    """Per-segment echo figures of a path with an adaptive jitter buffer (SIP).

    pjsua2's jitter buffer drops or inserts a 10-20 ms frame when its load changes, which
    shifts the echo lag by that much for a while: each sentence still comes back intact and
    on time, but one whole-call correlation at one lag is smeared (the CI run that failed
    scored 0.65 with every 2 s segment at 127 or 137 ms). So each voiced segment is matched
    at its own best lag, and the call is judged on those.
    """

    correlations: list[float]
    lags_ms: list[float]

    @property
    def good_share(self) -> float:
        good = sum(1 for c in self.correlations if c >= MIN_CORRELATION)
        return good / len(self.correlations) if self.correlations else 0.0

    @property
    def lag_spread_ms(self) -> float:
        """Spread of the lags of the segments that came back well (others have no lag)."""
        lags = [
            lag
            for c, lag in zip(self.correlations, self.lags_ms, strict=True)
            if c >= MIN_WINDOW_CORRELATION
        ]
        return max(lags) - min(lags) if lags else float("inf")

    def __str__(self) -> str:
        lags = sorted(set(round(x) for x in self.lags_ms))
        return (
            f"{len(self.correlations)} voiced {JB_SEGMENT_S:.1f} s segments, "
            f"{self.good_share:.0%} at correlation >= {MIN_CORRELATION}, "
            f"median {np.median(self.correlations) if self.correlations else 0.0:.3f}; "
            f"lag spread {self.lag_spread_ms:.1f} ms over lags {lags} ms"
        )


def segmented_echo(sent: bytes, heard: bytes, rate: int) -> SegmentedEcho:
    """Each voiced :data:`JB_SEGMENT_S` segment of ``sent`` matched in ``heard`` (same
    timeline) at its own best lag."""
    seg = int(JB_SEGMENT_S * rate) * 2
    frame = rate // 50 * 2
    max_lag = int(MAX_LAG_S * rate)
    corrs: list[float] = []
    lags: list[float] = []
    for start in range(0, len(sent) - seg + 1, seg):
        part = sent[start : start + seg]
        x = np.frombuffer(part, dtype=np.int16).astype(np.float64).reshape(-1, frame // 2)
        voiced = np.count_nonzero(np.sqrt(np.mean(x**2, axis=1)) > JB_VOICED_RMS)
        if voiced < len(x) * JB_SEGMENT_MIN_VOICED:
            continue
        c, lag = best_lag_correlation(
            part, heard[start : start + seg + 2 * max_lag], max_lag_samples=max_lag
        )
        corrs.append(c)
        lags.append(lag * 1000.0 / rate)
    return SegmentedEcho(corrs, lags)


def assert_echo_on_time_through_jitter_buffer(label: str, echo: SegmentedEcho) -> None:
    """The jitter-buffered path's criteria: most segments come back at full correlation and
    the lag stays within :data:`JB_MAX_LAG_SPREAD_MS` all call long."""
    print(f"[{label}] {echo}")
    assert len(echo.correlations) >= 10, f"{label}: too little voiced speech: {echo}"
    assert echo.good_share >= JB_MIN_GOOD_SHARE, f"{label}: not echoed: {echo}"
    assert echo.lag_spread_ms <= JB_MAX_LAG_SPREAD_MS, f"{label}: the echo lag moved: {echo}"


def barge_in_pauses(gateway_url: str) -> float:
    """``rutster_barge_ins_total{step="paused"}`` (0 when absent); prints the playout
    counters and reflex transitions alongside (a starved playout adds delay)."""
    text = httpx.get(f"{gateway_url}/metrics", timeout=5).text
    shown = re.findall(
        r"^rutster_(?:playout_underruns_total|playout_underrun_ms_total|reflex_transitions_total"
        r"|barge_ins_total)\b.*$",
        text,
        re.MULTILINE,
    )
    print("gateway: " + "; ".join(shown))
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "rutster_barge_ins_total" and sample.labels.get("step") == "paused"
    )


async def settled(stack: Stack) -> None:
    """Wait until the gateway has ended its calls (metrics then count the whole call)."""
    async with httpx.AsyncClient(base_url=stack.gateway_url) as http:
        for _ in range(100):
            text = (await http.get("/metrics")).text
            if re.search(r"^rutster_active_calls 0\.0$", text, re.MULTILINE):
                return
            await asyncio.sleep(0.05)


def _subcommands(stack: Stack) -> list[str]:
    return [c.subcommand for c in stack.commands]


# -- the tests ------------------------------------------------------------------------------


async def test_running_it_for_real_echoes_a_twilio_call_on_time() -> None:
    speech = read_wav_8k(SPEECH_WAV)[: int(CALL_SECONDS * 8000) * 2]
    with run_block(README, "real") as stack:
        assert _subcommands(stack) == ["brain echo", "serve"]
        env = stack.env_of("serve")
        token = read_secret(env, "TWILIO_AUTH_TOKEN")  # what the gateway was given
        result = await TwilioSimulator(stack.gateway_url, auth_token=token).place_call(speech)
        await settled(stack)
        paused = barge_in_pauses(stack.gateway_url)
    assert result.frames_sent == len(speech) // 320
    heard = result.heard_pcm
    assert_echo_on_time("real, Twilio", speech, heard, 8000)
    assert paused == 0, f"{paused:.0f} barge-in pauses on an echo call"


async def test_try_it_locally_echoes_a_twilio_call_on_time() -> None:
    with run_block(README, "local") as stack:
        assert _subcommands(stack) == ["brain echo", "serve", "call"]
        (call,) = stack.one_shots()
        wav = call.argv[call.argv.index("--wav") + 1]
        out = call.argv[call.argv.index("--out") + 1]
        done = await asyncio.to_thread(stack.run_one_shot, call)
        print(done.stdout)
        await settled(stack)
        paused = barge_in_pauses(stack.gateway_url)
        speech = read_wav_8k(stack.scratch / wav)
        heard = read_wav_8k(stack.scratch / out)
    assert len(speech) >= 20 * 8000 * 2
    assert_echo_on_time("local, rutster call", speech, heard, 8000)
    assert paused == 0, f"{paused:.0f} barge-in pauses on an echo call"


async def test_sip_try_it_locally_echoes_a_pjsua2_call_on_time() -> None:
    pytest.importorskip("pjsua2", reason="pjsua2-python is not installed (SIP legs need it)")
    from rutster.tools.sip_peer import SipPeerProcess
    from tests.sip_stack import speech_16k

    speech = speech_16k(str(SPEECH_WAV), CALL_SECONDS)
    with run_block(SIP_DOC, "sip-local") as stack:
        assert _subcommands(stack)[-3:] == ["brain echo", "serve", "sip-worker"]
        async with httpx.AsyncClient(base_url=stack.gateway_url) as http:
            for _ in range(200):
                if (await http.get("/healthz")).json().get("sip_workers") == 1:
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the worker never connected to the gateway")
        async with SipPeerProcess(LOOPBACK) as peer:
            uri = f"sip:+15550001111@{LOOPBACK}:{stack.ports.sip}"
            call = await peer.place_call(uri, speech=speech, loop=False)
            assert call.answered, f"SIP {call.sip_code} {call.reason}"
            await asyncio.sleep(CALL_SECONDS + 1.5)
            heard = await peer.received_audio(call)
            await peer.hang_up(call)
            await peer.wait_ended(call, 5)
        await settled(stack)
        paused = barge_in_pauses(stack.gateway_url)
    print(f"[sip-local, pjsua2] whole call (diagnosis only): {echo_figures(speech, heard, 16000)}")
    print(f"[sip-local, pjsua2] lag per 2 s: {lag_timeline(speech, heard, 16000)}")
    assert_echo_on_time_through_jitter_buffer(
        "sip-local, pjsua2", segmented_echo(speech, heard, 16000)
    )
    assert paused == 0, f"{paused:.0f} barge-in pauses on an echo call"
