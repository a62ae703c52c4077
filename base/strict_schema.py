"""JSON Schema (draft 2020-12) validation that reads JSON as JSON, not as Python.

Two places where ``jsonschema``'s defaults follow Python rather than JSON would let
malformed input through, so both validators built here change them:

- ``integer``: jsonschema counts ``True`` and ``486.0`` as integers; here only a
  real ``int`` is one (a bool is not, a float never is: JSON parsers that keep
  ``60.0`` as an integer hand over an ``int`` already);
- ``pattern``: JSON Schema patterns are ECMA-262 regular expressions, where a final
  ``$`` is the very end of the string; Python's ``$`` also matches before a final
  newline, so ``"+15551234567\\n"`` would pass ``^\\+[0-9]+$``.

Used by the REST API's request validation and by the SIP worker wire codec.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from typing import Any

from jsonschema import Draft202012Validator, ValidationError, validators
from jsonschema.protocols import Validator

__all__ = ["StrictValidator", "ecma_regex", "is_json_integer"]


@functools.lru_cache(maxsize=256)
def ecma_regex(pattern: str) -> re.Pattern[str]:
    """Compile a schema ``pattern`` so that a final ``$`` means end of string, as in ECMA-262."""
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1] + r"\Z"
    return re.compile(pattern)


def _pattern(
    _validator: Validator, pattern: str, instance: object, _schema: object
) -> Iterator[ValidationError]:
    if isinstance(instance, str) and ecma_regex(pattern).search(instance) is None:
        yield ValidationError(f"does not match {pattern!r}")


def is_json_integer(value: object) -> bool:
    """Whether ``value`` is an integer as JSON means it: an ``int``, not a bool or a float."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_strict_integer(_checker: object, instance: object) -> bool:
    return is_json_integer(instance)


#: Draft 2020-12 with integers that are really integers and ECMA-262 ``$``.
StrictValidator: Any = validators.extend(  # type: ignore[no-untyped-call]
    Draft202012Validator,
    validators={"pattern": _pattern},
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_strict_integer),
)
