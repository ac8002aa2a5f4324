"""The Comfy API v2 assets contract (recorded, found by id and by hash, per tenant,
deleted, kept across a reopen), run over every store.

The fixtures (conftest.py) run each test once per store.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from comfyfleet.domain.assets import AssetRecord
from comfyfleet.store.base import JobStore
from tests.unit.store.stores import Clock

DIGEST = "blake3:" + "ab" * 32


def record(asset_id: str, tenant: str = "alice", digest: str = DIGEST) -> AssetRecord:
    return AssetRecord(
        asset_id, tenant, digest, 12, "image/png", f"{asset_id}.png", f"assets/{digest[7:]}.png"
    )


async def test_assets_are_found_by_id_and_by_hash_per_tenant(
    store: JobStore, clock: Clock, reopen: Callable[[JobStore], Any]
) -> None:
    first = await store.add_asset(record("a1"))
    assert first.created_at == clock.now
    clock.advance(1)
    await store.add_asset(record("a2"))
    await store.add_asset(record("b1", tenant="bob"))
    assert await store.asset("alice", "a1") == first
    assert await store.asset("bob", "a1") is None  # another tenant's is unknown
    assert await store.asset_by_hash("alice", DIGEST) == first  # the oldest over the bytes
    assert await store.asset_by_hash("alice", "blake3:" + "00" * 32) is None
    store = await reopen(store)
    try:
        assert await store.asset("alice", "a1") == first
        assert await store.delete_asset("alice", "a1")
        assert not await store.delete_asset("alice", "a1")
        assert not await store.delete_asset("alice", "b1")
        by_hash = await store.asset_by_hash("alice", DIGEST)
        assert by_hash is not None and by_hash.id == "a2"
        theirs = await store.asset_by_hash("bob", DIGEST)
        assert theirs is not None and theirs.id == "b1"
    finally:
        await store.close()
