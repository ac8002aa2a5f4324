"""Names of saved files that are unique across the gateways of a shared store.

Every gateway keeps its files in its own data dir, and `/view` of a name is answered
by the gateway asked: the local file if it has one, else a peer's. Two gateways that
both counted `ComfyUI_00001_.png` from their own folders would each serve their own
image for one name. So a gateway of a shared store takes each saved file's counter
from the store (`reserve_file_counter`), keyed by the folder relative to its data dir
and the name: no two gateways ever write one name. Counters come in blocks, so saves
go on from the block through a short store outage; numbers a gateway did not use are
skipped, as ComfyUI skips none but no client relies on. A block is `BLOCK` counters,
twice the last one's when that lasted under GROW_WITHIN (up to BLOCK_MAX): a folder
saved into hundreds of times a second asks the store a few times a second, not once
every eight saves. Saves that find the blocks used up at once each reserve one, and
every block reserved is kept, used in order.

When the store does not answer within a second (an outage), a save takes a *spare*
counter instead: each gateway holds a block of counters from SPARE_COUNTERS_FROM up
(`_1000000042_`), reserved from the store while it answered, unique across every
gateway and folder. So a prompt ends through an outage and its end is recorded when
the store is back, rather than waiting (and being given back when the lease cannot
be proven). Node code saves in worker threads: the reservation is sent to the event
loop and waited for there; with no spare left, it is retried while the store does not
answer.
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import hashlib
import logging
import os
import threading
import time
from pathlib import Path

from comfyfleet.nodes.core.saving import SPARE_COUNTERS_FROM
from comfyfleet.store.base import GatewayLeases, StoreError

log = logging.getLogger(__name__)

#: How long a save waits for the store before its node fails (s).
PATIENCE = 60.0
#: Longest wait between two tries (s).
RETRY_MAX = 2.0
#: Counters reserved at once per folder and name, at first and after a quiet while.
BLOCK = 8
#: The most reserved at once, for a folder saved into quickly.
BLOCK_MAX = 256
#: A block used up within this long (s) after it was asked for: the next is twice as big.
GROW_WITHIN = 1.0
#: The folder types whose files are named from the store. Previews (temp) carry a
#: random prefix per node already.
SHARED_TYPES = frozenset({"output"})
#: How long a save waits for the store before it takes a spare counter (s).
QUICK = 1.0
#: Spare counters reserved at once; more are asked for when half are used.
SPARE_BLOCK = 256
#: The store's key of the spare counters (no folder's key: those are hashes).
SPARE_KEY = "spare counters"


class BlockSizes:
    """How many counters each key's next reservation asks for: BLOCK, doubled (up to
    BLOCK_MAX) while each block lasts under GROW_WITHIN."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[int, float]] = {}  # key -> (size, when asked)

    def next(self, key: str, now: float) -> int:
        size, asked = self._last.get(key, (0, -GROW_WITHIN))
        size = min(BLOCK_MAX, size * 2) if now - asked < GROW_WITHIN else BLOCK
        self._last[key] = (size, now)
        return size


class FleetNames:
    def __init__(
        self, store: GatewayLeases, data_dir: Path, loop: asyncio.AbstractEventLoop
    ) -> None:
        self._store = store
        self._root = os.path.realpath(data_dir)
        self._loop = loop
        self._blocks: dict[str, list[range]] = {}  # key -> counters reserved here, unused
        self._sizes = BlockSizes()
        self._spares: list[range] = []  # spare counters reserved here, not used yet
        self._refilling: concurrent.futures.Future[None] | None = None
        self._lock = threading.Lock()

    async def prepare(self) -> None:
        """Reserve the first spare counters (at start, while the store answers)."""
        await self._refill()

    async def _refill(self) -> None:
        start = await self._store.reserve_file_counter(SPARE_KEY, SPARE_COUNTERS_FROM, SPARE_BLOCK)
        with self._lock:
            self._spares.append(range(start, start + SPARE_BLOCK))

    def reserve(self, folder: Path, name: str, floor: int, count: int) -> int:
        relative = os.path.relpath(os.path.realpath(folder), self._root)
        parts = Path(relative).parts
        kind = parts[2] if parts[:1] == ("tenants",) and len(parts) > 2 else parts[0]
        if relative.startswith(os.pardir) or kind not in SHARED_TYPES:
            return floor  # no other gateway names files there
        # Hashed: a prefix may be very long, or hold anything; the key stays small.
        key = hashlib.sha256(f"{relative}\x00{name}".encode("utf-8", "surrogatepass")).hexdigest()
        with self._lock:
            taken = self._take(key, floor, count)
            if taken is not None:
                return taken
            size = max(count, self._sizes.next(key, time.monotonic()))
        reserving = self._store.reserve_file_counter(key, floor, size)
        asked = asyncio.run_coroutine_threadsafe(reserving, self._loop)
        try:
            start = asked.result(timeout=QUICK)
        except (StoreError, concurrent.futures.TimeoutError) as exc:
            asked.cancel()
            spare = self._spare(count)
            if spare is not None:
                log.warning("the store does not answer (%s): a spare file counter", exc)
                return spare
            start = self._from_store(key, floor, size)
        with self._lock:
            # In order among the blocks saves meanwhile reserved or left: the lowest first.
            blocks = self._blocks.setdefault(key, [])
            bisect.insort(blocks, range(start + count, start + size), key=lambda r: r.start)
        return start

    def _take(self, key: str, floor: int, count: int) -> int | None:
        """`count` consecutive counters from the blocks reserved for `key` (under the lock),
        none below `floor`; None when they are used up."""
        blocks = self._blocks.get(key, [])
        while blocks:
            start = max(blocks[0].start, floor)
            if start + count <= blocks[0].stop:
                blocks[0] = range(start + count, blocks[0].stop)
                return start
            blocks.pop(0)  # too few left in it (or all below the floor)
        return None

    def _spare(self, count: int) -> int | None:
        """`count` consecutive spare counters, or None when none are left; asks for more
        once half are used."""
        with self._lock:
            while self._spares and len(self._spares[0]) < count:
                self._spares.pop(0)  # too few left in it for this save
            if not self._spares:
                return None
            first = self._spares[0]
            self._spares[0] = first[count:]
            left = sum(len(r) for r in self._spares)
            if left < SPARE_BLOCK // 2 and (self._refilling is None or self._refilling.done()):
                self._refilling = asyncio.run_coroutine_threadsafe(self._refill(), self._loop)
            return first.start

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
