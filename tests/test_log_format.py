"""Issue 14, finding 7: peers cannot forge log lines."""

from __future__ import annotations

import logging
import subprocess
import sys

from rutster.base.log_format import LOG_FORMAT, OneLineFormatter, escape_controls

FORGED = "bye\n2026-12-03 07:00:00,000 ERROR gateway.call: forged\r\x1b[2J\u2028end"


def test_escape_controls() -> None:
    assert escape_controls("a\nb\r\tc\x00\x7f\x85\u2028\u2029é") == (
        "a\\x0ab\\x0d\\x09c\\x00\\x7f\\x85\\u2028\\u2029é"
    )


def test_a_peer_string_stays_on_its_line_and_a_traceback_keeps_its_own() -> None:
    formatter = OneLineFormatter(LOG_FORMAT)
    record = logging.LogRecord(
        "rutster.gateway.tap", logging.WARNING, __file__, 1, "brain: %s", (FORGED,), None
    )
    line = formatter.format(record)
    assert "\n" not in line and "\r" not in line and "\x1b" not in line and "\u2028" not in line
    assert "forged" in line
    try:
        raise RuntimeError("ours")
    except RuntimeError:
        record.exc_info = sys.exc_info()
    assert formatter.format(record).count("\n") >= 2  # the traceback's own lines


def test_the_gateway_and_sip_worker_log_one_line_per_record() -> None:
    """What ``rutster serve`` (and ``rutster sip-worker``) set up: one line per record."""
    for module in ("rutster.tools.cli", "rutster.trunk.sip.cli"):
        code = (
            f"import logging; from {module} import _setup_logging; _setup_logging('info'); "
            f"logging.getLogger('rutster.gateway.tap').warning('brain error: %s', {FORGED!r})"
        )
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
        )
        lines = done.stderr.splitlines()
        assert len(lines) == 1, (module, lines)
        assert "WARNING rutster.gateway.tap: brain error: bye\\x0a2026" in lines[0]
