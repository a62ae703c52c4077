"""Run the SIPVicious scanners (svmap, svwar, svcrack) from a chosen loopback source address.

All of 127.0.0.0/8 is loopback on Linux, so a "stranger" scanning a worker can come from
127.0.0.9 while the trusted trunk is 127.0.0.1. ``sipvicious_svmap -b IP`` binds where it is
told, but sipvicious 0.3.8's svwar and svcrack accept ``-b`` and never pass it on (their socket
binds to all interfaces and the kernel picks 127.0.0.1 as the source, the allowlisted trunk).
So this module is also a runner, ``python -m tests.sip_scan TOOL SOURCE_IP ARGS...``, that runs
the installed tool's own ``main()`` with two changes and nothing else:

- its socket binds to SOURCE_IP (what ``-b`` promises);
- its digest response also handles ``algorithm=SHA-256`` (RFC 7616). svcrack 0.3.8 only knows
  MD5 and the worker challenges with SHA-256, so unpatched svcrack cannot crack *any* password
  and "it cracked nothing" would prove nothing. With SHA-256 it is as strong as a current
  cracker, and the tests show it does crack the worker when the access policy lets it try.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib
import os
import re
import signal
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Where the venv's console scripts live (``sipvicious_svmap`` and friends).
SCANNER_BIN = Path(sys.executable).parent
#: The repository root: put on the runner's PYTHONPATH so ``-m tests.sip_scan`` resolves
#: whatever directory the scanner runs in (sipvicious may write session files to its cwd).
REPO_ROOT = Path(__file__).resolve().parents[1]
#: Grace after SIGINT: sipvicious catches KeyboardInterrupt and prints its results table,
#: which takes well under a second; after this it is killed (measured: ~0.1 s).
INTERRUPT_GRACE_S = 5.0
#: The scanner classes whose constructor gets the source address (``bindingip``).
_SCANNER_CLASSES = {"svmap": "DrinkOrSip", "svwar": "TakeASip", "svcrack": "ASipOfRedWine"}
#: A row of sipvicious' results table (``pptable``): ``| key | value |``.
_ROW_RE = re.compile(r"^\|\s*(?P<key>.*?)\s*\|\s*(?P<value>.*?)\s*\|$")


@dataclass(frozen=True)
class ScanRun:
    """What one scanner run printed: its results table, logs and exit status."""

    tool: str
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    interrupted: bool

    @property
    def results(self) -> list[tuple[str, str]]:
        """The rows of the results table (device/UA, extension/auth or user/password)."""
        return results_table(self.stdout)

    @property
    def found_nothing(self) -> bool:
        """The tool's own verdict: it logs "found nothing" when its results are empty."""
        return "found nothing" in self.stderr and not self.results

    def transcript(self) -> str:
        """The run as text for the test output (the command, stdout, then stderr)."""
        return (
            f"$ {' '.join(self.argv)}\n[exit {self.returncode}"
            f"{', interrupted' if self.interrupted else ''}]\n{self.stdout}{self.stderr}"
        )


def results_table(stdout: str) -> list[tuple[str, str]]:
    """Parse sipvicious' results table: the rows after the ``+===+`` header separator."""
    rows: list[tuple[str, str]] = []
    in_body = False
    for line in stdout.splitlines():
        if line.startswith("+="):
            in_body = True
            continue
        match = _ROW_RE.match(line.strip())
        if in_body and match is not None:
            rows.append((match["key"], match["value"]))
    return rows


def svmap_command(source: str, args: Sequence[str]) -> list[str]:
    """The real ``sipvicious_svmap`` console script, bound to ``source`` with its own ``-b``."""
    return [str(SCANNER_BIN / "sipvicious_svmap"), "-b", source, *args]


def runner_command(tool: str, source: str, args: Sequence[str]) -> list[str]:
    """``python -m tests.sip_scan TOOL SOURCE ARGS``: the tool bound to ``source`` (see above)."""
    if tool not in _SCANNER_CLASSES:
        raise ValueError(f"unknown sipvicious tool {tool!r}")
    return [sys.executable, "-m", "tests.sip_scan", tool, source, *args]


async def run_scanner(
    command: Sequence[str], *, tool: str, cwd: Path, stop_after_s: float
) -> ScanRun:
    """Run a scanner; after ``stop_after_s`` interrupt it (SIGINT) so it prints what it found.

    Some runs never end on their own (svcrack keeps asking for a fresh challenge while every
    request is refused), hence the deadline rather than waiting for the exit.
    """
    path = os.pathsep.join(filter(None, (str(REPO_ROOT), os.environ.get("PYTHONPATH"))))
    proc = await asyncio.create_subprocess_exec(
        *command,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": path},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    communicate = asyncio.ensure_future(proc.communicate())
    interrupted = False
    try:
        done, _ = await asyncio.wait({communicate}, timeout=stop_after_s)
        if not done:
            interrupted = True
            proc.send_signal(signal.SIGINT)
            done, _ = await asyncio.wait({communicate}, timeout=INTERRUPT_GRACE_S)
            if not done:
                proc.kill()
        out, err = await communicate
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    return ScanRun(
        tool=tool,
        argv=tuple(command),
        returncode=proc.returncode if proc.returncode is not None else -1,
        stdout=out.decode(errors="replace"),
        stderr=err.decode(errors="replace"),
        interrupted=interrupted,
    )


def _digest_response(
    original: Callable[[dict[str, Any], str, str], str],
) -> Callable[[dict[str, Any], str, str], str]:
    """svhelper.challengeResponse, extended with RFC 7616 SHA-256 (qop=auth or none)."""

    def respond(auth: dict[str, Any], method: str, uri: str) -> str:
        if str(auth.get("algorithm") or "").lower() != "sha-256":
            return original(auth, method, uri)

        def h(text: str) -> str:
            return hashlib.sha256(text.encode()).hexdigest()

        user, realm, nonce = auth["username"], auth["realm"], auth["nonce"]
        ha1 = h(f"{user}:{realm}:{auth['password']}")
        ha2 = h(f"{method}:{uri}")
        qop = str(auth["qop"]).split(",")[0] if auth.get("qop") else None
        result = f'Digest username="{user}",realm="{realm}",nonce="{nonce}",uri="{uri}"'
        if qop == "auth":
            cnonce = uuid.uuid4().hex
            nc = f"{int(auth.get('noncecount', 1)):08x}"
            response = h(f"{ha1}:{nonce}:{nc}:{cnonce}:auth:{ha2}")
            result += f',cnonce="{cnonce}",nc={nc},qop=auth'
        else:
            response = h(f"{ha1}:{nonce}:{ha2}")
        result += f',algorithm=SHA-256,response="{response}"'
        if auth.get("opaque"):
            result += f',opaque="{auth["opaque"]}"'
        return result

    return respond


def _run_tool(tool: str, source: str, args: list[str]) -> None:
    module = importlib.import_module(f"sipvicious.{tool}")
    helper: Any = importlib.import_module("sipvicious.libs.svhelper")
    scanner = getattr(module, _SCANNER_CLASSES[tool])
    original_init = scanner.__init__

    def bound_init(self: object, *a: Any, **kw: Any) -> None:
        kw["bindingip"] = source
        original_init(self, *a, **kw)

    scanner.__init__ = bound_init
    helper.challengeResponse = _digest_response(helper.challengeResponse)
    sys.argv = [f"sipvicious_{tool}", *args]
    module.main()


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: python -m tests.sip_scan svmap|svwar|svcrack SOURCE_IP [ARGS...]")
    _run_tool(sys.argv[1], sys.argv[2], sys.argv[3:])
