"""client_json.loads: the bounds every client JSON is read with."""

from __future__ import annotations

import json

import pytest

from comfyfleet.server.plumbing.client_json import MAX_DEPTH, RefusedJson, has_lone_surrogate, loads


@pytest.mark.parametrize(
    "text",
    [
        '"\\ud800"',
        '{"\\udfff": 1}',
        '["ok", {"a": "x\\uDBFFy"}]',
        '"\\ud83d"',  # the first half of an emoji, cut off
        '"\ud800"',  # the code point itself, as text decoded leniently can hold it
    ],
)
def test_lone_surrogates_are_refused(text: str) -> None:
    with pytest.raises(RefusedJson, match="lone surrogate"):
        loads(text)


@pytest.mark.parametrize(
    "text",
    [
        '"\\ud83d\\ude00"',  # a pair: one emoji, as json.dumps escapes it
        '"\\\\ud800"',  # an escaped backslash, then letters
        '"\U0001f600 \ud7ff \ue000"',
    ],
)
def test_paired_surrogates_and_lookalikes_are_read(text: str) -> None:
    assert loads(text) == json.loads(text)


def test_surrogate_bytes_are_not_utf8() -> None:
    with pytest.raises(RefusedJson, match="not JSON"):
        loads(b'{"a": "\xed\xa0\x80"}')
    assert loads('{"a": "é"}'.encode("utf-16")) == {"a": "é"}  # json.loads reads UTF-16 too


def test_depth_is_capped() -> None:
    at_cap = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert loads(at_cap) is not None
    for depth in (MAX_DEPTH + 1, 5000, 200_000):
        with pytest.raises(RefusedJson, match="nested too deeply"):
            loads("[" * depth + "]" * depth)
    with pytest.raises(RefusedJson, match="nested too deeply"):
        loads('{"a": ' * (MAX_DEPTH + 1) + "1" + "}" * (MAX_DEPTH + 1))


def test_has_lone_surrogate() -> None:
    assert has_lone_surrogate("a\udced")
    assert not has_lone_surrogate("plain")
    assert not has_lone_surrogate("\U0001f600")
