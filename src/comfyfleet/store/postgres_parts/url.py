"""PostgreSQL URLs: which strings name a database, and how to show one without its password.

A URL's password (`postgresql://user:password@host/db`, or a `password=` or
`sslpassword=` query parameter) is a secret: wherever a URL is logged or shown, it
goes through `redact_url`; argv shown to clients goes through `redact_urls_in`.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

SCHEMES = ("postgresql", "postgres")

#: A PostgreSQL URL inside other text (an argv entry such as `--store=postgresql://...`).
_URL_IN_TEXT = re.compile(r"(?i)\bpostgres(?:ql)?://\S*")
#: A query parameter that holds a password, and its value.
_SECRET_PARAM = re.compile(r"(?i)((?:^|[?&])(?:ssl)?password=)([^&#]*)")

HIDDEN = "***"


def is_postgres_url(text: str) -> bool:
    """Whether `text` is a `postgresql://` or `postgres://` URL."""
    scheme, sep, _ = text.partition("://")
    return bool(sep) and scheme.lower() in SCHEMES


def _split(url: str) -> tuple[str, str, str]:
    """(`scheme://`, the user-info and hosts, the rest from the path on)."""
    scheme, sep, rest = url.partition("://")
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    return scheme + sep, rest[:end], rest[end:]


def _secrets(url: str) -> list[str]:
    """The passwords a URL holds, as written and decoded, longest first."""
    _, authority, rest = _split(url)
    found = []
    userinfo, at, _ = authority.rpartition("@")
    if at and ":" in userinfo:
        found.append(userinfo.partition(":")[2])
    found += [match.group(2) for match in _SECRET_PARAM.finditer(rest.partition("#")[0])]
    spelled = {secret for secret in found if secret} | {unquote(s) for s in found if s}
    return sorted(spelled, key=len, reverse=True)


def redact_url(url: str, text: str | None = None) -> str:
    """`url` with its password shown as `***`; with `text`, that text with every
    spelling of the URL's passwords (as written, decoded) shown as `***`."""
    if text is not None:
        for secret in _secrets(url):
            text = text.replace(secret, HIDDEN)
        return text
    start, authority, rest = _split(url)
    userinfo, at, hosts = authority.rpartition("@")
    if at and ":" in userinfo:
        authority = f"{userinfo.partition(':')[0]}:{HIDDEN}@{hosts}"
    rest = _SECRET_PARAM.sub(lambda m: m.group(1) + HIDDEN, rest)
    return start + authority + rest


def redact_urls_in(text: str) -> str:
    """`text` with the password of every PostgreSQL URL in it shown as `***`."""
    return _URL_IN_TEXT.sub(lambda match: redact_url(match.group()), text)
