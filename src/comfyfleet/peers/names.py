"""Names of saved files that are unique across the gateways of a shared store.

Every gateway keeps its files in its own data dir, and `/view` of a name is answered
by the gateway asked: the local file if it has one, else a peer's. Two gateways that
both counted `ComfyUI_00001_.png` from their own folders would each serve their own
image for one name. So a gateway of a shared store takes each saved file's counter
from the store (`reserve_file_counter`), keyed by the folder relative to its data dir
and the name: no two gateways ever write one name. Counters come in blocks
(`BLOCK`), so saves go on from the block through a short store outage; numbers a
gateway did not use are skipped, as ComfyUI skips none but no client relies on.

Node code saves in worker threads: the reservation is sent to the event loop and
waited for there, retried while the store does not answer (a save outlasting the
outage, or its attempt given back when the lease cannot be proven).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import threading
import time
from pathlib import Path

from comfyfleet.store.base import GatewayLeases, StoreError

log = logging.getLogger(__name__)

#: How long a save waits for the store before its node fails (s).
PATIENCE = 60.0
#: Longest wait between two tries (s).
RETRY_MAX = 2.0
#: Counters reserved at once per folder and name.
BLOCK = 8
#: The folder types whose files are named from the store. Previews (temp) carry a
#: random prefix per node already.
SHARED_TYPES = frozenset({"output"})


class FleetNames:
    def __init__(
        self, store: GatewayLeases, data_dir: Path, loop: asyncio.AbstractEventLoop
    ) -> None:
        self._store = store
        self._root = os.path.realpath(data_dir)
        self._loop = loop
        self._blocks: dict[str, tuple[int, int]] = {}  # key -> (next, end) reserved here
        self._lock = threading.Lock()

    def reserve(self, folder: Path, name: str, floor: int, count: int) -> int:
        relative = os.path.relpath(os.path.realpath(folder), self._root)
        parts = Path(relative).parts
        kind = parts[2] if parts[:1] == ("tenants",) and len(parts) > 2 else parts[0]
        if relative.startswith(os.pardir) or kind not in SHARED_TYPES:
            return floor  # no other gateway names files there
        # Hashed: a prefix may be very long, or hold anything; the key stays small.
        key = hashlib.sha256(f"{relative}\x00{name}".encode("utf-8", "surrogatepass")).hexdigest()
        with self._lock:
            start, end = self._blocks.get(key, (0, 0))
            start = max(start, floor)
            if start + count <= end:
                self._blocks[key] = (start + count, end)
                return start
        start = self._from_store(key, floor, max(count, BLOCK))
        with self._lock:
            self._blocks[key] = (start + count, start + max(count, BLOCK))
        return start

    def _from_store(self, key: str, floor: int, count: int) -> int:
        give_up = time.monotonic() + PATIENCE
        delay = 0.25
        while True:
            reserving = self._store.reserve_file_counter(key, floor, count)
            try:
                return asyncio.run_coroutine_threadsafe(reserving, self._loop).result()
            except StoreError as exc:
                if time.monotonic() + delay > give_up:
                    raise RuntimeError(
                        f"cannot name the saved file: the store does not answer ({exc})"
                    ) from exc
                log.warning("cannot reserve a file name (%s); retrying", exc)
                time.sleep(delay)
                delay = min(RETRY_MAX, delay * 2)
