"""Gateways sharing a SQLite store: leases, backend owners, fleet keys, file counters
(see `base.GatewayLeases` and `base.BackendOwners`)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence

from comfyfleet.domain.gateways import BackendOwner, GatewayRecord
from comfyfleet.store.base import GatewayIdInUse
from comfyfleet.store.sqlite_parts import backend_owners_sql as backend_owners
from comfyfleet.store.sqlite_parts import file_counters_sql as file_counters
from comfyfleet.store.sqlite_parts import fleet_keys_sql as fleet_keys
from comfyfleet.store.sqlite_parts import leases_sql as leases
from comfyfleet.store.sqlite_parts.access import SQLiteAccess


class SQLiteGateways(SQLiteAccess):
    """Which gateways are alive, and what each of them holds."""

    async def join(
        self, gateway: GatewayRecord, lease: float, *, replace: str | None = None
    ) -> None:
        joining = dataclasses.replace(gateway, id=self.owner, instance=self._instance)
        op = functools.partial(
            leases.join, joining=joining, lease=lease, now=self._clock(), replace=replace
        )
        held = await self._write(op)
        if held is not None:
            raise GatewayIdInUse(
                f"gateway id {self.owner!r} is held by process {held.pid} on {held.host}", held
            )

    async def heartbeat(self, lease: float) -> bool:
        now = self._clock()
        params = (now, now + lease, self.owner, self._instance)
        return await self._write(lambda conn: conn.execute(leases.HEARTBEAT, params).rowcount == 1)

    async def leave(self) -> None:
        params = (self.owner, self._instance)
        await self._write(lambda conn: conn.execute(leases.LEAVE, params))

    async def gateways(self) -> list[GatewayRecord]:
        return await self._read(functools.partial(leases.live, now=self._clock()))

    async def fleet_key(self, name: str, candidate: bytes) -> bytes:
        op = functools.partial(fleet_keys.keep, name=name, candidate=candidate, now=self._clock())
        return await self._write(op)

    async def reserve_file_counter(self, key: str, floor: int, count: int) -> int:
        op = functools.partial(file_counters.reserve, key=key, floor=floor, count=count)
        return await self._write(op)

    async def claim_backends(
        self, offered: Mapping[str, str], limit: int | None = None, *, take_lapsed: bool = True
    ) -> list[BackendOwner]:
        op = functools.partial(
            backend_owners.claim,
            owner=self.owner,
            instance=self._instance,
            offered=list(offered.items()),
            limit=limit,
            now=self._clock(),
            take_lapsed=take_lapsed,
        )
        return await self._write(op)

    async def release_backends(self, names: Sequence[str] | None = None) -> None:
        names = None if names is None else list(names)
        await self._write(functools.partial(backend_owners.release, owner=self.owner, names=names))

    async def backend_owners(self) -> list[BackendOwner]:
        return await self._read(functools.partial(backend_owners.owners, now=self._clock()))
