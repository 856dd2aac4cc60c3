"""NUL characters and PostgreSQL: ``text`` and ``jsonb`` refuse ``\\u0000``.

One decision, applied in two places: what callers send (payloads, inputs, thread names, keys) is
refused with a clear error; what a run produces (model text, tool outputs and errors) cannot be
refused without losing the step, so each NUL is replaced by U+FFFD before it is stored.
"""

from __future__ import annotations

from typing import Any

NUL = "\x00"
REPLACEMENT = "\ufffd"


def has_nul(value: Any) -> bool:
    """Whether a NUL is in any string or key of JSON-like ``value`` (walked without recursion)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if NUL in item:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False


def without_nul(value: Any) -> Any:
    """``value`` with every NUL in its strings and keys replaced; the same object when it has none."""
    if not has_nul(value):
        return value
    return _replace(value)


def _replace(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace(NUL, REPLACEMENT)
    if isinstance(value, dict):
        return {_replace(k): _replace(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_replace(v) for v in value]
    return value
