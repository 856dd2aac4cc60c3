"""Draws ``docs/diagrams/layers.svg``: the layers of chamvi_runs (docs/architecture.md).

Python's standard library only. After changing the picture, run ``python docs/diagrams/layers.py``
and commit both files: ``tests/integration/test_docs_diagram.py`` fails when the SVG is not what this draws.
"""

from __future__ import annotations

from pathlib import Path
from xml.sax.saxutils import escape

OUT = Path(__file__).with_name("layers.svg")

TITLE = "The layers of chamvi_runs (A → B: A may import B)"
WIDTH, HEIGHT = 960, 660
MONO = "DejaVu Sans Mono, Menlo, Consolas, monospace"
SANS = "DejaVu Sans, Helvetica, Arial, sans-serif"

# Columns: entry points, the layers, the top-level modules the layers share.
LEFT, CENTER, RIGHT = 20, 330, 710
SIDE_W, LAYER_W = 230, 300
TOP, BOX_H, GAP = 84, 54, 30

# (fill, stroke) per kind of box.
STYLE = {
    "layer": ("#e8f0fe", "#3366cc"),
    "core": ("#e6f4ea", "#2e7d32"),
    "entry": ("#fff4e5", "#b26a00"),
    "shared": ("#f3e8fd", "#7b3fbf"),
}

# Top to bottom; each may import every layer below it, never one above.
LAYERS = [
    ("web/", "HTTP API, pages, SSE, websocket consumers"),
    ("api.py", "start_run, send_input, answer, approve, regenerate, …"),
    ("runtime/", "engine, model_step, fenced_writes, tool_calls, janitor"),
    ("dispatch/ · streaming/ · agents/", "doorbell · events, cursor, replay · Agent, @tool"),
    ("store/", "the only writer of run state"),
    ("core/", "pure Python: states, decisions, lease, ports"),
]

# Beside the layers: (row, the row of the layer it imports, title, subtitle).
ENTRY = [
    (0, 0, "urls · routing · admin", "URLconf, websocket routes"),
    (1, 1, "__init__.py", "Agent, tool, start_run, …"),
    (2, 2, "jobs · worker · asgi", "RQ job and worker, ASGI app"),
    (3, 2, "checks · chamvi_tick", "system checks, the janitor"),
    (5, 5, "llm_openai · testing", "models: core.ports.Model"),
]
# (row, the row of the layer that imports it first, title, subtitle); every layer above that one
# may import it too.
SHARED = [
    (3, 3, "conf · modes · policy", "settings, mode, permissions, signals"),
    (4, 4, "models · errors", "Django models, exceptions"),
]


def row_y(row: int) -> int:
    return TOP + row * (BOX_H + GAP)


def middle_of(row: int) -> float:
    return row_y(row) + BOX_H / 2


def facing(y: float, row: int) -> float:
    """The height on the box of ``row`` nearest to ``y``: a side arrow to another row slants."""
    return min(max(y, row_y(row) + 10), row_y(row) + BOX_H - 10)


def text(x: float, y: float, value: str, *, size: int, family: str, weight: str = "normal") -> str:
    return (
        f'<text x="{x:g}" y="{y:g}" font-family="{family}" font-size="{size}" '
        f'font-weight="{weight}" text-anchor="middle">{escape(value)}</text>'
    )


def box(x: int, y: int, w: int, title: str, subtitle: str, kind: str) -> str:
    fill, stroke = STYLE[kind]
    middle = x + w / 2
    return "\n".join(
        [
            f'<rect x="{x}" y="{y}" width="{w}" height="{BOX_H}" rx="6" fill="{fill}" '
            f'stroke="{stroke}" stroke-width="1.5"/>',
            text(middle, y + 22, title, size=14, family=MONO, weight="bold"),
            text(middle, y + 42, subtitle, size=11, family=SANS),
        ]
    )


def arrow(x1: float, y1: float, x2: float, y2: float) -> str:
    return (
        f'<line x1="{x1:g}" y1="{y1:g}" x2="{x2:g}" y2="{y2:g}" stroke="#444" stroke-width="1.5" '
        'marker-end="url(#head)"/>'
    )


def render() -> str:
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}">',
        "<defs>",
        '<marker id="head" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="8" markerHeight="8" '
        'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#444"/></marker>',
        "</defs>",
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>',
        text(WIDTH / 2, 28, TITLE, size=16, family=SANS, weight="bold"),
        text(LEFT + SIDE_W / 2, 64, "entry points", size=12, family=SANS, weight="bold"),
        text(CENTER + LAYER_W / 2, 64, "layers (lint-imports)", size=12, family=SANS, weight="bold"),
        text(RIGHT + SIDE_W / 2, 64, "shared top-level modules", size=12, family=SANS, weight="bold"),
    ]
    for row, (title, subtitle) in enumerate(LAYERS):
        kind = "core" if row == len(LAYERS) - 1 else "layer"
        parts.append(box(CENTER, row_y(row), LAYER_W, title, subtitle, kind))
        if row:
            middle = CENTER + LAYER_W / 2
            parts.append(arrow(middle, row_y(row - 1) + BOX_H, middle, row_y(row)))
    for row, target, title, subtitle in ENTRY:
        parts.append(box(LEFT, row_y(row), SIDE_W, title, subtitle, "entry"))
        parts.append(arrow(LEFT + SIDE_W, middle_of(row), CENTER, facing(middle_of(row), target)))
    for row, source, title, subtitle in SHARED:
        parts.append(box(RIGHT, row_y(row), SIDE_W, title, subtitle, "shared"))
        parts.append(arrow(CENTER + LAYER_W, facing(middle_of(row), source), RIGHT, middle_of(row)))
    # policy reads the models; the models read core's statuses.
    shared_middle = RIGHT + SIDE_W / 2
    parts.append(arrow(shared_middle, row_y(3) + BOX_H, shared_middle, row_y(4)))
    parts.append(arrow(shared_middle, row_y(4) + BOX_H, CENTER + LAYER_W, middle_of(5)))
    notes = [
        "A layer may import every layer below it, never one above. core imports nothing of chamvi_runs",
        "and no framework; store/ imports only models, errors and core/; web/, admin, urls and routing",
        "never import runtime.engine, runtime.tool_calls or jobs.",
    ]
    for n, note in enumerate(notes):
        parts.append(text(WIDTH / 2, row_y(len(LAYERS)) + 14 + 18 * n, note, size=12, family=SANS))
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    OUT.write_text(render())
