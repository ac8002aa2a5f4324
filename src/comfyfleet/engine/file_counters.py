"""The file counters of an engine's saves, kept across its prompts."""

from __future__ import annotations

import threading
from collections.abc import Callable

from comfyfleet.engine.services import ServiceKey


class FileCounters:
    """The next free counter per (folder, name) of an engine's saves: a hint that
    saves rescanning the folder (the exclusive create in `write_new` stays the rule)."""

    def __init__(self) -> None:
        self._next: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def take(self, key: tuple[str, str], count: int, scan: Callable[[], int]) -> int:
        """The first of `count` counters for `key`, from `scan()` the first time."""
        with self._lock:
            start = self._next.get(key)
            if start is None:
                start = scan()
            self._next[key] = start + count
        return start

    def raise_to(self, key: tuple[str, str], floor: int) -> None:
        """The next counter for `key` is `floor` or more."""
        with self._lock:
            self._next[key] = max(self._next.get(key, floor), floor)


#: The engine service holding its FileCounters (without one, each save scans its folder).
FILE_COUNTERS: ServiceKey[FileCounters] = ServiceKey("file_counters")
