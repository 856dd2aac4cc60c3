"""``python -m chamvi_runs.streaming.vocabulary --write``: rewrites every file written from the
vocabulary and names the ones that changed."""

from __future__ import annotations

import sys

from .files import ROOT, write

if sys.argv[1:] != ["--write"]:
    raise SystemExit("usage: python -m chamvi_runs.streaming.vocabulary --write")
for path in write():
    print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
