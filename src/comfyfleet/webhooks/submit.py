"""A prompt's own webhook (`extra_data.webhook_url`, `extra_data.webhook_events`),
checked when the prompt is submitted."""

from __future__ import annotations

import json
from typing import Any

from comfyfleet.domain.webhooks import EVENTS_KEY, URL_KEY
from comfyfleet.webhooks.addresses import NotAllowed, check_host, parse_url
from comfyfleet.webhooks.settings import WebhookSettings, parse_events


async def check_prompt_webhook(extra_data: dict[str, Any], settings: WebhookSettings) -> None:
    """NotAllowed, saying why, when the prompt's webhook cannot be used; nothing to say
    when it has none."""
    if URL_KEY not in extra_data:
        if EVENTS_KEY in extra_data:
            raise NotAllowed(f"{EVENTS_KEY} goes with {URL_KEY}")
        return
    if settings.key is None:
        raise NotAllowed(
            "this server signs no per-prompt webhooks: its operator sets webhooks_secret "
            "to allow them"
        )
    parts = parse_url(extra_data[URL_KEY])
    if EVENTS_KEY in extra_data:
        try:
            parse_events(extra_data[EVENTS_KEY], EVENTS_KEY)
        except ValueError as exc:
            raise NotAllowed(str(exc)) from None
    # The store looks for the webhook in extra_data's JSON, which PostgreSQL cannot read
    # when it holds an escaped NUL anywhere.
    if "\\u0000" in json.dumps(extra_data):
        raise NotAllowed(f"extra_data with a NUL character cannot carry a {URL_KEY}")
    if not settings.allow_private:
        await check_host(parts.hostname or "")
