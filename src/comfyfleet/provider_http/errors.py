"""What can go wrong when a paid image API runs a job, as exceptions the caller can act on.

Every message is expected to be redacted already (see `redact.Redactor`): these
exceptions end up in logs, journals and ComfyUI error events.
"""

from __future__ import annotations

from typing import Any

from comfyfleet.errors import ComfyfleetError


class ProviderError(ComfyfleetError):
    """A provider call failed.

    `retryable` says whether repeating the *same* operation is safe and may help;
    it never means "submit the job again" for job-creating calls.
    """

    default_retryable = False

    def __init__(
        self,
        provider: str,
        message: str,
        *,
        status: int | None = None,
        task_id: str | None = None,
        retryable: bool | None = None,
    ) -> None:
        super().__init__(provider, message)
        self.provider = provider
        self.message = message
        self.status = status
        self.task_id = task_id
        self.retryable = self.default_retryable if retryable is None else retryable

    def __str__(self) -> str:
        parts = [f"{self.provider}: {self.message}"]
        if self.status is not None:
            parts.append(f"(HTTP {self.status})")
        if self.task_id is not None:
            parts.append(f"[task {self.task_id}]")
        return " ".join(parts)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(provider={self.provider!r}, message={self.message!r}, "
            f"status={self.status!r}, task_id={self.task_id!r}, retryable={self.retryable!r})"
        )

    def _state(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "task_id": self.task_id,
            "retryable": self.retryable,
        }

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only arguments do not survive the default Exception pickling, and
        # these errors cross process boundaries (worker lanes, journals).
        return (_rebuild, (type(self), self.provider, self.message, self._state()))


def _rebuild(cls: type[ProviderError], provider: str, message: str, state: dict[str, Any]) -> Any:
    return cls(provider, message, **state)


class RateLimited(ProviderError):
    """HTTP 429 or a provider-side concurrency limit; `retry_after` in seconds when known."""

    default_retryable = True

    def __init__(
        self,
        provider: str,
        message: str,
        *,
        retry_after: float | None = None,
        status: int | None = 429,
        task_id: str | None = None,
        retryable: bool | None = None,
    ) -> None:
        super().__init__(provider, message, status=status, task_id=task_id, retryable=retryable)
        self.retry_after = retry_after

    def _state(self) -> dict[str, Any]:
        return {**super()._state(), "retry_after": self.retry_after}

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, retry_after={self.retry_after!r})"


class ModerationError(ProviderError):
    """The prompt, an input image or the result was refused by the provider's filter."""


class JobFailed(ProviderError):
    """The provider accepted the job and then reported that it failed or lost it."""


class AmbiguousSubmit(ProviderError):
    """The job-creating request may or may not have reached the provider.

    The connection dropped or timed out after the request was sent, so the job may
    be running (and billed). It is never re-sent automatically: doing so could pay
    twice for one image.
    """


class ProviderCancelled(ProviderError):
    """The provider reports the job as cancelled."""
