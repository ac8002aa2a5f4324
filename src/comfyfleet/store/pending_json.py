"""The decoded JSON of pending jobs, kept while they wait.

The scheduler reads the queue's front again and again (each claim looks at a page of
candidates), and decoding each candidate's prompt every time was most of what a read
cost. A job's prompt, extra data and outputs never change once queued, so their decoded
values are kept by prompt id (with the text they came from: a different text decodes
afresh) until the job is taken, or the oldest are dropped. Stores call it from their
reader threads and the event loop alike: it locks.
"""

from __future__ import annotations

import json
import threading
from typing import Any

#: Pending jobs whose JSON is kept.
KEPT = 4096

Texts = tuple[str, str, str]  # prompt, extra data, outputs
Values = tuple[Any, Any, Any]


class PendingJson:
    def __init__(self, kept: int = KEPT) -> None:
        self._kept = kept
        self._items: dict[str, tuple[Texts, Values]] = {}
        self._lock = threading.Lock()

    def decode(self, prompt_id: str, texts: Texts) -> Values:
        """The decoded prompt, extra data and outputs of a pending job."""
        with self._lock:
            found = self._items.get(prompt_id)
        if found is not None and found[0] == texts:
            return found[1]
        values = (json.loads(texts[0]), json.loads(texts[1]), json.loads(texts[2]))
        with self._lock:
            self._items[prompt_id] = (texts, values)
            while len(self._items) > self._kept:
                del self._items[next(iter(self._items))]
        return values

    def taken(self, prompt_id: str) -> None:
        """The job runs: its values may be changed by its run (node code gets its
        prompt), so a later read decodes afresh."""
        with self._lock:
            self._items.pop(prompt_id, None)
