"""Wake-ups of the prompt event log: who is told that a prompt's events were committed.

Each wake-up names the prompt and a digest of its client (tenant and client id), so a
gateway learns whether one of its sockets wants the frames without reading the job.
The digest is short (64 bits) and only a hint: whoever acts on it checks the job.
It is computed over the text as PostgreSQL stores it (postgres_text.py), so the database
can compute it in the statement that appends the events.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable

from comfyfleet.domain.prompt_events import EventsAppended
from comfyfleet.store.postgres_text import to_db

#: Hex digits of the digest kept.
DIGEST_LENGTH = 16

EventsWake = Callable[[EventsAppended], None]


def client_digest(tenant: str, client_id: str) -> str:
    """A short digest of a tenant's client id (the hub's `client_key` of that pair)."""
    stored_tenant = to_db(tenant)
    text = f"{len(stored_tenant)}:{stored_tenant}{to_db(client_id)}"
    return hashlib.md5(text.encode(), usedforsecurity=False).hexdigest()[:DIGEST_LENGTH]


def appended(prompts: Iterable[tuple[str, str | None, str | None]]) -> list[EventsAppended]:
    """This process's wake-ups for (prompt_id, tenant, client_id) of each prompt appended
    to (tenant None: the job is unknown)."""
    return [
        EventsAppended(
            prompt_id,
            None if tenant is None or client_id is None else client_digest(tenant, client_id),
            ours=True,
        )
        for prompt_id, tenant, client_id in prompts
    ]
