"""The code's layout as docs/architecture.md shows it: the drawing of the rooms matches
the imports, no arrows between rooms form a circle, and no class grows past 400 lines."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _structure() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_structure", ROOT / "docs/gen/structure.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_the_drawing_matches_the_code() -> None:
    structure = _structure()
    drawn = structure.DRAWING.read_text(encoding="utf-8")
    assert drawn == structure.draw(structure.measure()), (
        "run .venv/bin/python docs/gen/structure.py --write"
    )


def test_no_circle_between_rooms() -> None:
    measured = _structure().measure()
    assert len(measured.rooms) > 15  # the walk found the packages
    assert measured.circles() == []


def test_a_circle_is_found_when_there_is_one() -> None:
    structure = _structure()
    made = structure.Structure(
        rooms={"a": 1, "b": 1, "c": 1, "d": 1},
        arrows={("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")},
    )
    assert made.circles() == [["a", "b", "c"]]


def test_the_drawing_leaves_out_arrows_a_longer_path_implies() -> None:
    structure = _structure()
    made = structure.Structure(
        rooms={"top": 1, "mid": 1, "low": 1},
        arrows={("top", "mid"), ("mid", "low"), ("top", "low")},
    )
    assert made.drawn_arrows() == [("mid", "low"), ("top", "mid")]
    assert made.floors() == {"top": 2, "mid": 1, "low": 0}


def test_no_class_over_400_lines() -> None:
    classes = _structure().measure().classes
    assert len(classes) > 100  # the walk found the classes
    assert [(c.name, c.lines) for c in classes if c.lines > 400] == []
