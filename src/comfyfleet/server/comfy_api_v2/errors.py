"""Comfy API v2's error envelope: `{"error": {"code", "message", "details"}}`.

Its codes and statuses are v2's own (`invalid_workflow` 422, `not_found` 404,
`idempotency_key_reuse` 422, `queue_full` 429 with Retry-After, ...), not ComfyUI's
`type` strings: the SDK picks the exception it raises by `code`.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from comfyfleet.errors import ComfyfleetError

#: Where the v2 surface is mounted.
PREFIX = "/api/v2"


def envelope(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details}}


def v2_error(
    status: int,
    code: str,
    message: str,
    details: dict[str, Any] | None = None,
    *,
    headers: dict[str, str] | None = None,
) -> web.Response:
    """The envelope as a response."""
    return web.json_response(envelope(code, message, details), status=status, headers=headers)


class V2Error(web.HTTPException, ComfyfleetError):
    """A v2 error to raise from a handler (aiohttp answers it as it is)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        details: dict[str, Any] | None = None,
        *,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.status_code = status
        super().__init__(
            text=json.dumps(envelope(code, message, details)),
            content_type="application/json",
            headers=headers,
        )


def not_found(what: str = "job") -> V2Error:
    """The same answer for an unknown id and another tenant's."""
    return V2Error(404, "not_found", f"No such {what}")


def invalid_request(message: str) -> V2Error:
    return V2Error(400, "invalid_request", message)
