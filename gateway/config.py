"""Gateway configuration, read once from the environment.

Secrets come from an env var or, preferably, a ``*_FILE`` variable naming a
file (container secrets); the file wins when both are set. Secrets are never
logged: ``GatewayConfig`` hides them from ``repr``.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

from rutster.base.env_values import ConfigError, env_bool, env_float, env_int, read_secret
from rutster.base.stream_token import MIN_SECRET_BYTES
from rutster.gateway.drain import DEFAULT_DRAIN_TIMEOUT_S
from rutster.gateway.http_guard import DEFAULT_MAX_PER_SOURCE
from rutster.gateway.media_engine import DEFAULT_MARK_EVERY_FRAMES, MediaEngineConfig
from rutster.gateway.reflex import (
    CONFIRM_MS,
    CONFIRM_PROBABILITY,
    PAUSE_FLOOR_DBFS,
    PAUSE_MS,
    PAUSE_ON,
    PAUSE_PROBABILITY,
    RESUME_MS,
    PauseOn,
    ReflexConfig,
)
from rutster.gateway.spend_settings import SpendSettings
from rutster.gateway.tap_allowlist import TapUrlAllowlist
from rutster.gateway.tool_registry import (
    DEFAULT_CALLS_PER_CALL,
    DEFAULT_CALLS_PER_TURN,
    DEFAULT_RESULT_MAX_BYTES,
    DEFAULT_TOOL_TIMEOUT_MS,
    ToolLimits,
)
from rutster.gateway.transfer_allowlist import TransferAllowlist
from rutster.media import silero_kernel
from rutster.media.endpointing import MIN_SPEECH_MS, TRAILING_SILENCE_MS
from rutster.media.pacer import DEFAULT_LEAD_MS, DEFAULT_START_MS
from rutster.media.playout import DEFAULT_MAX_MS
from rutster.media.vad import (
    DEFAULT_DETECTOR,
    DEFAULT_SILERO_ENGINE,
    DETECTOR_NAMES,
    SILERO_ENGINES,
)
from rutster.trunk.twilio.call_control import ACCOUNT_SID_PATTERN, TWILIO_API_BASE_URL

#: Where the gateway is reached from the internet when nothing is configured: the
#: local dev default, matching ``rutster serve``'s default port.
DEFAULT_PUBLIC_URL = "http://127.0.0.1:8080"
#: The echo brain's default address (``rutster brain echo``).
DEFAULT_TAP_URL = "ws://127.0.0.1:8081/echo"
#: Random per-process stream-token secret length when none is configured (256 bits).
GENERATED_SECRET_BYTES = 32
#: How long the brain may stay unreachable before the call is ended; 0 = never
#: (TAP_PROTOCOL.md: the brain being down never ends a call by itself unless a
#: configured grace period runs out).
DEFAULT_BRAIN_GRACE_MS = 0


def _pause_on(env: Mapping[str, str]) -> PauseOn:
    raw = env.get("RUTSTER_BARGE_IN_PAUSE_ON", PAUSE_ON.value).strip().lower() or PAUSE_ON.value
    try:
        return PauseOn(raw)
    except ValueError:
        valid = ", ".join(p.value for p in PauseOn)
        raise ConfigError(
            f"RUTSTER_BARGE_IN_PAUSE_ON must be one of {valid}, got {raw!r}"
        ) from None


def _reflex_config(env: Mapping[str, str]) -> ReflexConfig:
    return ReflexConfig(
        min_speech_ms=env_int(env, "RUTSTER_MIN_SPEECH_MS", int(MIN_SPEECH_MS), minimum=20),
        trailing_silence_ms=env_int(
            env, "RUTSTER_TURN_SILENCE_MS", int(TRAILING_SILENCE_MS), minimum=100
        ),
        pause_ms=env_int(env, "RUTSTER_BARGE_IN_PAUSE_MS", PAUSE_MS, minimum=20),
        confirm_ms=env_int(env, "RUTSTER_BARGE_IN_CONFIRM_MS", CONFIRM_MS, minimum=20),
        pause_floor_dbfs=env_float(env, "RUTSTER_BARGE_IN_FLOOR_DBFS", PAUSE_FLOOR_DBFS),
        resume_ms=env_int(env, "RUTSTER_BARGE_IN_RESUME_MS", RESUME_MS, minimum=20),
        pause_on=_pause_on(env),
        pause_probability=env_float(
            env, "RUTSTER_BARGE_IN_PAUSE_PROBABILITY", PAUSE_PROBABILITY, minimum=0.0
        ),
        confirm_probability=env_float(
            env, "RUTSTER_BARGE_IN_CONFIRM_PROBABILITY", CONFIRM_PROBABILITY, minimum=0.0
        ),
        barge_in=env_bool(env, "RUTSTER_BARGE_IN", True),
        dtmf_barge_in=env_bool(env, "RUTSTER_DTMF_BARGE_IN", False),
    )


def public_ws_url(public_url: str, path: str) -> str:
    """The WebSocket URL a provider uses to reach ``path`` on the public base URL.

    ``https`` becomes ``wss`` (what Twilio requires); ``http`` becomes ``ws`` (local dev).
    """
    parts = urlsplit(public_url)
    scheme = "wss" if parts.scheme == "https" else "ws"
    base_path = parts.path.rstrip("/")
    return urlunsplit((scheme, parts.netloc, base_path + path, "", ""))


def public_http_url(public_url: str, path: str) -> str:
    """The HTTP(S) URL of ``path`` on the public base URL."""
    parts = urlsplit(public_url)
    return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/") + path, "", ""))


@dataclass(frozen=True)
class GatewayConfig:
    """Everything the gateway reads from its environment."""

    public_url: str = DEFAULT_PUBLIC_URL
    tap_url: str = DEFAULT_TAP_URL
    tap_allowlist: TapUrlAllowlist = field(default_factory=TapUrlAllowlist)
    tap_url_by_number: Mapping[str, str] = field(default_factory=dict)
    twilio_auth_token: str | None = field(default=None, repr=False)
    stream_secret: bytes = field(
        default_factory=lambda: secrets.token_bytes(GENERATED_SECRET_BYTES), repr=False
    )
    stream_secret_generated: bool = True
    playout_max_ms: int = DEFAULT_MAX_MS
    pacer_lead_ms: int = int(DEFAULT_LEAD_MS)
    #: HTTP connections one source IP may hold (gateway/http_guard.py; 0: no cap).
    http_max_per_source: int = DEFAULT_MAX_PER_SOURCE
    pacer_start_ms: int = int(DEFAULT_START_MS)
    mark_every_frames: int = DEFAULT_MARK_EVERY_FRAMES
    brain_grace_ms: int = DEFAULT_BRAIN_GRACE_MS
    twilio_account_sid: str | None = None
    twilio_api_base_url: str = TWILIO_API_BASE_URL
    transfer_allowlist: TransferAllowlist = field(default_factory=TransferAllowlist)
    tool_limits: ToolLimits = field(default_factory=ToolLimits)
    reflex: ReflexConfig = field(default_factory=ReflexConfig)
    vad: str = DEFAULT_DETECTOR
    #: How Silero runs (``RUTSTER_SILERO_ENGINE``): None for the default, the compiled
    #: kernel where it was built (media/vad.py DEFAULT_SILERO_ENGINE).
    silero_engine: str | None = None
    echo_canceller: bool = False
    #: The spend gate, REST API and Redis settings (gateway/spend_settings.py).
    spend: SpendSettings = field(default_factory=SpendSettings)
    #: How long a node asked to stop (SIGTERM) lets its calls run before it ends them
    #: (gateway/drain.py; 0: end them at once).
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    #: Calls this node holds at most, live or waiting for their media (None: no fixed
    #: cap; gateway/overload_guard.py).
    max_calls: int | None = None
    #: Refuse calls when the event loop is measured too busy for one more
    #: (gateway/overload_guard.py); off only to measure where a node breaks.
    overload_guard: bool = True
    #: Shared secret SIP workers present on ``/sip/workers`` (None: SIP is off).
    sip_secret: str | None = field(default=None, repr=False)
    #: The environment this configuration was read from: a provider whose settings
    #: are its own (gateway/providers/telnyx.py) reads them here, not through a field
    #: of this class. Never printed (it holds secrets).
    env: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    @property
    def sip_enabled(self) -> bool:
        """True when SIP workers may connect (``RUTSTER_SIP_SECRET`` is set)."""
        return self.sip_secret is not None

    @property
    def media_engine(self) -> MediaEngineConfig:
        """The per-call media settings (reflex loop, playout, pacer, marks)."""
        return MediaEngineConfig(
            reflex=self.reflex,
            playout_max_ms=self.playout_max_ms,
            pacer_lead_ms=self.pacer_lead_ms,
            pacer_start_ms=self.pacer_start_ms,
            mark_every_frames=self.mark_every_frames,
        )

    @property
    def twilio_rest_enabled(self) -> bool:
        """True when tools can act on Twilio calls through the REST API."""
        return self.twilio_account_sid is not None and self.twilio_auth_token is not None

    @property
    def signatures_enforced(self) -> bool:
        """True when Twilio signatures are checked (an auth token is configured)."""
        return self.twilio_auth_token is not None

    @property
    def twilio_stream_url(self) -> str:
        """The media-stream URL put in the TwiML (and signed by Twilio on upgrade)."""
        return public_ws_url(self.public_url, "/twilio/stream")

    @property
    def twilio_voice_url(self) -> str:
        """The public voice-webhook URL (what Twilio signs)."""
        return public_http_url(self.public_url, "/twilio/voice")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> GatewayConfig:
        """Build the configuration from ``env`` (default: ``os.environ``)."""
        env = os.environ if env is None else env
        public_url = env.get("RUTSTER_PUBLIC_URL", DEFAULT_PUBLIC_URL).strip() or DEFAULT_PUBLIC_URL
        parts = urlsplit(public_url)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.query:
            raise ConfigError(
                "RUTSTER_PUBLIC_URL must be an http(s) base URL without a query, "
                f"got {public_url!r}"
            )
        tap_url = env.get("RUTSTER_TAP_URL", DEFAULT_TAP_URL).strip() or DEFAULT_TAP_URL
        try:
            allowlist = TapUrlAllowlist.parse(env.get("RUTSTER_TAP_ALLOWLIST", ""), default=tap_url)
        except ValueError as exc:
            raise ConfigError(f"RUTSTER_TAP_ALLOWLIST / RUTSTER_TAP_URL: {exc}") from None
        by_number: dict[str, str] = {}
        for entry in filter(
            None, (e.strip() for e in env.get("RUTSTER_TAP_URL_BY_NUMBER", "").split(","))
        ):
            number, sep, url = entry.partition("=")
            if not sep or not number.strip() or not url.strip():
                raise ConfigError(
                    f"RUTSTER_TAP_URL_BY_NUMBER entries are NUMBER=URL, got {entry!r}"
                )
            if not allowlist.allows(url.strip()):
                raise ConfigError(
                    f"RUTSTER_TAP_URL_BY_NUMBER: {url.strip()!r} is not on RUTSTER_TAP_ALLOWLIST"
                )
            by_number[number.strip()] = url.strip()
        secret = read_secret(env, "RUTSTER_STREAM_SECRET")
        if secret is not None and len(secret.encode()) < MIN_SECRET_BYTES:
            raise ConfigError(
                f"RUTSTER_STREAM_SECRET must be at least {MIN_SECRET_BYTES} bytes long"
            )
        vad = env.get("RUTSTER_VAD", "").strip() or DEFAULT_DETECTOR
        if vad not in DETECTOR_NAMES:
            raise ConfigError(
                f"RUTSTER_VAD must be one of {', '.join(DETECTOR_NAMES)}, got {vad!r}"
            )
        silero_engine = env.get("RUTSTER_SILERO_ENGINE", "").strip() or None
        if silero_engine is not None and silero_engine not in SILERO_ENGINES:
            raise ConfigError(
                f"RUTSTER_SILERO_ENGINE must be one of {', '.join(SILERO_ENGINES)}, "
                f"got {silero_engine!r}"
            )
        if silero_engine == "compiled" and silero_kernel.KERNEL is None:
            raise ConfigError(
                "RUTSTER_SILERO_ENGINE=compiled, but the compiled Silero kernel was not built "
                "here (no C compiler at install) or this CPU lacks AVX2 and FMA; leave it "
                "unset to run Silero in onnxruntime"
            )
        echo_canceller = env_bool(env, "RUTSTER_ECHO_CANCELLER", False)
        if echo_canceller and importlib.util.find_spec("pywebrtc_audio") is None:
            raise ConfigError(
                "RUTSTER_ECHO_CANCELLER=on needs the pywebrtc-audio package: "
                "pip install 'rutster[aec]'"
            )
        account_sid = env.get("TWILIO_ACCOUNT_SID", "").strip() or None
        if account_sid is not None and not ACCOUNT_SID_PATTERN.fullmatch(account_sid):
            raise ConfigError("TWILIO_ACCOUNT_SID must be 'AC' followed by 32 hex digits")
        api_base = env.get("TWILIO_API_BASE_URL", "").strip() or TWILIO_API_BASE_URL
        base_parts = urlsplit(api_base)
        if base_parts.scheme not in ("http", "https") or not base_parts.netloc:
            raise ConfigError(f"TWILIO_API_BASE_URL must be an http(s) URL, got {api_base!r}")
        try:
            transfer_allowlist = TransferAllowlist.parse(env.get("RUTSTER_TRANSFER_ALLOWLIST", ""))
        except ValueError as exc:
            raise ConfigError(f"RUTSTER_TRANSFER_ALLOWLIST: {exc}") from None
        tool_limits = ToolLimits(
            calls_per_turn=env_int(
                env, "RUTSTER_TOOL_CALLS_PER_TURN", DEFAULT_CALLS_PER_TURN, minimum=1
            ),
            calls_per_call=env_int(
                env, "RUTSTER_TOOL_CALLS_PER_CALL", DEFAULT_CALLS_PER_CALL, minimum=1
            ),
            timeout_ms=env_int(env, "RUTSTER_TOOL_TIMEOUT_MS", DEFAULT_TOOL_TIMEOUT_MS, minimum=1),
            result_max_bytes=env_int(
                env, "RUTSTER_TOOL_RESULT_MAX_BYTES", DEFAULT_RESULT_MAX_BYTES, minimum=64
            ),
        )
        spend = SpendSettings.from_env(env)
        sip_secret = read_secret(env, "RUTSTER_SIP_SECRET")
        if sip_secret is not None and len(sip_secret.encode()) < MIN_SECRET_BYTES:
            raise ConfigError(f"RUTSTER_SIP_SECRET must be at least {MIN_SECRET_BYTES} bytes long")
        return cls(
            drain_timeout_s=env_float(
                env, "RUTSTER_DRAIN_TIMEOUT_S", DEFAULT_DRAIN_TIMEOUT_S, minimum=0.0
            ),
            max_calls=env_int(env, "RUTSTER_MAX_CALLS", 0) or None,
            overload_guard=env_bool(env, "RUTSTER_OVERLOAD_GUARD", True),
            env=dict(env),
            sip_secret=sip_secret,
            spend=spend,
            public_url=public_url,
            tap_url=tap_url,
            tap_allowlist=allowlist,
            tap_url_by_number=by_number,
            twilio_auth_token=read_secret(env, "TWILIO_AUTH_TOKEN"),
            stream_secret=(
                secret.encode() if secret else secrets.token_bytes(GENERATED_SECRET_BYTES)
            ),
            stream_secret_generated=secret is None,
            playout_max_ms=env_int(env, "RUTSTER_PLAYOUT_MAX_MS", DEFAULT_MAX_MS, minimum=20),
            pacer_lead_ms=env_int(env, "RUTSTER_PACER_LEAD_MS", int(DEFAULT_LEAD_MS)),
            http_max_per_source=env_int(
                env, "RUTSTER_HTTP_MAX_PER_SOURCE", DEFAULT_MAX_PER_SOURCE, minimum=0
            ),
            pacer_start_ms=env_int(env, "RUTSTER_PACER_START_MS", int(DEFAULT_START_MS)),
            mark_every_frames=env_int(
                env, "RUTSTER_MARK_EVERY_FRAMES", DEFAULT_MARK_EVERY_FRAMES, minimum=1
            ),
            brain_grace_ms=env_int(env, "RUTSTER_BRAIN_GRACE_MS", DEFAULT_BRAIN_GRACE_MS),
            twilio_account_sid=account_sid,
            twilio_api_base_url=api_base.rstrip("/"),
            transfer_allowlist=transfer_allowlist,
            tool_limits=tool_limits,
            reflex=_reflex_config(env),
            vad=vad,
            silero_engine=silero_engine,
            echo_canceller=echo_canceller,
        )


def silero_engine(config: GatewayConfig) -> str:
    """The engine Silero runs in under ``config`` (its own, else the process default)."""
    return config.silero_engine or DEFAULT_SILERO_ENGINE
