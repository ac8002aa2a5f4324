"""Signed requests between gateways: good only with the key, for that request, fresh."""

from __future__ import annotations

from pathlib import Path

import pytest

from comfyfleet.peers.signing import (
    SIGNATURE_HEADER,
    TIME_HEADER,
    VALIDITY,
    PeerKey,
    claimed_gateway,
    signed_headers,
    verify,
)
from comfyfleet.store.sqlite import SQLiteStore

KEY = b"k" * 32
TARGET = "/comfyfleet/peer/file?tenant=default&type=input&subfolder=&filename=a.png"
NOW = 1_800_000_000.0


def test_a_signed_request_verifies() -> None:
    headers = signed_headers(KEY, "gw-b", "GET", TARGET, NOW)
    assert verify(KEY, headers, "GET", TARGET, NOW + VALIDITY)
    assert claimed_gateway(headers) == "gw-b"
    assert KEY.hex() not in str(headers) and "k" * 32 not in str(headers)


@pytest.mark.parametrize(
    ("key", "method", "target", "now"),
    [
        (b"x" * 32, "GET", TARGET, NOW),  # another key
        (KEY, "POST", TARGET, NOW),  # another method
        (KEY, "GET", TARGET.replace("a.png", "b.png"), NOW),  # another file
        (KEY, "GET", TARGET, NOW + VALIDITY + 1),  # too old
        (KEY, "GET", TARGET, NOW - VALIDITY - 1),  # from the future
    ],
)
def test_anything_else_does_not(key: bytes, method: str, target: str, now: float) -> None:
    headers = signed_headers(KEY, "gw-b", "GET", TARGET, NOW)
    assert not verify(key, headers, method, target, now)


def test_changed_or_missing_headers_do_not_verify() -> None:
    headers = signed_headers(KEY, "gw-b", "GET", TARGET, NOW)
    assert not verify(KEY, {}, "GET", TARGET, NOW)
    assert not verify(KEY, {**headers, "X-Comfyfleet-Gateway": "gw-c"}, "GET", TARGET, NOW)
    assert not verify(KEY, {**headers, TIME_HEADER: str(int(NOW) + 1)}, "GET", TARGET, NOW)
    assert not verify(KEY, {**headers, TIME_HEADER: "-1"}, "GET", TARGET, NOW)
    assert not verify(KEY, {**headers, SIGNATURE_HEADER: "é" * 64}, "GET", TARGET, NOW)
    assert claimed_gateway({"X-Comfyfleet-Gateway": "../x"}) is None


async def test_the_key_is_the_stores_and_stays_out_of_reprs(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "jobs.db")
    await store.open()
    try:
        first, second = PeerKey(store), PeerKey(store)
        key = await first.get()
        assert len(key) == 32 and await second.get() == key == await first.get()
        assert key.hex() not in repr(first) and repr(key) not in repr(first)
    finally:
        await store.close()
