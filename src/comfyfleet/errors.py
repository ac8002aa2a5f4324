"""The root of every error comfyfleet raises, and the errors clients get in ComfyUI's shape.

Each package keeps its own errors beside the code that raises them; every one of them
descends from `ComfyfleetError`, so `except ComfyfleetError` catches all of comfyfleet's
and nothing else. Errors that stood for a builtin (a `ValueError`, a `LookupError`) keep
it as a second base, so code that catches the builtin goes on catching them.
"""

from __future__ import annotations

from typing import Any, ClassVar

from comfyfleet.protocol.errors import error


class ComfyfleetError(Exception):
    """Something comfyfleet does failed."""


class ClientError(ComfyfleetError, ValueError):
    """What a client sent cannot be used: it gets ComfyUI's error object
    `{type, message, details, extra_info}`, `type` named as ComfyUI names it."""

    type: ClassVar[str] = "invalid_prompt"

    def __init__(self, message: str, details: str = "") -> None:
        super().__init__(f"{message}: {details}" if details else message)
        self.message = message
        self.details = details

    def as_error(self) -> dict[str, Any]:
        return error(self.type, self.message, self.details)
