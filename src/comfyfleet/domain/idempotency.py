"""Idempotent submits: a client's `Idempotency-Key` and the first answer it got.

A key belongs to one tenant and holds for `IDEMPOTENCY_WINDOW` seconds: within it, the
same key with the same request gets the first answer again and queues nothing; with
another request it is refused. The store records the key with the job it queued, in the
same transaction, so neither ever exists without the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from comfyfleet.errors import ComfyfleetError

#: How long a key keeps its first answer (24 hours).
IDEMPOTENCY_WINDOW = 24 * 3600.0


@dataclass(frozen=True)
class IdempotentRequest:
    """A submit made under a key: the key, a digest of the request, and the answer given
    (kept whole, so a repeat gets exactly the first answer back)."""

    key: str
    request_hash: str
    answer: dict[str, Any]
    created_at: float = 0.0  # when the store recorded it (0 before)


class IdempotencyKeyTaken(ComfyfleetError):
    """The tenant used this key less than IDEMPOTENCY_WINDOW ago: nothing was queued."""

    def __init__(self, first: IdempotentRequest) -> None:
        super().__init__(f"idempotency key {first.key!r} is taken")
        self.first = first
