"""``GatewayConfig.from_env``: defaults, secrets, URLs, knobs, per-number brains."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rutster.base.env_values import ConfigError
from rutster.brains.echo import EchoBrain
from rutster.gateway.config import (
    DEFAULT_BRAIN_GRACE_MS,
    DEFAULT_PUBLIC_URL,
    DEFAULT_TAP_URL,
    GENERATED_SECRET_BYTES,
    GatewayConfig,
    silero_engine,
)
from rutster.gateway.media_engine import DEFAULT_MARK_EVERY_FRAMES
from rutster.gateway.reflex import PauseOn
from rutster.media import silero_kernel, vad
from rutster.media.pacer import DEFAULT_LEAD_MS, DEFAULT_START_MS
from rutster.media.playout import DEFAULT_MAX_MS
from rutster.tools.twilio_simulator import TwilioSimulator, new_sid, parse_connect_stream
from tests.conftest import TEST_AUTH_TOKEN, eventually, gateway_config, serve_gateway

TOKEN = "tok-SECRET-7f3a9c"  # distinctive, so a leak into a message or repr is easy to spot
STREAM_SECRET = "stream-SECRET-0123456789abcdef"
BRAIN_B = "ws://brains.internal:8082/b"


def write(tmp_path: Path, name: str, content: str | bytes) -> str:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return str(path)


def config_error(env: dict[str, str]) -> str:
    """The ConfigError message ``env`` produces (fails if it is accepted)."""
    with pytest.raises(ConfigError) as caught:
        GatewayConfig.from_env(env)
    return str(caught.value)


# ---- defaults ------------------------------------------------------------------------


def test_defaults() -> None:
    config = GatewayConfig.from_env({})
    assert config.public_url == DEFAULT_PUBLIC_URL
    assert config.tap_url == DEFAULT_TAP_URL
    assert config.tap_allowlist.entries == (DEFAULT_TAP_URL,)
    assert config.tap_allowlist.allows(DEFAULT_TAP_URL)
    assert dict(config.tap_url_by_number) == {}
    assert config.twilio_auth_token is None
    assert not config.signatures_enforced
    assert config.stream_secret_generated
    assert len(config.stream_secret) == GENERATED_SECRET_BYTES
    assert config.playout_max_ms == DEFAULT_MAX_MS
    assert config.pacer_lead_ms == int(DEFAULT_LEAD_MS)
    assert config.pacer_start_ms == int(DEFAULT_START_MS)
    assert config.mark_every_frames == DEFAULT_MARK_EVERY_FRAMES
    assert config.brain_grace_ms == DEFAULT_BRAIN_GRACE_MS
    assert config.twilio_stream_url == "ws://127.0.0.1:8080/twilio/stream"
    assert config.twilio_voice_url == "http://127.0.0.1:8080/twilio/voice"


def test_blank_values_mean_defaults() -> None:
    config = GatewayConfig.from_env(
        {
            "RUTSTER_PUBLIC_URL": "  ",
            "RUTSTER_TAP_URL": "",
            "TWILIO_AUTH_TOKEN": "   ",
            "RUTSTER_PLAYOUT_MAX_MS": " ",
        }
    )
    assert config.public_url == DEFAULT_PUBLIC_URL
    assert config.tap_url == DEFAULT_TAP_URL
    assert config.twilio_auth_token is None
    assert config.playout_max_ms == DEFAULT_MAX_MS


def test_generated_stream_secrets_differ_per_process_start() -> None:
    assert GatewayConfig.from_env({}).stream_secret != GatewayConfig.from_env({}).stream_secret


def test_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUTSTER_MARK_EVERY_FRAMES", "7")
    assert GatewayConfig.from_env().mark_every_frames == 7


# ---- secrets -------------------------------------------------------------------------


def test_auth_token_from_env() -> None:
    config = GatewayConfig.from_env({"TWILIO_AUTH_TOKEN": f"  {TOKEN}\n"})
    assert config.twilio_auth_token == TOKEN
    assert config.signatures_enforced


def test_auth_token_file_wins_over_env(tmp_path: Path) -> None:
    path = write(tmp_path, "token", f"{TOKEN}-from-file\n")
    config = GatewayConfig.from_env({"TWILIO_AUTH_TOKEN": TOKEN, "TWILIO_AUTH_TOKEN_FILE": path})
    assert config.twilio_auth_token == f"{TOKEN}-from-file"  # trailing newline stripped


def test_missing_token_file_is_a_clear_error_without_the_secret(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope")
    message = config_error({"TWILIO_AUTH_TOKEN": TOKEN, "TWILIO_AUTH_TOKEN_FILE": missing})
    assert "TWILIO_AUTH_TOKEN_FILE" in message
    assert missing in message
    assert TOKEN not in message


def test_unreadable_token_file_is_a_clear_error(tmp_path: Path) -> None:
    # A directory cannot be read as a file, whoever runs the tests (root ignores chmod).
    message = config_error({"TWILIO_AUTH_TOKEN_FILE": str(tmp_path)})
    assert "TWILIO_AUTH_TOKEN_FILE" in message and "cannot read" in message


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads anything")
def test_token_file_without_permission(tmp_path: Path) -> None:
    path = write(tmp_path, "token", TOKEN)
    os.chmod(path, 0)
    message = config_error({"TWILIO_AUTH_TOKEN_FILE": path})
    assert "cannot read" in message and TOKEN not in message


@pytest.mark.parametrize("content", ["", "\n", "  \n\t"])
def test_empty_token_file_is_an_error(tmp_path: Path, content: str) -> None:
    path = write(tmp_path, "token", content)
    message = config_error({"TWILIO_AUTH_TOKEN": TOKEN, "TWILIO_AUTH_TOKEN_FILE": path})
    assert "TWILIO_AUTH_TOKEN_FILE" in message and "empty" in message
    assert TOKEN not in message


def test_stream_secret_from_env_and_file(tmp_path: Path) -> None:
    from_env = GatewayConfig.from_env({"RUTSTER_STREAM_SECRET": STREAM_SECRET})
    assert from_env.stream_secret == STREAM_SECRET.encode()
    assert not from_env.stream_secret_generated
    path = write(tmp_path, "secret", STREAM_SECRET + "-file\n")
    from_file = GatewayConfig.from_env(
        {"RUTSTER_STREAM_SECRET": STREAM_SECRET, "RUTSTER_STREAM_SECRET_FILE": path}
    )
    assert from_file.stream_secret == (STREAM_SECRET + "-file").encode()
    assert not from_file.stream_secret_generated


def test_stream_secret_file_errors(tmp_path: Path) -> None:
    empty = write(tmp_path, "empty", "")
    message = config_error(
        {"RUTSTER_STREAM_SECRET": STREAM_SECRET, "RUTSTER_STREAM_SECRET_FILE": empty}
    )
    assert "RUTSTER_STREAM_SECRET_FILE" in message and STREAM_SECRET not in message
    message = config_error({"RUTSTER_STREAM_SECRET_FILE": str(tmp_path / "missing")})
    assert "RUTSTER_STREAM_SECRET_FILE" in message


def test_binary_stream_secret_file_is_used_or_refused_clearly(tmp_path: Path) -> None:
    # `head -c 32 /dev/urandom > secret` is the obvious way to make a stream secret.
    content = b"\xff\xfe" + bytes(range(1, 31))
    env = {"RUTSTER_STREAM_SECRET_FILE": write(tmp_path, "secret", content)}
    try:
        config = GatewayConfig.from_env(env)
    except ConfigError as exc:  # either refused with a clear message...
        assert "RUTSTER_STREAM_SECRET_FILE" in str(exc)
    else:  # ...or its bytes are the secret
        assert config.stream_secret == content
        assert not config.stream_secret_generated


def test_short_stream_secret_is_a_config_error() -> None:
    message = config_error({"RUTSTER_STREAM_SECRET": "too-short"})
    assert "RUTSTER_STREAM_SECRET" in message and "too-short" not in message


def test_repr_never_shows_secrets(tmp_path: Path) -> None:
    config = GatewayConfig.from_env(
        {
            "TWILIO_AUTH_TOKEN": TOKEN,
            "RUTSTER_STREAM_SECRET_FILE": write(tmp_path, "secret", STREAM_SECRET),
        }
    )
    assert config.twilio_auth_token == TOKEN
    for text in (repr(config), str(config), f"{config}", f"{config!r}"):
        assert TOKEN not in text
        assert STREAM_SECRET not in text
        assert "stream_secret=" not in text and "twilio_auth_token=" not in text
    assert "public_url=" in repr(config)  # the non-secret fields are still there


# ---- public URL ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "ftp://gw.example.com",
        "ws://gw.example.com",
        "wss://gw.example.com",
        "https://gw.example.com/?a=1",
        "https://gw.example.com/base?x",
        "gw.example.com",
        "https:///just/a/path",
        "/twilio",
    ],
)
def test_bad_public_url(url: str) -> None:
    message = config_error({"RUTSTER_PUBLIC_URL": url})
    assert "RUTSTER_PUBLIC_URL" in message


def test_https_public_url_gives_wss_stream_url() -> None:
    config = GatewayConfig.from_env({"RUTSTER_PUBLIC_URL": "https://gw.example.com"})
    assert config.twilio_stream_url == "wss://gw.example.com/twilio/stream"
    assert config.twilio_voice_url == "https://gw.example.com/twilio/voice"


@pytest.mark.parametrize(
    "base", ["https://gw.example.com/rutster", "https://gw.example.com/rutster/"]
)
def test_public_url_keeps_its_base_path(base: str) -> None:
    config = GatewayConfig.from_env({"RUTSTER_PUBLIC_URL": base})
    assert config.twilio_stream_url == "wss://gw.example.com/rutster/twilio/stream"
    assert config.twilio_voice_url == "https://gw.example.com/rutster/twilio/voice"


def test_http_public_url_with_port_gives_ws() -> None:
    config = GatewayConfig.from_env({"RUTSTER_PUBLIC_URL": "http://10.0.0.5:9000/gw"})
    assert config.twilio_stream_url == "ws://10.0.0.5:9000/gw/twilio/stream"
    assert config.twilio_voice_url == "http://10.0.0.5:9000/gw/twilio/voice"


# ---- integer knobs -------------------------------------------------------------------


def test_integer_knobs_are_read() -> None:
    config = GatewayConfig.from_env(
        {
            "RUTSTER_PLAYOUT_MAX_MS": "5000",
            "RUTSTER_PACER_LEAD_MS": "40",
            "RUTSTER_PACER_START_MS": "0",
            "RUTSTER_MARK_EVERY_FRAMES": " 5 ",
            "RUTSTER_BRAIN_GRACE_MS": "3000",
        }
    )
    assert (
        config.playout_max_ms,
        config.pacer_lead_ms,
        config.pacer_start_ms,
        config.mark_every_frames,
        config.brain_grace_ms,
    ) == (5000, 40, 0, 5, 3000)


KNOBS = [
    "RUTSTER_PLAYOUT_MAX_MS",
    "RUTSTER_PACER_LEAD_MS",
    "RUTSTER_PACER_START_MS",
    "RUTSTER_MARK_EVERY_FRAMES",
    "RUTSTER_BRAIN_GRACE_MS",
]


@pytest.mark.parametrize("name", KNOBS)
@pytest.mark.parametrize("raw", ["abc", "1.5", "20ms", "0x10", "1e3", "-1"])
def test_bad_integer_knobs(name: str, raw: str) -> None:
    message = config_error({name: raw})
    assert name in message
    assert raw in message


@pytest.mark.parametrize(
    ("name", "raw"),
    [("RUTSTER_PLAYOUT_MAX_MS", "10"), ("RUTSTER_MARK_EVERY_FRAMES", "0")],
)
def test_integer_knob_minimums(name: str, raw: str) -> None:
    assert ">=" in config_error({name: raw})


# ---- brains: allowlist and per-number URLs ---------------------------------------------


def test_tap_url_by_number() -> None:
    config = GatewayConfig.from_env(
        {
            "RUTSTER_TAP_ALLOWLIST": "ws://brains.internal:8082/",
            "RUTSTER_TAP_URL_BY_NUMBER": (
                f" +15550001111 = {BRAIN_B} , +15550002222={DEFAULT_TAP_URL},,"
            ),
        }
    )
    assert dict(config.tap_url_by_number) == {
        "+15550001111": BRAIN_B,
        "+15550002222": DEFAULT_TAP_URL,  # the default tap URL is always allowed
    }


@pytest.mark.parametrize(
    "raw",
    ["+15550001111", f"={BRAIN_B}", "+15550001111=", "+15550001111= ", f"  ={BRAIN_B}"],
)
def test_tap_url_by_number_malformed(raw: str) -> None:
    message = config_error(
        {"RUTSTER_TAP_ALLOWLIST": "ws://brains.internal:8082/", "RUTSTER_TAP_URL_BY_NUMBER": raw}
    )
    assert "RUTSTER_TAP_URL_BY_NUMBER" in message and "NUMBER=URL" in message


@pytest.mark.parametrize(
    "url",
    [
        "ws://brains.internal:8083/b",  # other port
        "ws://169.254.169.254/latest",  # the classic SSRF target
        "http://brains.internal:8082/b",
        "ws://brains.internal:8082/b?x=1",
    ],
)
def test_tap_url_by_number_must_be_allowlisted(url: str) -> None:
    message = config_error(
        {
            "RUTSTER_TAP_ALLOWLIST": "ws://brains.internal:8082/",
            "RUTSTER_TAP_URL_BY_NUMBER": f"+15550001111={BRAIN_B},+15550002222={url}",
        }
    )
    assert "RUTSTER_TAP_ALLOWLIST" in message and url in message


def test_bad_allowlist_is_refused() -> None:
    with pytest.raises(ValueError, match="http://x"):
        GatewayConfig.from_env({"RUTSTER_TAP_ALLOWLIST": "http://x/"})
    with pytest.raises(ValueError, match="https://brain"):
        GatewayConfig.from_env({"RUTSTER_TAP_URL": "https://brain/echo"})


def test_bad_allowlist_is_a_config_error_naming_the_variable() -> None:
    assert "RUTSTER_TAP_ALLOWLIST" in config_error({"RUTSTER_TAP_ALLOWLIST": "http://x/"})


# ---- in a running gateway: which brain is dialled --------------------------------------


async def test_per_number_brain_is_dialled(echo_brain: EchoBrain, speech_pcm: bytes) -> None:
    routed_number = "+15550003333"
    async with EchoBrain() as sales_brain:
        config = gateway_config(
            echo_brain.url,
            allow=sales_brain.url,
            tap_url_by_number={routed_number: sales_brain.url},
        )
        async with serve_gateway(config) as gateway:
            sim = TwilioSimulator(gateway.url, auth_token=TEST_AUTH_TOKEN)
            pcm = speech_pcm[: 8000 * 2]  # 1 s
            result = await sim.place_call(pcm, to=routed_number, tail_s=0.5)
            assert sales_brain.connections == 1
            assert sales_brain.frames_echoed > 0
            assert echo_brain.connections == 0
            assert result.media_received > 0
            # Another number still goes to the default brain.
            await sim.place_call(pcm[:8000], to="+15550009999", tail_s=0.3)
            await eventually(lambda: echo_brain.connections == 1)
            assert sales_brain.connections == 1
            await eventually(lambda: not gateway.state.calls)


async def test_query_brain_beats_per_number_brain(echo_brain: EchoBrain) -> None:
    number_brain = "ws://127.0.0.1:9/number"
    query_brain = "ws://127.0.0.1:9/query"
    config = gateway_config(
        echo_brain.url,
        allow="ws://127.0.0.1:9/",
        tap_url_by_number={"+15550003333": number_brain},
    )
    async with serve_gateway(config) as gateway:
        sim = TwilioSimulator(gateway.url, auth_token=TEST_AUTH_TOKEN)

        async def chosen(to: str, query: str = "") -> str:
            response = await sim.post_voice_webhook(new_sid("CA"), from_="+1", to=to, query=query)
            assert response.status_code == 200, response.text
            return parse_connect_stream(response.text).parameters["tap_url"]

        assert await chosen("+15550003333") == number_brain
        assert await chosen("+15550003333", f"brain={query_brain}") == query_brain
        assert await chosen("+15550004444") == echo_brain.url


def test_reflex_knobs_from_the_environment() -> None:
    config = GatewayConfig.from_env(
        {
            "RUTSTER_BARGE_IN": "off",
            "RUTSTER_BARGE_IN_CONFIRM_MS": "500",
            "RUTSTER_BARGE_IN_FLOOR_DBFS": "-40.5",
            "RUTSTER_TURN_SILENCE_MS": "700",
            "RUTSTER_DTMF_BARGE_IN": "yes",
            "RUTSTER_VAD": "webrtc",
            "RUTSTER_ECHO_CANCELLER": "on",
            "RUTSTER_BARGE_IN_PAUSE_ON": "Energy",
            "RUTSTER_BARGE_IN_PAUSE_PROBABILITY": "0.6",
            "RUTSTER_BARGE_IN_CONFIRM_PROBABILITY": "0.45",
        }
    )
    assert config.reflex.pause_on is PauseOn.ENERGY
    assert config.reflex.pause_probability == 0.6
    assert config.reflex.confirm_probability == 0.45
    assert GatewayConfig.from_env({}).reflex.confirm_probability == 0.35
    assert GatewayConfig.from_env({}).reflex.pause_on is PauseOn.SPEECH
    assert not config.reflex.barge_in
    assert config.reflex.confirm_ms == 500
    assert config.reflex.pause_floor_dbfs == -40.5
    assert config.reflex.trailing_silence_ms == 700
    assert config.reflex.dtmf_barge_in
    assert config.vad == "webrtc"
    assert config.echo_canceller


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RUTSTER_BARGE_IN": "maybe"}, "RUTSTER_BARGE_IN must be on/off"),
        ({"RUTSTER_VAD": "magic"}, "RUTSTER_VAD must be one of energy, webrtc, silero, cascade"),
        ({"RUTSTER_BARGE_IN_FLOOR_DBFS": "loud"}, "must be a number"),
        ({"RUTSTER_BARGE_IN_CONFIRM_MS": "5"}, "must be >= 20"),
        (
            {"RUTSTER_BARGE_IN_PAUSE_ON": "vibes"},
            "RUTSTER_BARGE_IN_PAUSE_ON must be one of energy, speech, hold",
        ),
        ({"RUTSTER_BARGE_IN_PAUSE_PROBABILITY": "-1"}, "must be >= 0"),
        ({"RUTSTER_BARGE_IN_CONFIRM_PROBABILITY": "nan"}, "must be >= 0"),
    ],
)
def test_reflex_knob_errors_are_clear(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        GatewayConfig.from_env(env)


def test_the_silero_engine_is_chosen_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert GatewayConfig.from_env({}).silero_engine is None
    assert silero_engine(GatewayConfig.from_env({})) == vad.DEFAULT_SILERO_ENGINE
    forced = GatewayConfig.from_env({"RUTSTER_SILERO_ENGINE": "onnxruntime"})
    assert silero_engine(forced) == "onnxruntime"
    assert vad.make_detector("silero", forced.silero_engine).engine == "onnxruntime"  # type: ignore[attr-defined]
    with pytest.raises(
        ConfigError, match="RUTSTER_SILERO_ENGINE must be one of compiled, onnxruntime"
    ):
        GatewayConfig.from_env({"RUTSTER_SILERO_ENGINE": "torch"})
    # Asked for where it cannot run: refused at start, not a silent fallback.
    monkeypatch.setattr(silero_kernel, "KERNEL", None)
    with pytest.raises(ConfigError, match="the compiled Silero kernel was not built here"):
        GatewayConfig.from_env({"RUTSTER_SILERO_ENGINE": "compiled"})


# ---- spend and API settings (gateway/spend_settings.py) -------------------------------


def test_spend_defaults_are_embedded_redis_and_modest_tenant_limits() -> None:
    spend = GatewayConfig.from_env({}).spend
    assert spend.redis_url is None and spend.redis_prefix == "rutster"
    assert spend.admin_key is None
    assert spend.policy.admit_when_store_down is False
    limits = spend.policy.default_limits
    assert (limits.budget_day, limits.budget_month) == (20_000_000, 200_000_000)
    assert limits.max_concurrent == 10 and limits.caller_calls_per_hour == 20
    assert spend.tenant_for_number("+15550001111") == "default"
    assert "admin_key" not in repr(spend)


def test_spend_settings_are_read(tmp_path: Path) -> None:
    key_file = tmp_path / "admin"
    key_file.write_text("k" * 32 + "\n")
    spend = GatewayConfig.from_env(
        {
            "REDIS_URL": "redis://redis.internal:6379/2",
            "RUTSTER_REDIS_PREFIX": "gw2",
            "RUTSTER_ADMIN_KEY_FILE": str(key_file),
            "RUTSTER_ADMIN_KEY": "ignored-because-the-file-wins-000000",
            "RUTSTER_DEFAULT_BUDGET_DAY": "12.50",
            "RUTSTER_DEFAULT_MAX_CONCURRENT": "0",
            "RUTSTER_MAX_CALL_COST": "0.75",
            "RUTSTER_SPEND_ON_REDIS_DOWN": "admit",
            "RUTSTER_TENANT_BY_NUMBER": "+15550001111=acme, +15550002222=globex",
            "RUTSTER_BRAINS": "sales=wss://brains.internal/realtime",
            "RUTSTER_REFUSAL_RESPONSE": "busy",
            "RUTSTER_GOODBYE_TEXT": "Goodbye.",
            "RUTSTER_MEDIA_CONNECT_TIMEOUT_S": "7.5",
        }
    ).spend
    assert spend.redis_url == "redis://redis.internal:6379/2" and spend.redis_prefix == "gw2"
    assert spend.admin_key == "k" * 32
    assert spend.policy.default_limits.budget_day == 12_500_000
    assert spend.policy.default_limits.max_concurrent == 0
    assert spend.policy.max_call_cost == 750_000
    assert spend.policy.admit_when_store_down is True
    assert spend.tenant_for_number("+15550002222") == "globex"
    assert spend.brains == {"sales": "wss://brains.internal/realtime"}
    assert (spend.refusal_response, spend.goodbye_text) == ("busy", "Goodbye.")
    assert spend.media_connect_timeout_s == 7.5


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"REDIS_URL": "http://redis:6379"}, "REDIS_URL must be a redis://"),
        ({"RUTSTER_ADMIN_KEY": "short"}, "at least 24 characters"),
        ({"RUTSTER_DEFAULT_BUDGET_DAY": "12.5.0"}, "RUTSTER_DEFAULT_BUDGET_DAY"),
        ({"RUTSTER_DEFAULT_BUDGET_DAY": "-1"}, "RUTSTER_DEFAULT_BUDGET_DAY"),
        ({"RUTSTER_DEFAULT_MAX_CONCURRENT": "many"}, "must be an integer"),
        ({"RUTSTER_SPEND_ON_REDIS_DOWN": "maybe"}, "refuse or admit"),
        ({"RUTSTER_TENANT_BY_NUMBER": "+1555=Acme Corp"}, "tenant ids are lowercase"),
        ({"RUTSTER_TENANT_BY_NUMBER": "+1555"}, "KEY=VALUE"),
        ({"RUTSTER_BRAINS": "Sales=ws://x"}, "brain names are lowercase"),
        ({"RUTSTER_REFUSAL_RESPONSE": "hangup"}, "RUTSTER_REFUSAL_RESPONSE"),
        ({"RUTSTER_PRICES_FILE": "/nonexistent/prices.json"}, "RUTSTER_PRICES_FILE"),
        ({"RUTSTER_API_RATE_PER_S": "nan"}, "RUTSTER_API_RATE_PER_S"),
        ({"RUTSTER_RETENTION_S": "10"}, "RUTSTER_RETENTION_S must be >= 60"),
        ({"RUTSTER_MEDIA_CONNECT_TIMEOUT_S": "0.5"}, "RUTSTER_MEDIA_CONNECT_TIMEOUT_S must be >="),
        # The stream token's 60 s lifetime is sized for at most 30 s of it.
        (
            {"RUTSTER_MEDIA_CONNECT_TIMEOUT_S": "31"},
            "RUTSTER_MEDIA_CONNECT_TIMEOUT_S must be <= 30",
        ),
        ({"RUTSTER_MEDIA_CONNECT_TIMEOUT_S": "soon"}, "must be a number"),
    ],
)
def test_bad_spend_settings_are_refused_clearly(env: dict[str, str], fragment: str) -> None:
    assert fragment in config_error(env)


def test_a_bad_price_file_names_the_json_path(tmp_path: Path) -> None:
    prices = tmp_path / "prices.json"
    prices.write_text('{"telephony": {}, "brains": {"gpt-realtime": {"audio_in_per_million": 3}}}')
    message = config_error({"RUTSTER_PRICES_FILE": str(prices)})
    assert "RUTSTER_PRICES_FILE" in message and "gpt-realtime" in message


def test_the_node_limits_default_to_the_measured_guard_with_no_fixed_cap() -> None:
    config = GatewayConfig.from_env({})
    assert (config.max_calls, config.overload_guard) == (None, True)
    config = GatewayConfig.from_env({"RUTSTER_MAX_CALLS": "40", "RUTSTER_OVERLOAD_GUARD": "off"})
    assert (config.max_calls, config.overload_guard) == (40, False)
    assert GatewayConfig.from_env({"RUTSTER_MAX_CALLS": "0"}).max_calls is None
    assert "RUTSTER_MAX_CALLS" in config_error({"RUTSTER_MAX_CALLS": "-1"})
    assert "RUTSTER_MAX_CALLS" in config_error({"RUTSTER_MAX_CALLS": "lots"})
    assert "RUTSTER_OVERLOAD_GUARD" in config_error({"RUTSTER_OVERLOAD_GUARD": "maybe"})
