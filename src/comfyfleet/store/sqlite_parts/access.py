"""What every concern of the SQLite store works through: one writer, a few readers,
the clock, and the gateway it acts for."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import TypeVar

from comfyfleet.store.base import StoreError
from comfyfleet.store.sqlite_parts.io import GroupWriter, ReaderPool

T = TypeVar("T")


class SQLiteAccess:
    """The base the concern classes share; `SQLiteStore` opens and closes what it holds."""

    owner: str
    _instance: str
    _clock: Callable[[], float]
    _writer: GroupWriter | None
    _readers: ReaderPool | None

    def _open_writer(self) -> GroupWriter:
        if self._writer is None:
            raise StoreError("the store is not open")
        return self._writer

    async def _write(self, op: Callable[[sqlite3.Connection], T]) -> T:
        return await self._open_writer().submit(op)

    async def _read(self, op: Callable[[sqlite3.Connection], T]) -> T:
        if self._readers is None:
            raise StoreError("the store is not open")
        return await self._readers.run(op)
