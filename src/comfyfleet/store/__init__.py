"""Durable jobs, history, events and output records: one interface, several stores.

`open_store` (store/factory.py) picks the store a setting names. It is looked up on first
use, so importing the records does not load every driver.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from comfyfleet.store.factory import check_store_location, open_store

__all__ = ["check_store_location", "open_store"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from comfyfleet.store import factory

        return getattr(factory, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
