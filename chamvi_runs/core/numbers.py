"""Numbers that arrive as text (query parameters, headers): ASCII digits only.

``int()`` also reads "٣" and other Unicode digits, and ``str.isdigit()`` accepts "²", which ``int()``
then refuses: a check with either lets odd input through or turns it into a 500.
"""

from __future__ import annotations

import re

_ASCII_INT = re.compile(r"[0-9]{1,18}")


def ascii_int(raw: str) -> int | None:
    """``raw`` as a non-negative int when it is 1 to 18 ASCII digits, else None."""
    return int(raw) if _ASCII_INT.fullmatch(raw) else None
