"""Scrubbing API keys out of anything the provider clients say.

Known key values are replaced first, because they are exact; the header-shaped
patterns are a backup for secrets the redactor was not told about (a relay that
echoes another credential, a key pasted into a prompt field).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import urlsplit

MASK = "***"

_PATTERNS = (
    # "Bearer <token>" wherever it appears (Authorization headers, echoed requests).
    (re.compile(r"(?i)(\bbearer\s+)[^\s\"',;]+"), rf"\g<1>{MASK}"),
    # "x-key: <key>", "api-key=<key>", "x-api-key": "<key>" and similar header dumps.
    (
        re.compile(
            r"(?i)(\b(?:x-key|x-api-key|api-key|api_key|apikey)[\"']?\s*[:=]\s*[\"']?)"
            r"[^\s\"',;}&]+"
        ),
        rf"\g<1>{MASK}",
    ),
    # OpenAI-style secret keys, even when they were not configured here.
    (re.compile(r"\bsk-[A-Za-z0-9_\-]{16,}"), MASK),
    # Query strings of URLs quoted in messages: signed download links carry their
    # signature there, and some relays accept the key as a parameter.
    (re.compile(r"(\bhttps?://[^\s?#\"'<>]+)[?#][^\s\"'<>]*"), rf"\g<1>?{MASK}"),
)


class Redactor:
    """Replaces secrets by `***` in text and strips URLs to scheme://host/path."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        # Longest first, so a key that contains another key is masked whole.
        self._secrets = tuple(sorted({s for s in secrets if s}, key=len, reverse=True))

    @property
    def secrets(self) -> tuple[str, ...]:
        return self._secrets

    def including(self, *secrets: str) -> Redactor:
        """A redactor that also knows `secrets` (shared redactors stay unchanged)."""
        return Redactor((*self._secrets, *secrets))

    def text(self, s: str) -> str:
        for secret in self._secrets:
            s = s.replace(secret, MASK)
        for pattern, replacement in _PATTERNS:
            s = pattern.sub(replacement, s)
        return s

    def url(self, u: str) -> str:
        """`scheme://host[:port]/path`: signed download URLs carry credentials in the query."""
        try:
            parts = urlsplit(u)
            host = parts.hostname or ""
            port = parts.port
        except ValueError:
            return MASK
        if not parts.scheme or not host:
            return self.text(u.split("?", 1)[0].split("#", 1)[0])
        if ":" in host:
            host = f"[{host}]"
        netloc = f"{host}:{port}" if port is not None else host
        return self.text(f"{parts.scheme}://{netloc}{parts.path}")
