"""Process services that node code may use (a journal, shared pools, secrets).

Node classes follow ComfyUI's protocol (no constructor arguments), so the engine
cannot hand them what they need directly: it publishes its services in a context
variable around every run, like its folders, and concurrent engines (in tests) stay
apart. Each service is reached by a typed key that the package providing it defines
(`ServiceKey[FanoutService]`, ...), so a lookup says what it returns and the engine
needs to know none of those packages.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Generic, TypeVar, cast

T = TypeVar("T")


class ServiceKey(Generic[T]):
    """The name of one service, and the type of what it names."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"ServiceKey({self.name!r})"


class Services:
    """An engine's services: at most one per key."""

    def __init__(self) -> None:
        self._found: dict[ServiceKey[object], object] = {}

    def add(self, key: ServiceKey[T], service: T) -> None:
        self._found[cast(ServiceKey[object], key)] = service

    def get(self, key: ServiceKey[T]) -> T | None:
        return cast("T | None", self._found.get(cast(ServiceKey[object], key)))

    def update(self, other: Services) -> None:
        self._found.update(other._found)


_current: ContextVar[Services | None] = ContextVar("comfyfleet_services", default=None)


def service(key: ServiceKey[T]) -> T:
    """The service under `key` for the running engine."""
    found = optional_service(key)
    if found is None:
        raise LookupError(f"no {key.name!r} service is configured for this engine")
    return found


def optional_service(key: ServiceKey[T]) -> T | None:
    services = _current.get()
    return None if services is None else services.get(key)


@contextlib.contextmanager
def using_services(services: Services) -> Iterator[None]:
    token = _current.set(services)
    try:
        yield
    finally:
        _current.reset(token)
