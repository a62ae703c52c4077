"""The realtime brain's configuration, read once from the environment.

The API key comes from ``OPENAI_API_KEY`` or, preferably, ``OPENAI_API_KEY_FILE``
(the file wins); it is hidden from ``repr`` and never logged. In mock mode no
key is needed: the brain talks to a local fake server (``tools/realtime_mock_server.py``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rutster.base.env_values import ConfigError, read_secret
from rutster.brains.bind import BRAIN_BIND_ENV, parse_bind
from rutster.protocols.tap import ToolSpec
from rutster.protocols.tool_catalog import parse_tool_list

#: Default model: the GA ``gpt-realtime`` alias, the first model in the SDK's GA
#: literal list (docs/PROVIDERS.md §5.1); a dated snapshot pins behaviour if wanted.
DEFAULT_MODEL = "gpt-realtime"
#: Default voice: OpenAI recommends ``marin`` and ``cedar`` for the GA models
#: (docs/PROVIDERS.md §5.2).
DEFAULT_VOICE = "marin"
#: Built-in voices of the GA API (docs/PROVIDERS.md §5.2); custom voices are ``voice_…`` ids.
KNOWN_VOICES = frozenset(
    {"alloy", "ash", "ballad", "coral", "echo", "sage", "shimmer", "verse", "marin", "cedar"}
)
_CUSTOM_VOICE = re.compile(r"voice_[A-Za-z0-9]{1,64}")
#: Default instructions: short, phone-shaped. Seed decision; operators override them.
DEFAULT_INSTRUCTIONS = (
    "You are a helpful voice assistant on a phone call. Keep answers short and "
    "conversational, one or two sentences. If the caller wants to end the call, "
    "say goodbye and use the hangup tool."
)
#: Longest instructions accepted: OpenAI does not document a limit; 64 KiB keeps a
#: mistaken file (a log, a binary) from being sent on every session. Seed decision.
MAX_INSTRUCTIONS_BYTES = 64 * 1024
#: The realtime brain's default address (the issue's ``ws://127.0.0.1:8082/realtime``).
DEFAULT_REALTIME_HOST = "127.0.0.1"
DEFAULT_REALTIME_PORT = 8082
REALTIME_PATH = "/realtime"
#: The key the brain presents to the local mock server (it checks only that one is sent).
MOCK_API_KEY = "mock-key-offline-not-an-openai-key"


@dataclass(frozen=True)
class RealtimeBrainConfig:
    """Everything the realtime brain reads from its environment."""

    api_key: str = field(repr=False)
    model: str = DEFAULT_MODEL
    voice: str = DEFAULT_VOICE
    instructions: str = DEFAULT_INSTRUCTIONS
    tools: tuple[ToolSpec, ...] = ()
    host: str = DEFAULT_REALTIME_HOST
    port: int = DEFAULT_REALTIME_PORT
    #: ``ws://…/v1`` of the mock server in mock mode; None = OpenAI's own endpoint.
    websocket_base_url: str | None = None
    mock: bool = False

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, *, mock: bool = False
    ) -> RealtimeBrainConfig:
        """Build the configuration; ``ConfigError`` says what is missing or wrong.

        Outside mock mode a missing key is an error here, so the process exits
        at startup with a clear message rather than failing on the first call.
        """
        env = os.environ if env is None else env
        key = read_secret(env, "OPENAI_API_KEY")
        if key is None:
            if not mock:
                raise ConfigError(
                    "no OpenAI API key: set OPENAI_API_KEY_FILE (a file holding the key) or "
                    "OPENAI_API_KEY, or run with --mock for the offline mock server"
                )
            key = MOCK_API_KEY
        model = env.get("OPENAI_REALTIME_MODEL", "").strip() or DEFAULT_MODEL
        voice = env.get("OPENAI_REALTIME_VOICE", "").strip() or DEFAULT_VOICE
        if voice not in KNOWN_VOICES and not _CUSTOM_VOICE.fullmatch(voice):
            raise ConfigError(
                f"OPENAI_REALTIME_VOICE {voice!r} is not a known voice "
                f"({', '.join(sorted(KNOWN_VOICES))}) or a voice_… id"
            )
        try:
            tools = parse_tool_list(env.get("RUTSTER_BRAIN_TOOLS"))
        except ValueError as exc:
            raise ConfigError(f"RUTSTER_BRAIN_TOOLS: {exc}") from None
        try:
            host, port = parse_bind(
                env.get(BRAIN_BIND_ENV),
                default_host=DEFAULT_REALTIME_HOST,
                default_port=DEFAULT_REALTIME_PORT,
            )
        except ValueError as exc:
            raise ConfigError(f"{BRAIN_BIND_ENV}: {exc}") from None
        return cls(
            api_key=key,
            model=model,
            voice=voice,
            instructions=_instructions(env),
            tools=tools,
            host=host,
            port=port,
            mock=mock,
        )


def _instructions(env: Mapping[str, str]) -> str:
    path = env.get("RUTSTER_BRAIN_INSTRUCTIONS_FILE", "").strip()
    if path:
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise ConfigError(
                f"RUTSTER_BRAIN_INSTRUCTIONS_FILE: cannot read {path!r}: {exc.strerror}"
            ) from None
        if len(data) > MAX_INSTRUCTIONS_BYTES:
            raise ConfigError(
                f"RUTSTER_BRAIN_INSTRUCTIONS_FILE: {path!r} is over {MAX_INSTRUCTIONS_BYTES} bytes"
            )
        try:
            text = data.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise ConfigError(
                f"RUTSTER_BRAIN_INSTRUCTIONS_FILE: {path!r} is not UTF-8 text"
            ) from None
        if not text:
            raise ConfigError(f"RUTSTER_BRAIN_INSTRUCTIONS_FILE: {path!r} is empty")
        return text
    text = env.get("RUTSTER_BRAIN_INSTRUCTIONS", "").strip()
    if len(text.encode()) > MAX_INSTRUCTIONS_BYTES:
        raise ConfigError(f"RUTSTER_BRAIN_INSTRUCTIONS is over {MAX_INSTRUCTIONS_BYTES} bytes")
    return text or DEFAULT_INSTRUCTIONS
