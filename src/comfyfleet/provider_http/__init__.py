"""The HTTP side every paid-API client shares: one exchange and its retries, the errors
a provider call can end in, rate-limit cooldowns, redaction of keys, and the clients'
common base (`client.ProviderClient`).

This is not where a provider goes: each provider (its client, driver and nodes) has a
package under `comfyfleet.nodes.providers`; their local stand-ins are in
`comfyfleet.testing.emulators`.
"""

from comfyfleet.provider_http.errors import (
    AmbiguousSubmit,
    JobFailed,
    ModerationError,
    ProviderCancelled,
    ProviderError,
    RateLimited,
)
from comfyfleet.provider_http.redact import Redactor
from comfyfleet.provider_http.retry import Backoff, Cooldown

__all__ = [
    "AmbiguousSubmit",
    "Backoff",
    "Cooldown",
    "JobFailed",
    "ModerationError",
    "ProviderCancelled",
    "ProviderError",
    "RateLimited",
    "Redactor",
]
