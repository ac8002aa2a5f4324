"""`Idempotency-Key` on submits: a client retrying after a network error never queues twice.

The key (per tenant) and a digest of the request body are stored with the job in the
transaction that queues it (see comfyfleet.domain.idempotency). Within 24 hours the same
key and body get the first answer again, marked `Idempotent-Replayed: true`, and queue
nothing; the same key with another body is a 409.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from typing import Any

from aiohttp import web

from comfyfleet.errors import ClientError
from comfyfleet.protocol.errors import error, prompt_error_body
from comfyfleet.server.plumbing.client_json import OFF_LOOP_BYTES

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
#: A key: 1 to 255 visible ASCII characters (a UUID, or the IETF draft's quoted string).
MAX_KEY_LENGTH = 255
_KEY = re.compile(rf"[\x21-\x7e]{{1,{MAX_KEY_LENGTH}}}")


class BadKey(ClientError):
    """The header is there but is not a usable key."""

    type = "invalid_idempotency_key"


def idempotency_key(request: web.Request) -> str | None:
    """The request's key, None without the header; BadKey if it cannot be one."""
    values = request.headers.getall(HEADER, [])
    if not values:
        return None
    if len(values) > 1:
        raise BadKey(f"send one {HEADER} header, not {len(values)}")
    key = values[0]
    if not _KEY.fullmatch(key):
        raise BadKey(
            f"{HEADER} must be 1 to {MAX_KEY_LENGTH} visible ASCII characters (a UUID, say)"
        )
    return key


async def body_digest(request: web.Request, body: Any) -> str:
    """SHA-256 of the body's canonical JSON: key order and spacing do not count."""
    if len(await request.read()) > OFF_LOOP_BYTES:
        return await asyncio.to_thread(canonical_digest, body)
    return canonical_digest(body)


def canonical_digest(body: Any) -> str:
    """SHA-256 of `body` as canonical JSON (keys sorted, no spaces, ASCII)."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


def reused_key() -> web.Response:
    """The 409 for a key already used with another body."""
    err = error(
        "idempotency_key_reused",
        f"This {HEADER} was used with another request in the last 24 hours",
        "use a new key for a new request",
    )
    return web.json_response(prompt_error_body(err), status=409)
