"""Which gateway dispatches to each ComfyUI backend."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from comfyfleet.domain.gateways import BackendOwner


class BackendOwners(Protocol):
    """Each ComfyUI backend is dispatched by one gateway at a time: the one whose name
    its row holds, while that gateway's lease (`GatewayLeases`) holds. No heartbeat of
    its own: once a gateway's lease runs out, its backends are free with its jobs."""

    async def claim_backends(
        self, offered: Mapping[str, str], limit: int | None = None, *, take_lapsed: bool = True
    ) -> list[BackendOwner]:
        """Take for this gateway, in the order of `offered` (backend name -> the client
        id it gets if the store has none for it yet), the backends no live gateway owns,
        at most `limit` of them (None: every one). Atomic: two gateways never both get
        one. Fenced: nothing is taken while this gateway's own lease is out. With
        `take_lapsed` false, only backends no gateway owns (never claimed, or released)
        are taken, not those of a gateway whose lease ran out: it may be alive and about
        to renew (see scheduler/lease.py). Returns every offered backend this gateway
        owns afterwards, with its client id."""

    async def release_backends(self, names: Sequence[str] | None = None) -> None:
        """Give up this gateway's ownership of `names` (None: all of them); their rows
        and client ids stay for the next owner."""

    async def backend_owners(self) -> list[BackendOwner]:
        """Every backend ever claimed, by name; `owner` is None when it is free."""
