"""Process services that node code may use (a journal, shared pools, secrets).

The engine publishes its services in a context variable around every run, like
its folders, so nodes reach them without globals and concurrent engines (in
tests) stay apart. A service is looked up by name; a node that needs one that
is missing gets a clear error.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any

_current: ContextVar[Mapping[str, Any] | None] = ContextVar("comfyfleet_services", default=None)


def service(name: str) -> Any:
    """The service registered under `name` for the running engine."""
    found = optional_service(name)
    if found is None:
        raise LookupError(f"no {name!r} service is configured for this engine")
    return found


def optional_service(name: str) -> Any | None:
    return (_current.get() or {}).get(name)


@contextlib.contextmanager
def using_services(services: Mapping[str, Any]) -> Iterator[None]:
    token = _current.set(services)
    try:
        yield
    finally:
        _current.reset(token)
