"""Measure the code's structure and draw its rooms, for docs/architecture.md.

A room is one package (or top-level module) of `comfyfleet`; an arrow from room A to
room B says that some module of A imports one of B. What it measures, from the source
text alone (nothing of the project is run, except to list its exceptions):

- lines of source and tests, per room;
- the arrows, and whether they form a circle (they must not: each room can be read
  knowing only the rooms below it);
- the floor of each room: 0 for a room that imports no other, else one above the
  highest room it imports;
- the largest classes;
- the exceptions `comfyfleet` defines and whether each descends from the one root.

    .venv/bin/python docs/gen/structure.py            # print the figures
    .venv/bin/python docs/gen/structure.py --write    # rewrite docs/architecture.svg and
                                                      # the figures in docs/architecture.md
    .venv/bin/python docs/gen/structure.py --check    # exit 1 when the drawing is stale

The drawing shows rooms and arrows only (no line counts), so it changes when the layout
does; tests/docs/test_structure.py checks it is up to date and that no circle appears.
"""

from __future__ import annotations

import argparse
import ast
import html
import importlib
import inspect
import pkgutil
import re
import sys
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
PACKAGE = SRC / "comfyfleet"
TESTS = ROOT / "tests"
DOCS = ROOT / "docs"
DRAWING = DOCS / "architecture.svg"
PAGE = DOCS / "architecture.md"
BEGIN, END = "<!-- figures:begin -->", "<!-- figures:end -->"
#: Modules that load only inside a real ComfyUI (they import its packages).
NEEDS_COMFYUI = ("comfyfleet.in_comfyui.", "comfyfleet.comfyui_pack.")


@dataclass
class ClassSize:
    name: str  # module.Class
    lines: int


@dataclass
class Structure:
    rooms: dict[str, int] = field(default_factory=dict)  # room -> lines of source
    arrows: set[tuple[str, str]] = field(default_factory=set)
    classes: list[ClassSize] = field(default_factory=list)
    test_lines: int = 0

    @property
    def source_lines(self) -> int:
        return sum(self.rooms.values())

    def circles(self) -> list[list[str]]:
        """The rooms that reach each other through arrows (Tarjan's components of more
        than one room); empty when the layout has no circle."""
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        on_stack: set[str] = set()
        found: list[list[str]] = []

        def visit(room: str) -> None:
            index[room] = low[room] = len(index)
            stack.append(room)
            on_stack.add(room)
            for target in self.below(room):
                if target not in index:
                    visit(target)
                    low[room] = min(low[room], low[target])
                elif target in on_stack:
                    low[room] = min(low[room], index[target])
            if low[room] == index[room]:
                component: list[str] = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == room:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

        for room in sorted(self.rooms):
            if room not in index:
                visit(room)
        return found

    def below(self, room: str) -> list[str]:
        return sorted(target for source, target in self.arrows if source == room)

    def floors(self) -> dict[str, int]:
        """0 for a room importing no other; else one above the highest it imports."""
        floor: dict[str, int] = {}

        def of(room: str) -> int:
            if room not in floor:
                floor[room] = 0  # a circle stops here rather than recursing forever
                floor[room] = max((of(t) + 1 for t in self.below(room)), default=0)
            return floor[room]

        for room in self.rooms:
            of(room)
        return floor

    def drawn_arrows(self) -> list[tuple[str, str]]:
        """The arrows the drawing keeps: those not implied by a longer path (an arrow
        A -> C goes when A -> B -> ... -> C exists), so the picture stays readable."""
        reach: dict[str, set[str]] = {}

        def reachable(room: str) -> set[str]:
            if room not in reach:
                reach[room] = set()
                for target in self.below(room):
                    reach[room] |= {target} | reachable(target)
            return reach[room]

        kept = []
        for source, target in sorted(self.arrows):
            others = [t for t in self.below(source) if t != target]
            if not any(target in reachable(other) for other in others):
                kept.append((source, target))
        return kept


def room_of(module: str) -> str:
    """`comfyfleet.server.delivery.hub` -> `server`; a top-level module is its own room."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def module_name(path: Path) -> str:
    relative = path.relative_to(SRC).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(tree: ast.AST) -> Iterable[str]:
    """Every `comfyfleet` module a file names in an import (at any depth)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "comfyfleet":
                yield from (f"comfyfleet.{alias.name}" for alias in node.names)
            else:
                yield node.module


def lines_of(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def measure() -> Structure:
    structure = Structure()
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        room = room_of(module)
        if module == "comfyfleet" or module == "comfyfleet.__main__":
            continue  # the package's face and its entry point: no room of their own
        tree = ast.parse(path.read_text(encoding="utf-8"))
        structure.rooms[room] = structure.rooms.get(room, 0) + lines_of(path)
        for name in imported(tree):
            if name.startswith("comfyfleet.") and room_of(name) != room:
                target = room_of(name)
                if target != "__version__":
                    structure.arrows.add((room, target))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                size = node.end_lineno - node.lineno + 1
                structure.classes.append(ClassSize(f"{module}.{node.name}", size))
    structure.classes.sort(key=lambda c: (-c.lines, c.name))
    structure.test_lines = sum(lines_of(p) for p in TESTS.rglob("*.py"))
    return structure


def own_exceptions() -> list[type[BaseException]]:
    """Every exception class `comfyfleet` defines (its modules imported one by one)."""
    sys.path.insert(0, str(SRC))
    import comfyfleet

    found: list[type[BaseException]] = []
    for info in pkgutil.walk_packages(comfyfleet.__path__, "comfyfleet."):
        if info.name.startswith(NEEDS_COMFYUI) or info.name.endswith("__main__"):
            continue
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # an optional dependency that is not installed
            continue
        for _, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, BaseException) and value.__module__ == info.name:
                found.append(value)
    return found


def typed_paths() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    mypy = config["tool"]["mypy"]
    files = mypy.get("files", [])
    return [str(f) for f in files]


# -- the drawing ----------------------------------------------------------------------

BOX_W, BOX_H, GAP_X, GAP_Y, MARGIN = 132, 30, 14, 46, 16


def draw(structure: Structure) -> str:
    """An SVG of the rooms, one row per floor (the highest on top), and the arrows
    that are not implied by others (drawn_arrows)."""
    floors = structure.floors()
    rows: dict[int, list[str]] = {}
    for room, floor in floors.items():
        rows.setdefault(floor, []).append(room)
    top = max(rows)
    widest = max(len(r) for r in rows.values())
    width = MARGIN * 2 + widest * BOX_W + (widest - 1) * GAP_X
    height = MARGIN * 2 + (top + 1) * BOX_H + top * GAP_Y
    where: dict[str, tuple[float, float]] = {}
    for floor, rooms in rows.items():
        rooms.sort()
        row_w = len(rooms) * BOX_W + (len(rooms) - 1) * GAP_X
        x0 = (width - row_w) / 2
        y = MARGIN + (top - floor) * (BOX_H + GAP_Y)
        for i, room in enumerate(rooms):
            where[room] = (x0 + i * (BOX_W + GAP_X), y)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:.0f} {height:.0f}" '
        f'width="{width:.0f}" height="{height:.0f}" font-family="sans-serif" font-size="13">',
        "<defs><marker id='head' viewBox='0 0 8 8' refX='8' refY='4' markerWidth='7' "
        "markerHeight='7' orient='auto'><path d='M0,0 L8,4 L0,8 z' fill='#777'/></marker>"
        "</defs>",
        f'<rect width="{width:.0f}" height="{height:.0f}" fill="#fff"/>',
    ]
    for source, target in structure.drawn_arrows():
        sx, sy = where[source]
        tx, ty = where[target]
        parts.append(
            f'<line x1="{sx + BOX_W / 2:.0f}" y1="{sy + BOX_H:.0f}" '
            f'x2="{tx + BOX_W / 2:.0f}" y2="{ty:.0f}" stroke="#999" stroke-width="1" '
            f'marker-end="url(#head)"/>'
        )
    for room, (x, y) in sorted(where.items()):
        parts.append(
            f'<rect x="{x:.0f}" y="{y:.0f}" width="{BOX_W}" height="{BOX_H}" rx="5" '
            f'fill="#eef3fb" stroke="#3f6fb5"/>'
            f'<text x="{x + BOX_W / 2:.0f}" y="{y + BOX_H / 2 + 4:.0f}" '
            f'text-anchor="middle">{html.escape(room)}</text>'
        )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


# -- the figures ----------------------------------------------------------------------


def figures(structure: Structure) -> str:
    floors = structure.floors()
    exceptions = own_exceptions()
    from comfyfleet.errors import ComfyfleetError

    rooted = [e for e in exceptions if issubclass(e, ComfyfleetError)]
    over = [c for c in structure.classes if c.lines > 400]
    circles = structure.circles()
    lines = [
        BEGIN,
        "",
        "| measure | now |",
        "|---|---|",
        f"| lines of source (`src/comfyfleet`) | {structure.source_lines:,} |",
        f"| lines of tests (`tests/`) | {structure.test_lines:,} |",
        f"| rooms (packages and top-level modules) | {len(structure.rooms)} |",
        f"| arrows between rooms (drawn: not implied by others) | "
        f"{len(structure.arrows)} ({len(structure.drawn_arrows())}) |",
        f"| circles between rooms | {len(circles)} |",
        f"| floors | {max(floors.values()) + 1} |",
        f"| classes over 400 lines | {len(over)} |",
        f"| exceptions defined, descending from `ComfyfleetError` | "
        f"{len(exceptions)}, {len(rooted)} |",
        f"| type-checked by mypy (strict) | {', '.join(f'`{p}`' for p in typed_paths())} |",
        "",
        "| room | floor | lines |",
        "|---|---|---|",
    ]
    for room in sorted(structure.rooms, key=lambda r: (-floors[r], r)):
        lines.append(f"| `{room}` | {floors[room]} | {structure.rooms[room]:,} |")
    lines += ["", "The largest classes:", "", "| class | lines |", "|---|---|"]
    for size in structure.classes[:10]:
        lines.append(f"| `{size.name}` | {size.lines} |")
    lines += ["", END]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help="rewrite the drawing and figures")
    group.add_argument("--check", action="store_true", help="exit 1 when the drawing is stale")
    args = parser.parse_args(argv)
    structure = measure()
    circles = structure.circles()
    if circles:
        print(f"circles between rooms: {circles}", file=sys.stderr)
    drawing = draw(structure)
    if args.check:
        stale = not DRAWING.is_file() or DRAWING.read_text(encoding="utf-8") != drawing
        if stale:
            print("docs/architecture.svg is stale: run docs/gen/structure.py --write")
        return 1 if stale or circles else 0
    text = figures(structure)
    if args.write:
        DRAWING.write_text(drawing, encoding="utf-8")
        page = PAGE.read_text(encoding="utf-8")
        pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.DOTALL)
        if not pattern.search(page):
            raise SystemExit(f"{PAGE}: no {BEGIN} ... {END} block to rewrite")
        PAGE.write_text(pattern.sub(lambda _: text, page), encoding="utf-8")
    else:
        print(text)
    return 1 if circles else 0


if __name__ == "__main__":
    raise SystemExit(main())
