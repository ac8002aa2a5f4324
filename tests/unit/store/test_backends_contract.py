"""The run-time backends contract (saved, replaced, deleted), run over every store.

The fixtures (conftest.py) run each test once per store.
"""

from __future__ import annotations

from comfyfleet.store.base import JobStore


async def test_backends_are_saved_replaced_and_deleted(store: JobStore) -> None:
    assert await store.backends() == []
    await store.save_backend("gpu0", {"name": "gpu0", "url": "http://127.0.0.1:1"})
    await store.save_backend("gpu1", {"name": "gpu1", "url": "http://127.0.0.1:2"})
    await store.save_backend("gpu0", {"name": "gpu0", "url": "http://127.0.0.1:3", "slots": 2})
    assert await store.backends() == [
        {"name": "gpu0", "url": "http://127.0.0.1:3", "slots": 2},
        {"name": "gpu1", "url": "http://127.0.0.1:2"},
    ]
    assert await store.delete_backend("gpu0")
    assert not await store.delete_backend("gpu0")
    assert [b["name"] for b in await store.backends()] == ["gpu1"]
