"""The error body OpenAI-compatible APIs answer with: `{"error": {"message", "type", "code"}}`."""

from __future__ import annotations

from comfyfleet.provider_http.transport import Reply

#: Codes for a refusal by the provider's content filter.
MODERATION_CODES = frozenset({"moderation_blocked", "content_policy_violation"})
#: A 429 with these will not clear by waiting: the account is out of money.
QUOTA_CODES = frozenset({"insufficient_quota", "billing_hard_limit_reached"})


def error_fields(reply: Reply) -> tuple[str, str, str]:
    """(message, type, code) from `{"error": {...}}`, falling back to the raw body."""
    data = reply.json()
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        return (
            str(error.get("message") or ""),
            str(error.get("type") or "").lower(),
            str(error.get("code") or "").lower(),
        )
    return reply.body.decode("utf-8", "replace"), "", ""
