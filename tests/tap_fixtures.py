"""Loading the tap protocol's golden fixtures (tests/fixtures/tap/).

Shared by the codec's, the echo brain's and the gateway's tests: each fixture
is one wire message exactly as a peer sends it; ``invalid/`` holds messages a
decoder must refuse and ``lenient/`` messages it must accept with defaults.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rutster.protocols.tap import Direction

#: Where the golden tap messages live: one folder per direction, plus invalid/
#: and lenient/.
TAP_FIXTURES = Path(__file__).parent / "fixtures" / "tap"


def load_fixture(direction: Direction | str, name: str) -> str:
    """The raw text of fixture ``name`` (without ``.json``) sent in ``direction``."""
    return (TAP_FIXTURES / Direction(direction).value / f"{name}.json").read_text("utf-8")


def load_fixture_json(direction: Direction | str, name: str) -> dict[str, Any]:
    """Fixture ``name`` parsed into a dict."""
    parsed: dict[str, Any] = json.loads(load_fixture(direction, name))
    return parsed


def fixture_names(direction: Direction | str) -> list[str]:
    """Every fixture name sent in ``direction``, sorted."""
    folder = TAP_FIXTURES / Direction(direction).value
    return sorted(path.stem for path in folder.glob("*.json"))


@dataclass(frozen=True, slots=True)
class InvalidCase:
    """A message a decoder for ``direction`` must refuse with ``reason``."""

    name: str
    direction: Direction
    reason: str
    note: str
    frame: str


def load_invalid_cases() -> list[InvalidCase]:
    """The cases in ``invalid/cases.json``."""
    raw = json.loads((TAP_FIXTURES / "invalid" / "cases.json").read_text("utf-8"))
    return [
        InvalidCase(
            name=case["name"],
            direction=Direction(case["direction"]),
            reason=case["reason"],
            note=case["note"],
            frame=case["frame"],
        )
        for case in raw
    ]


@dataclass(frozen=True, slots=True)
class LenientCase:
    """A message a decoder for ``direction`` must accept, reading some values as defaults.

    ``event`` names the :mod:`protocols.tap` class it decodes to and ``fields``
    the expected attributes as JSON (enums as their values, tuples as arrays).
    Our encoder never writes these frames, so they cannot be golden fixtures.
    """

    name: str
    direction: Direction
    note: str
    frame: str
    event: str
    fields: dict[str, Any]


def load_lenient_cases() -> list[LenientCase]:
    """The cases in ``lenient/cases.json``."""
    raw = json.loads((TAP_FIXTURES / "lenient" / "cases.json").read_text("utf-8"))
    return [
        LenientCase(
            name=case["name"],
            direction=Direction(case["direction"]),
            note=case["note"],
            frame=case["frame"],
            event=case["event"],
            fields=case["fields"],
        )
        for case in raw
    ]
