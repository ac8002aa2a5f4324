from __future__ import annotations

import pickle

from comfyfleet.provider_http.errors import (
    AmbiguousSubmit,
    JobFailed,
    ModerationError,
    ProviderCancelled,
    ProviderError,
    RateLimited,
)


def test_message_and_repr_carry_the_facts() -> None:
    error = JobFailed("bfl", "job ended with status 'Error'", status=200, task_id="t-1")
    assert str(error) == "bfl: job ended with status 'Error' (HTTP 200) [task t-1]"
    assert "task_id='t-1'" in repr(error)
    assert error.retryable is False
    assert isinstance(error, ProviderError)


def test_retryable_defaults_and_overrides() -> None:
    assert RateLimited("bfl", "slow down").retryable is True
    assert RateLimited("openai", "no quota", retryable=False).retryable is False
    assert ProviderError("bfl", "x", retryable=True).retryable is True
    for cls in (ModerationError, JobFailed, AmbiguousSubmit, ProviderCancelled):
        assert cls("p", "m").retryable is False


def test_errors_survive_pickling() -> None:
    for error in (
        RateLimited("bfl", "wait", retry_after=2.5, task_id="t"),
        AmbiguousSubmit("openai", "maybe", status=504),
        ProviderError("bfl", "x", retryable=True),
    ):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error)
        assert repr(copy) == repr(error)
