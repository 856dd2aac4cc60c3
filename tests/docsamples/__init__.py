"""The fenced code blocks of README.md and docs/**/*.md, by the marker right before each.

A block is either run by a test or excused:

    <!-- sample: readme-agents -->        a test takes it with ``block("readme-agents")`` and runs it
    <!-- not-run: <reason> -->             not run, for the reason given (a shell command that
                                           starts a server, a diagram)

``tests/integration/test_docs_samples.py`` fails on a block with neither marker, on an empty reason, on a name
used twice, and on a sample that no test takes.
"""

from __future__ import annotations

import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!--\s*(sample|not-run):\s*(.*?)\s*-->$")
FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    lang: str
    code: str
    marker: str | None  # "sample", "not-run" or None
    value: str  # the sample's name, or the reason it is not run

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def parse(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    n = 0
    while n < len(lines):
        opened = FENCE.match(lines[n])
        if not opened:
            n += 1
            continue
        fence, lang, start = opened.group(1), opened.group(2), n
        n += 1
        body: list[str] = []
        while n < len(lines) and not lines[n].startswith(fence):
            body.append(lines[n])
            n += 1
        n += 1
        before = next((line.strip() for line in reversed(lines[:start]) if line.strip()), "")
        marked = MARKER.match(before)
        blocks.append(
            Block(
                path=path,
                line=start + 1,
                lang=lang,
                code="\n".join(body) + "\n",
                marker=marked.group(1) if marked else None,
                value=marked.group(2) if marked else "",
            )
        )
    return blocks


def all_blocks() -> list[Block]:
    return [b for path in doc_files() for b in parse(path)]


def block(name: str) -> str:
    """The code of the sample named ``name``."""
    found = [b for b in all_blocks() if b.marker == "sample" and b.value == name]
    if len(found) != 1:
        raise LookupError(f"{len(found)} blocks are marked <!-- sample: {name} -->")
    return found[0].code


def shell_commands(name: str) -> list[str]:
    """The commands of a shell sample: one per line, continuation lines joined, comments dropped."""
    joined = block(name).replace("\\\n", " ")
    commands = []
    for line in joined.splitlines():
        line = line.split("  #", 1)[0].strip()
        if line and not line.startswith("#"):
            commands.append(" ".join(line.split()))
    return commands


def load_module(name: str, code: str) -> types.ModuleType:
    """``code`` as the module ``name`` (a package's parents must exist in sys.modules already)."""
    module = types.ModuleType(name)
    module.__file__ = f"<{name}>"
    sys.modules[name] = module
    exec(compile(code, module.__file__, "exec"), module.__dict__)
    return module
