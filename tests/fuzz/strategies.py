"""Hypothesis strategies shared by the fuzzers: JSON values, hostile numbers and text."""

from __future__ import annotations

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

#: Text that tends to break things: controls, separators, surrogates escaped, RTL, emoji.
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
]

text = st.one_of(st.text(max_size=40), st.sampled_from(NASTY_TEXT))
numbers = st.one_of(
    st.integers(min_value=-64, max_value=64),
    st.integers(min_value=2**20),
    st.integers(max_value=-(2**20)),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(HUGE_NUMBERS),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, text)
json_values: st.SearchStrategy[Any] = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5), st.dictionaries(text, children, max_size=5)
    ),
    max_leaves=20,
)
