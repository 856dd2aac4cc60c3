"""Text PostgreSQL cannot store: NUL characters and lone surrogates.

``text`` and ``jsonb`` refuse ``\\u0000``; a lone surrogate (``"\\ud800"``, which ``json.loads``
makes of an escape with no partner) cannot be encoded as UTF-8 for ``text`` and is refused by
``jsonb``'s parser. Either way a write fails: a 500 for a request, a lost step for a run.

One decision, applied in two places: what callers send (payloads, inputs, thread names, keys,
ids, reasons) is refused with a clear error; what a run produces (model text, tool arguments,
outputs and errors) cannot be refused without losing the step, so each such character is replaced
by U+FFFD before it is stored or streamed.
"""

from __future__ import annotations

import re
from typing import Any

REPLACEMENT = "\ufffd"
# A Python string holds a surrogate code point only unpaired: json.loads joins an escaped pair.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
WHAT = "NUL characters (\\u0000) or lone surrogates (\\ud800-\\udfff)"
"""How error messages name the characters refused."""


def unstorable(value: Any) -> bool:
    """Whether any string or key of JSON-like ``value`` holds a NUL or a lone surrogate (walked
    without recursion)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _UNSTORABLE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False


def storable(value: Any) -> Any:
    """``value`` with every NUL and lone surrogate in its strings and keys replaced by U+FFFD; the
    same object when it has none."""
    if not unstorable(value):
        return value
    return _replace(value)


def _replace(value: Any) -> Any:
    if isinstance(value, str):
        return _UNSTORABLE.sub(REPLACEMENT, value)
    if isinstance(value, dict):
        return {_replace(k): _replace(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_replace(v) for v in value]
    return value
