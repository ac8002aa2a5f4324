"""The prompt event log on PostgreSQL: what the store runs for each log verb.

`db` is an asyncpg pool or connection; every statement is one of the named blocks of
postgres_queries.sql. Ids come from an identity column: never reused, and growing in
the order of each append. Driver errors are wrapped by the store, not here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from comfyfleet.domain.prompt_events import (
    PAGE_FRAME_BYTES,
    EventsAppended,
    NewPromptEvent,
    PromptEvent,
)
from comfyfleet.store.postgres_text import from_db, to_db
from comfyfleet.store.sql_blocks import load_blocks

Q = load_blocks("postgres_queries.sql")


async def append(
    db: Any, events: Sequence[NewPromptEvent], now: float, instance: str
) -> list[PromptEvent]:
    """Append, and announce each prompt on the events channel in the same transaction
    (see parse_wakeup), as store `instance`."""
    rows = await db.fetch(
        Q["append_prompt_events"],
        [to_db(e.prompt_id) for e in events],
        [to_db(e.type) for e in events],
        [e.json for e in events],
        now,
        instance,
        [e.frame for e in events],
    )
    # Inserted in the order given, each taking the identity's next value: sorted ids
    # pair with the events in order, whatever order RETURNING lists them in.
    ids = sorted(row[0] for row in rows)
    return [PromptEvent(i, e.prompt_id, e.type, e.data, now, e.frame) for i, e in zip(ids, events)]


async def after(db: Any, prompt_id: str, after_id: int, limit: int) -> list[PromptEvent]:
    """See the store's verb: paged by `limit` and by PAGE_FRAME_BYTES."""
    rows = await db.fetch(Q["prompt_events"], to_db(prompt_id), after_id, limit, PAGE_FRAME_BYTES)
    return [PromptEvent(r[0], prompt_id, from_db(r[1]), json.loads(r[2]), r[3], r[4]) for r in rows]


async def prune(db: Any, before: float) -> int:
    gone: int = await db.fetchval(Q["prune_prompt_events"], before)
    return gone


def parse_wakeup(payload: str, instance: str) -> EventsAppended | None:
    """A notification's payload, `INSTANCE DIGEST PROMPT_ID`: the store instance that
    appended, the prompt's client digest (`-`: none), the prompt id as stored (empty when
    it is longer than NAMED_MAX characters, which a notification could not hold). At most
    about 4 KB, below PostgreSQL's 8,000 bytes. None when malformed."""
    parts = payload.split(" ", 2)
    if len(parts) != 3 or not parts[0] or not parts[1]:
        return None
    origin, digest, prompt_id = parts
    return EventsAppended(
        from_db(prompt_id) if prompt_id else None,
        None if digest == "-" else digest,
        ours=origin == instance,
    )


async def appended_since(db: Any, since: float, limit: int) -> list[EventsAppended]:
    """Each prompt (at most `limit`) with an event appended at or after `since`."""
    rows = await db.fetch(Q["prompts_appended_since"], since, limit)
    return [EventsAppended(from_db(r[0]), r[1], ours=False) for r in rows]
