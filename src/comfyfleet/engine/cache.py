"""The output cache: node results keyed by their input signature, bounded LRU.

Only touched from the event loop thread, so concurrent prompts need no lock;
a run takes its hits up front, so a later eviction never pulls a value out
from under a running prompt.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CacheEntry:
    outputs: list[list[Any]]
    ui: dict[str, Any] | None


class OutputCache:
    def __init__(self, max_entries: int = 1024) -> None:
        if max_entries < 0:
            raise ValueError("max_entries must be >= 0")
        self.max_entries = max_entries
        self._entries: OrderedDict[str, CacheEntry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> CacheEntry | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: str, entry: CacheEntry) -> None:
        if self.max_entries == 0:
            return
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()

    def scoped(self, scope: str) -> OutputCache:
        """A view of this cache whose keys never meet those of another scope (nor the
        unscoped ones): entries share one LRU and one bound, lookups stay apart."""
        return _ScopedCache(self, scope)


class _ScopedCache(OutputCache):
    def __init__(self, base: OutputCache, scope: str) -> None:
        self.max_entries = base.max_entries
        self._entries = base._entries  # shared with `base`: one LRU, one bound
        self._prefix = f"{scope}\x00"

    def get(self, key: str) -> CacheEntry | None:
        return super().get(self._prefix + key)

    def put(self, key: str, entry: CacheEntry) -> None:
        super().put(self._prefix + key, entry)
