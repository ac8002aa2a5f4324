"""Webhooks: job ends delivered to HTTP receivers, signed as Standard Webhooks says,
from the store's outbox (at least once, each delivery under a stable `webhook-id`)."""

from comfyfleet.webhooks.sender import WebhookSender
from comfyfleet.webhooks.settings import WebhookConfig, WebhookSettings

__all__ = ["WebhookConfig", "WebhookSender", "WebhookSettings"]
