"""What every paid-API client shares: one HTTP exchange and its retries, the errors a
provider call can end in, rate-limit cooldowns, and redaction of keys.

The providers themselves (client, driver and nodes) each have a package under
`comfyfleet.nodes.providers`; their local stand-ins are in `comfyfleet.testing.emulators`.
"""

from comfyfleet.providers.errors import (
    AmbiguousSubmit,
    JobFailed,
    ModerationError,
    ProviderCancelled,
    ProviderError,
    RateLimited,
)
from comfyfleet.providers.redact import Redactor
from comfyfleet.providers.retry import Backoff, Cooldown

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
