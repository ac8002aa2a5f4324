"""Clients for paid image-generation APIs (BFL FLUX, OpenAI-compatible images) and a
local emulator of both."""

from comfyfleet.providers.bfl import BFLClient, SubmittedTask
from comfyfleet.providers.errors import (
    AmbiguousSubmit,
    JobFailed,
    ModerationError,
    ProviderCancelled,
    ProviderError,
    RateLimited,
)
from comfyfleet.providers.openai_images import OpenAIImagesClient
from comfyfleet.providers.redact import Redactor
from comfyfleet.providers.retry import Backoff, Cooldown

__all__ = [
    "AmbiguousSubmit",
    "BFLClient",
    "Backoff",
    "Cooldown",
    "JobFailed",
    "ModerationError",
    "OpenAIImagesClient",
    "ProviderCancelled",
    "ProviderError",
    "RateLimited",
    "Redactor",
    "SubmittedTask",
]
