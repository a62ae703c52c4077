"""The tenant id: whose money a call spends, spelled one way in every layer.

The spend store puts it in Redis keys, the REST API in URLs and JSON Schemas,
the gateway in stream tokens, metric labels and its settings; all of them
check it against this one rule.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["TENANT_ID_MAX_CHARS", "TENANT_ID_PATTERN", "TENANT_ID_RE", "is_tenant_id"]

#: Longest tenant id: 63 characters, a DNS label's length (RFC 1035 §2.3.4), so
#: that a tenant id is also safe in host names, file names and metric labels.
TENANT_ID_MAX_CHARS: Final = 63
#: Lowercase letters and digits, then also ``_`` and ``-``: never ``:`` (Redis's key
#: separator), ``/`` or ``.``. As a JSON Schema (ECMA-262) pattern, anchored.
TENANT_ID_PATTERN: Final = rf"^[a-z0-9][a-z0-9_-]{{0,{TENANT_ID_MAX_CHARS - 1}}}$"
#: The same rule for Python, to be matched whole (``fullmatch``).
TENANT_ID_RE: Final = re.compile(TENANT_ID_PATTERN[1:-1])


def is_tenant_id(value: object) -> bool:
    """Whether ``value`` is a well-formed tenant id (a ``str`` matching the rule, whole)."""
    return isinstance(value, str) and TENANT_ID_RE.fullmatch(value) is not None
