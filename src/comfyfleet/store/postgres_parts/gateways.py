"""Gateways sharing a PostgreSQL store: leases, backend owners, fleet keys, file
counters (see `base.GatewayLeases` and `base.BackendOwners`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from comfyfleet.domain.gateways import BackendOwner, GatewayRecord
from comfyfleet.store.base import GatewayIdInUse
from comfyfleet.store.postgres_parts import backend_owners_sql as backend_owners
from comfyfleet.store.postgres_parts import fleet_keys_sql as fleet_keys
from comfyfleet.store.postgres_parts.access import PostgresAccess, Q
from comfyfleet.store.postgres_text import from_db, to_db


class PostgresGateways(PostgresAccess):
    """Which gateways are alive, and what each of them holds."""

    async def join(
        self, gateway: GatewayRecord, lease: float, *, replace: str | None = None
    ) -> None:
        now = self._clock()

        async def join(conn: Any) -> Any:
            held = await conn.fetchrow(Q["gateway_holder"], self._owner_db)
            if held is not None and held[1] not in (self._instance, replace) and held[7] >= now:
                return held
            await conn.execute(
                Q["upsert_gateway"],
                self._owner_db,
                self._instance,
                to_db(gateway.host),
                gateway.pid,
                to_db(gateway.url),
                gateway.started_at,
                now,
                now + lease,
            )
            return None

        held = await self._write(join)
        if held is not None:
            holder = _gateway(held)
            raise GatewayIdInUse(
                f"gateway id {self.owner!r} is held by process {holder.pid} on {holder.host}",
                holder,
            )

    async def heartbeat(self, lease: float) -> bool:
        now = self._clock()
        params = (self._owner_db, self._instance, now, now + lease)
        status = await self._commit(lambda db: db.execute(Q["heartbeat"], *params))
        return bool(status == "UPDATE 1")

    async def leave(self) -> None:
        await self._commit(lambda db: db.execute(Q["leave"], self._owner_db, self._instance))

    async def gateways(self) -> list[GatewayRecord]:
        rows = await self._run(lambda db: db.fetch(Q["live_gateways"], self._clock()))
        return [_gateway(row, row[8]) for row in rows]

    async def fleet_key(self, name: str, candidate: bytes) -> bytes:
        now = self._clock()
        return await self._write(lambda conn: fleet_keys.keep(conn, to_db(name), candidate, now))

    async def reserve_file_counter(self, key: str, floor: int, count: int) -> int:
        params = (to_db(key), floor, count)
        return int(await self._commit(lambda db: db.fetchval(Q["reserve_file_counter"], *params)))

    async def claim_backends(
        self, offered: Mapping[str, str], limit: int | None = None, *, take_lapsed: bool = True
    ) -> list[BackendOwner]:
        return await self._write(
            lambda conn: backend_owners.claim(
                conn,
                self.owner,
                self._instance,
                list(offered.items()),
                limit,
                self._clock(),
                take_lapsed,
            )
        )

    async def release_backends(self, names: Sequence[str] | None = None) -> None:
        names = None if names is None else list(names)
        await self._commit(lambda db: backend_owners.release(db, self.owner, names))

    async def backend_owners(self) -> list[BackendOwner]:
        return await self._run(lambda db: backend_owners.owners(db, self._clock()))


def _gateway(row: Sequence[Any], running: int = 0) -> GatewayRecord:
    host, url = from_db(row[2]), from_db(row[4])
    return GatewayRecord(
        from_db(row[0]), row[1], host, row[3], url, row[5], row[6], row[7], running
    )
