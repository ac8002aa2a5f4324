"""Comfy API v2 assets: a tenant's named references to bytes kept by their blake3 hash."""

from __future__ import annotations

from typing import Protocol

from comfyfleet.domain.assets import AssetRecord


class AssetRecords(Protocol):
    """Asset records by tenant and id, and by the hash of their bytes."""

    async def add_asset(self, record: AssetRecord) -> AssetRecord:
        """Record an asset; returned with `created_at` set by the store's clock."""

    async def asset(self, tenant: str, asset_id: str) -> AssetRecord | None:
        """The tenant's asset of this id (None for another tenant's)."""

    async def asset_by_hash(self, tenant: str, digest: str) -> AssetRecord | None:
        """The tenant's oldest asset over the bytes of this hash, None when it has none."""

    async def delete_asset(self, tenant: str, asset_id: str) -> bool:
        """Forget the tenant's asset; False when there was none."""
