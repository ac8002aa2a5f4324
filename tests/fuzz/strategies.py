"""Hypothesis strategies shared by the fuzzers: JSON values, hostile numbers and text.

Besides odd values, they make the three shapes that break servers most often: lone
surrogates (valid JSON escapes, but not Unicode text), nesting deeper than any parser
or encoder recurses, and values larger than any field needs. Deep and large values are
`Deep` and `Big` markers, written out by `to_json` (use it, not `json.dumps`, for bodies):
no recursive encoder could write the one, and a report of the other would be megabytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

#: Numbers at and past every limit a parser or database might have.
HUGE_NUMBERS: list[Any] = [
    2**31,
    2**63 - 1,
    2**63,
    -(2**63) - 1,
    2**64,
    10**30,
    -(10**30),
    10**400,
    1e308,
    -1e308,
    5e-324,
    0.5,
    -1,
    0,
]

#: Lone UTF-16 surrogates: JSON escapes them (`"\\ud800"`), but UTF-8 cannot encode them.
LONE_SURROGATES = ["\ud800", "\udfff", "a\ud83d", "\ude00z", "\udced\udca0\udc80"]

#: Text that tends to break things: controls, separators, surrogates, RTL, emoji.
NASTY_TEXT = [
    "",
    " ",
    "\x00",
    "../../etc/passwd",
    "..\\..\\x",
    "%2e%2e%2f",
    "\u202e\u0644\u0627",
    "\U0001f600" * 10,
    "a\r\nX-Injected: 1",
    "\"'\\",
    "nan",
    "inf",
    "-0",
    "1e999",
    "9" * 400,
    "\ufeff",
    "[]",
    "{}",
    "null",
    *LONE_SURROGATES,
]

#: Any code point, lone surrogates included (st.text() leaves those out).
_any_character = st.one_of(st.characters(), st.characters(categories=["Cs"]))
text = st.one_of(
    st.text(max_size=40),
    st.text(_any_character, max_size=10),
    st.sampled_from(NASTY_TEXT),
    st.sampled_from(LONE_SURROGATES),  # again on their own, so short runs meet them often
)
numbers = st.one_of(
    st.integers(min_value=-64, max_value=64),
    st.integers(min_value=2**20),
    st.integers(max_value=-(2**20)),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(HUGE_NUMBERS),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, text)


@dataclass(frozen=True)
class Deep:
    """`depth` arrays (or objects) around `leaf`, as `to_json` writes it."""

    depth: int
    leaf: Any = None
    objects: bool = False

    def json(self) -> str:
        opening, closing = ('{"a":', "}") if self.objects else ("[", "]")
        return opening * self.depth + to_json(self.leaf) + closing * self.depth


@dataclass(frozen=True)
class Big:
    """A string of `size` times `unit`, past what any field needs (an id, a name, a
    WebSocket message), as `to_json` writes it."""

    size: int
    unit: str = "x"

    def json(self) -> str:
        return json.dumps(self.unit * self.size)


#: Depths around common limits: a sane cap, the interpreter's recursion limit, far past it.
DEPTHS = [8, 64, 99, 100, 101, 128, 500, 990, 1000, 5000, 100_000]
deep = st.builds(Deep, st.sampled_from(DEPTHS), scalars, st.booleans())
big = st.builds(Big, st.sampled_from([70_000, 300_000]), st.sampled_from(["x", "\u00e9", "\ud800"]))
_MARK = "\x00marker-b7e1\x00"


def to_json(value: Any) -> str:
    """`value` as JSON text, each `Deep` and `Big` in it written out in place."""
    found: list[Deep | Big] = []

    def mark(item: Any) -> str:
        if not isinstance(item, (Deep, Big)):
            raise TypeError(f"not JSON: {item!r}")
        found.append(item)
        return _MARK

    pieces = json.dumps(value, default=mark).split(json.dumps(_MARK))
    return pieces[0] + "".join(d.json() + rest for d, rest in zip(found, pieces[1:]))


json_values: st.SearchStrategy[Any] = st.recursive(
    st.one_of(scalars, deep, big),
    lambda children: st.one_of(
        st.lists(children, max_size=5), st.dictionaries(text, children, max_size=5)
    ),
    max_leaves=20,
)
