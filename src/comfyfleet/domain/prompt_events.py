"""A prompt's client stream as the event log keeps it: each event gets an id that only
grows, which followers resume after (the SSE `id:`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: ComfyUI's done signal is `executing` with node None: the last event of a stream.
DONE_TYPE = "executing"


def is_done(event_type: str, data: dict[str, Any]) -> bool:
    return event_type == DONE_TYPE and data.get("node") is None


@dataclass(frozen=True)
class NewPromptEvent:
    """An event of `prompt_id`'s stream, about to be appended."""

    prompt_id: str
    type: str
    data: dict[str, Any]


@dataclass(frozen=True)
class PromptEvent:
    """An appended event: `id` grows with every append, store-wide; `at` is when it was
    appended (Unix seconds)."""

    id: int
    prompt_id: str
    type: str
    data: dict[str, Any]
    at: float

    @property
    def done(self) -> bool:
        return is_done(self.type, self.data)


@dataclass(frozen=True)
class EventsAppended:
    """A wake-up from the store: events of a prompt were committed to the log.

    `prompt_id` None means "any prompt": events may have been appended that no wake-up
    named (a listener that lost its connection), so every follower reads the log again.
    `client` is the `client_digest` of the prompt's client (None: it has none, or the
    job is unknown). `ours`: this process appended them (its followers already have them).
    """

    prompt_id: str | None
    client: str | None
    ours: bool
