"""Signatures as the Standard Webhooks specification defines them (standardwebhooks.com):
`webhook-signature: v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`, keyed with the
bytes of a `whsec_<base64>` secret."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac

PREFIX = "whsec_"
#: The key sizes the specification recommends.
MIN_KEY, MAX_KEY = 24, 64


def parse_secret(text: str) -> bytes:
    """The key of a `whsec_<base64>` secret; ValueError (never quoting it) otherwise."""
    if not text.startswith(PREFIX):
        raise ValueError(f"a webhook secret starts with {PREFIX} (then base64)")
    try:
        key = base64.b64decode(text[len(PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"a webhook secret is {PREFIX} then base64") from None
    if not MIN_KEY <= len(key) <= MAX_KEY:
        raise ValueError(f"a webhook secret holds {MIN_KEY} to {MAX_KEY} bytes, not {len(key)}")
    return key


def signature(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def headers(key: bytes, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three headers of one attempt (the timestamp is the attempt's, in seconds)."""
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature(key, msg_id, timestamp, body),
    }
