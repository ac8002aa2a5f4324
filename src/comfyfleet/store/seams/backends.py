"""Backends added at run time (the admin API), kept by the store."""

from __future__ import annotations

from typing import Any, Protocol


class RunTimeBackends(Protocol):
    """Backend specs by name, in the order they were added."""

    async def backends(self) -> list[dict[str, Any]]:
        """Backend specs added at run time, in the order they were added."""

    async def save_backend(self, name: str, spec: dict[str, Any]) -> None:
        """Add or replace a backend spec."""

    async def delete_backend(self, name: str) -> bool:
        """Forget a backend (and its owner: see `BackendOwners`); False when it was not there."""
