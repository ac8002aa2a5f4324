"""Webhook settings: the server-wide targets (`[[webhooks]]`) and the sender's knobs."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from comfyfleet.domain.webhooks import WebhookEvent, WebhookTarget
from comfyfleet.tenants import check_tenant_name
from comfyfleet.webhooks.addresses import NotAllowed, parse_url
from comfyfleet.webhooks.signing import parse_secret

TARGET_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
KNOWN_EVENTS = ", ".join(event.value for event in WebhookEvent)


@dataclass(frozen=True)
class WebhookConfig:
    """A server-wide webhook: the store's target and its key (never in a repr)."""

    target: WebhookTarget
    key: bytes = field(repr=False)


@dataclass(frozen=True)
class WebhookSettings:
    targets: tuple[WebhookConfig, ...] = ()
    key: bytes | None = field(default=None, repr=False)  # signs the prompts' own webhooks
    allow_private: bool = False
    timeout: float = 10.0  # seconds per attempt
    retry_for: float = 86400.0  # seconds of retries before a delivery is dead-lettered
    concurrency: int = 32  # attempts at once (a quarter of them to one destination)
    view_base: str = "http://127.0.0.1:8188"  # where outputs' /view URLs point

    @property
    def enabled(self) -> bool:
        return bool(self.targets) or self.key is not None


def parse_events(value: Any, where: str) -> frozenset[WebhookEvent]:
    """A list of known event names, at least one."""
    if not isinstance(value, list) or not value or len(value) > len(WebhookEvent):
        raise ValueError(f"{where} must be a list of events ({KNOWN_EVENTS})")
    events = set()
    for name in value:
        if name not in set(WebhookEvent):
            raise ValueError(f"{where}: unknown event {str(name)[:40]!r}; use {KNOWN_EVENTS}")
        events.add(WebhookEvent(name))
    return frozenset(events)


def read_secret_file(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read webhook secret file {path}: {exc}") from None
    lines = text.strip().splitlines()
    return lines[0].strip() if lines else ""


def parse_tables(tables: Any, base: Path) -> tuple[WebhookConfig, ...]:
    """`[[webhooks]]` tables `{name, url, secret | secret_file, events, tenants}`; paths
    relative to `base`. ValueError names the table at fault."""
    if not isinstance(tables, list):
        raise ValueError("webhooks must be a list of tables ([[webhooks]])")
    known = {"name", "url", "secret", "secret_file", "events", "tenants"}
    parsed: list[WebhookConfig] = []
    for number, table in enumerate(tables, 1):
        where = f"webhooks entry {number}"
        if not isinstance(table, dict) or set(table) - known:
            raise ValueError(f"{where}: only {', '.join(sorted(known))} are known")
        parsed.append(_table(table, base, where))
    names = [config.target.name for config in parsed]
    if len(set(names)) != len(names):
        raise ValueError("two [[webhooks]] entries have one name")
    return tuple(parsed)


def _table(table: dict[str, Any], base: Path, where: str) -> WebhookConfig:
    try:
        url = parse_url(table.get("url")).geturl()
    except NotAllowed as exc:
        raise ValueError(f"{where}: {exc}".replace("webhook_url", "url")) from None
    # The name ties pending deliveries to the target: by default the url's, so reordering
    # the tables changes nothing.
    name = table.get("name", "webhook-" + hashlib.sha256(url.encode()).hexdigest()[:12])
    if not isinstance(name, str) or not TARGET_NAME.fullmatch(name):
        raise ValueError(f"{where}: name is letters, digits, _ . and - (1 to 64)")
    if ("secret" in table) == ("secret_file" in table):
        raise ValueError(f"{where}: give secret or secret_file (one of them)")
    secret = table.get("secret")
    if "secret_file" in table:
        secret = read_secret_file(base / str(table["secret_file"]))
    if not isinstance(secret, str):
        raise ValueError(f"{where}: secret must be a string")
    key = parse_secret(secret)
    events = None if "events" not in table else parse_events(table["events"], f"{where}: events")
    tenants = table.get("tenants")
    if tenants is not None:
        if not isinstance(tenants, list) or not tenants:
            raise ValueError(f"{where}: tenants must be a list of tenant names")
        tenants = frozenset(check_tenant_name(tenant) for tenant in tenants)
    return WebhookConfig(WebhookTarget(name, url, events, tenants), key)
