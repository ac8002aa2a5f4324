"""Label values: any string may come in, a bounded number of series goes out.

prometheus-client escapes what the text format needs (backslash, quote, newline);
what it cannot write (a lone surrogate, from JSON's `\\ud800`) and very long values
are made safe here. A label whose values grow with use (lanes added and removed at
run time, tenants) keeps its first `limit` values; later ones are counted as `other`,
so a busy gateway's answer stays the same size however long it runs.
"""

from __future__ import annotations

from typing import Any

#: The value every value past a label's limit is counted under.
OTHER = "other"
#: Characters kept of a value.
MAX_LENGTH = 128


def clean(value: str) -> str:
    """`value` as valid UTF-8 (unencodable characters become `?`), at most MAX_LENGTH long."""
    return value[:MAX_LENGTH].encode("utf-8", "replace").decode("utf-8")


class BoundedLabel:
    """The values of one label: the first `limit` distinct ones, then `other`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._seen: set[str] = set()

    def __call__(self, value: str) -> str:
        value = clean(value)
        if value in self._seen:
            return value
        if len(self._seen) < self.limit:
            self._seen.add(value)
            return value
        return OTHER


class Children:
    """A metric's labelled series, each looked up once: prometheus-client's `labels`
    checks and locks on every call, which every job's start and end paid. The label
    values come bounded (BoundedLabel), so the series kept here are too."""

    def __init__(self, metric: Any) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], Any] = {}

    def __call__(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child
