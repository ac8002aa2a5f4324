"""ComfyUI's submission counter, kept in a sequence every gateway shares."""

from __future__ import annotations

import asyncio

from comfyfleet.store.postgres_parts.access import PostgresAccess, Q

#: The counter is a bigint sequence: a stored number past this does not move it.
COUNTER_MAX = 2**62


class PostgresCounter(PostgresAccess):
    """`next_number` from the sequence, never behind a number stored from elsewhere."""

    # The floor is applied under the lock, so no other call of this process runs
    # between reading the sequence and moving it.
    _counter: asyncio.Lock
    _counter_floor: int

    async def next_number(self) -> int:
        """The next value of ComfyUI's submission counter (advances on every call)."""
        async with self._counter:
            number: int = await self._run(lambda db: db.fetchval(Q["next_number"]))
            if number < self._counter_floor:  # a number stored from elsewhere is ahead
                number = self._counter_floor
                await self._commit(lambda db: db.execute(Q["set_number"], number))
            self._counter_floor = number + 1
        return number

    def _raise_counter(self, at_least: int) -> None:
        """Make the counter hand out at least `at_least` next (it never goes back)."""
        if at_least <= COUNTER_MAX:
            self._counter_floor = max(self._counter_floor, at_least)
