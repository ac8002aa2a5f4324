"""How attempts end, in the PostgreSQL store: the ends that come while others are being
recorded are recorded together, one statement for many (see batches.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from comfyfleet.domain.jobs import TERMINAL, JobResult
from comfyfleet.domain.webhooks import EVENT_OF
from comfyfleet.store.postgres_parts.access import PostgresAccess, Q, dumps
from comfyfleet.store.postgres_parts.batches import Batches
from comfyfleet.store.postgres_text import from_db, to_db


@dataclass(frozen=True)
class Ending:
    prompt_id: str
    attempt: int
    result: JobResult


class PostgresFinishes(PostgresAccess):
    _finishes: Batches[Ending, bool]

    def _batch_finishes(self) -> None:
        """Set up the group commit of `finish` (on construction)."""
        self._finishes = Batches(self._finish_all)

    async def finish(self, prompt_id: str, attempt: int, result: JobResult) -> bool:
        """Record how an attempt ended, in one transaction; False if the attempt is stale."""
        if result.status not in TERMINAL:
            raise ValueError(f"a finished attempt needs a terminal status, not {result.status}")
        return await self._finishes.put(Ending(prompt_id, attempt, result))

    async def _finish_all(self, endings: Sequence[Ending]) -> list[bool]:
        params = _finish_params(endings, self._clock())
        rows = await self._commit(lambda db: db.fetch(Q["finish_jobs"], *params))
        changed = {(from_db(prompt_id), attempt) for prompt_id, attempt in rows}
        return [(e.prompt_id, e.attempt) in changed for e in endings]


def _finish_params(endings: Sequence[Ending], now: float) -> tuple[Any, ...]:
    """finish_jobs' parameters: the attempts side by side, then their messages and files
    flattened, each with its attempt's place in the batch (from 1)."""
    attempts: tuple[list[Any], ...] = ([], [], [], [], [], [], [], [])
    messages: tuple[list[Any], ...] = ([], [], [], [])
    files: tuple[list[Any], ...] = ([], [], [], [])
    for place, ending in enumerate(endings, start=1):
        result = ending.result
        row = (
            to_db(ending.prompt_id),
            ending.attempt,
            result.status.value,
            None if result.error is None else dumps(result.error),
            result.historic,
            dumps(result.outputs),
            dumps(result.meta),
            EVENT_OF[result.status].value,
        )
        _append(attempts, row)
        for seq, (kind, data) in enumerate(result.messages):
            _append(messages, (place, seq, to_db(str(kind)), dumps(data)))
        for f in result.files:
            _append(files, (place, to_db(f.filename), to_db(f.subfolder), to_db(f.type)))
    return (*attempts, now, *messages, *files)


def _append(columns: tuple[list[Any], ...], row: tuple[Any, ...]) -> None:
    for column, value in zip(columns, row, strict=True):
        column.append(value)
