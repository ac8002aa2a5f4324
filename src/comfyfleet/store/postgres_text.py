"""Text for PostgreSQL columns: every character kept, NUL included.

PostgreSQL text cannot hold NUL, which SQLite (and JSON's `\\u0000`) can: a prompt_id
or client_id from a client may carry one. Such text is stored escaped, with SOH
(U+0001) as the escape character: SOH becomes SOH SOH and NUL becomes SOH STX. Text
without either character is stored as it is. The code is prefix-free, so a stored
value starts with a stored prefix exactly when the text starts with the prefix
(`requeue_lane` relies on that), and equal text stays equal.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_ESCAPED = re.compile("\x01(.)", re.DOTALL)


def to_db(text: str) -> str:
    """`text` as stored."""
    if "\x00" not in text and "\x01" not in text:
        return text
    return text.replace("\x01", "\x01\x01").replace("\x00", "\x01\x02")


def to_db_or_none(text: str | None) -> str | None:
    return None if text is None else to_db(text)


def to_db_all(texts: Iterable[str]) -> list[str]:
    return [to_db(text) for text in texts]


def from_db(stored: str) -> str:
    """The text a stored value holds (the inverse of `to_db`)."""
    if "\x01" not in stored:
        return stored
    return _ESCAPED.sub(lambda m: "\x01" if m[1] == "\x01" else "\x00", stored)


def from_db_or_none(stored: str | None) -> str | None:
    return None if stored is None else from_db(stored)
