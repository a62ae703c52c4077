"""``rutster admin``: operator commands against a running gateway's REST API.

- ``rutster admin create-key --tenant T [--label L] [--role tenant|admin]`` issues an
  API key (``POST /v1/admin/keys``) and prints it, alone on one line, on stdout, so
  ``KEY=$(rutster admin create-key --tenant acme)`` works; what it is goes to stderr.
- ``rutster admin kill-switch on|off|status`` engages, releases or reads the kill switch.
- ``rutster admin limits --tenant T [--budget-day 12.50 ...]`` reads a tenant's limits,
  or changes the ones given (``PUT``), and prints them as JSON.

Every command authenticates with the operator's admin key from
``RUTSTER_ADMIN_KEY_FILE`` (wins) or ``RUTSTER_ADMIN_KEY``. The key is sent only in
the ``Authorization`` header: it is never printed, logged or put in an error message.

Exit codes: 0 done; 1 the API answered an error (its message is printed); 2 usage or
configuration error (no admin key, unreadable key file, bad gateway URL); 3 the
gateway could not be reached or did not answer in time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote, urlsplit

#: Exit codes (module doc).
EXIT_OK = 0
EXIT_API_ERROR = 1
EXIT_CONFIG = 2
EXIT_UNREACHABLE = 3
#: The gateway when neither ``--gateway`` nor ``RUTSTER_PUBLIC_URL`` says otherwise:
#: ``rutster serve``'s default address (gateway.config.DEFAULT_PUBLIC_URL).
DEFAULT_GATEWAY_URL = "http://127.0.0.1:8080"
#: Env var naming the gateway's public base URL (the same one the gateway reads).
PUBLIC_URL_ENV = "RUTSTER_PUBLIC_URL"
#: Env var of the admin key (``RUTSTER_ADMIN_KEY_FILE`` names a file holding it instead).
ADMIN_KEY_ENV = "RUTSTER_ADMIN_KEY"
#: Seconds to wait for an answer. Seed decision: every admin endpoint answers from
#: Redis in milliseconds; a gateway silent for 10 s is stuck, and the operator should
#: hear so rather than wait.
REQUEST_TIMEOUT_S = 10.0
#: Longest non-JSON error body quoted back (a proxy's HTML page must not flood stderr).
MAX_QUOTED_BODY_CHARS = 200
#: Characters of an RFC 6750 ``b64token``: what a bearer token may contain in a header.
_BEARER_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})

#: ``--flag`` → API field of ``PUT /v1/tenants/{id}/limits``; money as decimal USD strings.
MONEY_LIMIT_FLAGS = {
    "budget_day": "USD per UTC day, e.g. 12.50 (0 = unlimited)",
    "budget_month": "USD per UTC month (0 = unlimited)",
    "max_call_cost": "USD per call (0 = no cap)",
}
COUNT_LIMIT_FLAGS = {
    "max_concurrent": "simultaneous calls (0 = unlimited)",
    "max_call_duration_s": "seconds per call (0 = no cap)",
    "caller_calls_per_hour": "calls per hour from one caller number (0 = unlimited)",
    "campaign_calls_per_minute": "calls per minute per campaign (0 = unlimited)",
}


class AdminCliError(Exception):
    """A failure to report on stderr, with the exit code it maps to."""

    def __init__(self, exit_code: int, message: str) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.message = message


def gateway_url(explicit: str | None, env: Mapping[str, str]) -> str:
    """The gateway's base URL: ``--gateway``, else ``$RUTSTER_PUBLIC_URL``, else the default."""
    url = (explicit or env.get(PUBLIC_URL_ENV, "").strip() or DEFAULT_GATEWAY_URL).rstrip("/")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - reading the port is what validates it
    except ValueError:
        raise AdminCliError(EXIT_CONFIG, f"gateway URL {url!r} is not a valid URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query:
        raise AdminCliError(
            EXIT_CONFIG,
            f"gateway URL must be an http(s) base URL like {DEFAULT_GATEWAY_URL}, got {url!r}",
        )
    return url


def admin_key(env: Mapping[str, str]) -> str:
    """The admin key from ``RUTSTER_ADMIN_KEY_FILE`` (wins) or ``RUTSTER_ADMIN_KEY``."""
    from rutster.base.env_values import ConfigError, read_secret

    try:
        key = read_secret(env, ADMIN_KEY_ENV)
    except ConfigError as exc:
        raise AdminCliError(EXIT_CONFIG, str(exc)) from None
    if key is None:
        raise AdminCliError(
            EXIT_CONFIG,
            f"no admin key: set {ADMIN_KEY_ENV}_FILE (a file holding the gateway's admin key) "
            f"or {ADMIN_KEY_ENV}",
        )
    if _BEARER_TOKEN.fullmatch(key) is None:
        # Never quote the key itself, not even a part of it.
        raise AdminCliError(
            EXIT_CONFIG,
            f"the admin key from {ADMIN_KEY_ENV}(_FILE) contains characters a bearer token "
            "cannot carry (allowed: letters, digits, -._~+/ and trailing '=')",
        )
    return key


def _describe_error(status: int, body: Any, text: str) -> str:
    """One line for an error answer: the API's code and message (and field or reason)."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        quoted = " ".join(text.split())[:MAX_QUOTED_BODY_CHARS]
        return f"HTTP {status}" + (f": {quoted}" if quoted else "")
    line = f"HTTP {status} {error.get('code', 'error')}: {error['message']}"
    if isinstance(error.get("field"), str):
        line += f" (field: {error['field']})"
    if isinstance(error.get("reason"), str):
        line += f" (reason: {error['reason']})"
    return line


def api_call(
    base_url: str,
    method: str,
    path: str,
    key: str,
    body: Mapping[str, Any] | None = None,
    *,
    timeout_s: float | None = None,
) -> dict[str, Any]:
    """Send one authenticated request; the answer's JSON object, or :class:`AdminCliError`.

    ``timeout_s`` defaults to :data:`REQUEST_TIMEOUT_S` (read at call time).
    """
    import httpx

    timeout_s = REQUEST_TIMEOUT_S if timeout_s is None else timeout_s

    # A loopback gateway is never reached through a proxy from the environment: the
    # admin key would otherwise travel to the proxy for nothing.
    trust_env = urlsplit(base_url).hostname not in _LOOPBACK_HOSTS
    headers = {"Authorization": f"Bearer {key}", "Accept": "application/json"}
    try:
        with httpx.Client(timeout=timeout_s, trust_env=trust_env) as client:
            response = client.request(method, base_url + path, headers=headers, json=body)
    except httpx.TimeoutException:
        raise AdminCliError(
            EXIT_UNREACHABLE, f"the gateway at {base_url} did not answer within {timeout_s:g} s"
        ) from None
    except httpx.TransportError as exc:
        # The exception text names the transport failure, never the request headers.
        raise AdminCliError(
            EXIT_UNREACHABLE,
            f"cannot reach the gateway at {base_url} ({type(exc).__name__}: {exc}); "
            f"is it running? (--gateway or ${PUBLIC_URL_ENV})",
        ) from None
    try:
        parsed: Any = response.json()
    except ValueError:
        parsed = None
    if not response.is_success:
        raise AdminCliError(
            EXIT_API_ERROR, _describe_error(response.status_code, parsed, response.text)
        )
    if not isinstance(parsed, dict):
        raise AdminCliError(
            EXIT_API_ERROR,
            f"HTTP {response.status_code} from {base_url + path} is not a JSON object; "
            "is that a rutster gateway?",
        )
    return parsed


def _print_json(value: Mapping[str, Any]) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))


def cmd_create_key(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """``create-key``: issue a key; only the key goes to stdout."""
    url = gateway_url(args.gateway, env)
    key = admin_key(env)
    body: dict[str, Any] = {"tenant": args.tenant, "role": args.role}
    if args.label is not None:
        body["label"] = args.label
    issued = api_call(url, "POST", "/v1/admin/keys", key, body)
    new_key = issued.get("key")
    if not isinstance(new_key, str) or not new_key:
        raise AdminCliError(EXIT_API_ERROR, "the gateway's answer holds no key")
    label = issued.get("label")
    print(
        f"created a {issued.get('role', args.role)} key for tenant {issued.get('tenant')}"
        + (f" (label {label!r})" if label else "")
        + ". It is shown only once: store it now.",
        file=sys.stderr,
    )
    print(new_key)
    return EXIT_OK


def cmd_kill_switch(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """``kill-switch on|off|status``: print the switch's state as JSON."""
    url = gateway_url(args.gateway, env)
    key = admin_key(env)
    if args.action == "status":
        state = api_call(url, "GET", "/v1/admin/kill-switch", key)
    else:
        engaged = args.action == "on"
        state = api_call(url, "PUT", "/v1/admin/kill-switch", key, {"engaged": engaged})
        print(
            "kill switch ENGAGED: no new call is admitted (calls in progress go on)"
            if engaged
            else "kill switch released: calls are admitted again",
            file=sys.stderr,
        )
    _print_json(state)
    return EXIT_OK


def cmd_limits(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """``limits --tenant T [...]``: PUT the limits given (if any), print the limits as JSON."""
    url = gateway_url(args.gateway, env)
    key = admin_key(env)
    changes: dict[str, Any] = {
        name: getattr(args, name)
        for name in (*MONEY_LIMIT_FLAGS, *COUNT_LIMIT_FLAGS)
        if getattr(args, name) is not None
    }
    # quote(safe=""): the tenant stays one path segment whatever it holds; the API
    # then judges it (422 for anything that is not a tenant id).
    path = f"/v1/tenants/{quote(args.tenant, safe='')}/limits"
    if changes:
        limits = api_call(url, "PUT", path, key, changes)
        print(
            f"limits of tenant {args.tenant} changed: {', '.join(sorted(changes))}", file=sys.stderr
        )
    else:
        limits = api_call(url, "GET", path, key)
    _print_json(limits)
    return EXIT_OK


Command = Callable[[argparse.Namespace, Mapping[str, str]], int]


def _run(command: Command) -> Callable[[argparse.Namespace], int]:
    """Wrap a command: :class:`AdminCliError` becomes a message on stderr and its exit code."""

    def run(args: argparse.Namespace) -> int:
        try:
            code: int = command(args, os.environ)
        except AdminCliError as exc:
            print(f"rutster admin: {exc.message}", file=sys.stderr)
            return exc.exit_code
        return code

    return run


def add_admin_parser(sub: Any) -> None:
    """Register ``rutster admin`` (create-key, kill-switch, limits) on ``rutster``'s subparsers."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--gateway",
        default=None,
        help=f"the gateway's base URL (default ${PUBLIC_URL_ENV}, else {DEFAULT_GATEWAY_URL})",
    )
    admin: argparse.ArgumentParser = sub.add_parser(
        "admin",
        help="operator commands against a running gateway (needs RUTSTER_ADMIN_KEY[_FILE])",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = admin.add_subparsers(dest="admin_command", required=True)

    create = commands.add_parser(
        "create-key",
        parents=[common],
        help="issue an API key; prints only the key on stdout (shown once)",
    )
    create.add_argument("--tenant", required=True, help="the tenant the key acts for")
    create.add_argument("--label", default=None, help="a short note, e.g. 'prod dialer'")
    create.add_argument("--role", choices=["tenant", "admin"], default="tenant")
    create.set_defaults(func=_run(cmd_create_key))

    kill = commands.add_parser(
        "kill-switch", parents=[common], help="engage (on), release (off) or read (status)"
    )
    kill.add_argument("action", choices=["on", "off", "status"])
    kill.set_defaults(func=_run(cmd_kill_switch))

    limits = commands.add_parser(
        "limits",
        parents=[common],
        help="show a tenant's limits, or change those given",
    )
    limits.add_argument("--tenant", required=True)
    for name, text in MONEY_LIMIT_FLAGS.items():
        limits.add_argument("--" + name.replace("_", "-"), dest=name, default=None, help=text)
    for name, text in COUNT_LIMIT_FLAGS.items():
        limits.add_argument(
            "--" + name.replace("_", "-"), dest=name, type=int, default=None, help=text
        )
    limits.set_defaults(func=_run(cmd_limits))
