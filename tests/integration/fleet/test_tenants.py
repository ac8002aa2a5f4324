"""Tenants on a ComfyUI backend: their uploads are pushed apart, their outputs copied back
into their own folders (an in-process gateway with auth feeding an in-process backend)."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from PIL import Image

from tests.integration.gateway.test_auth import (
    ALICE,
    BOB,
    ROOT,
    TOKENS,
    as_tenant,
    load_and_save,
    upload,
    view_status,
)
from tests.integration.gateway.wire import Served, poll, serve
from tests.servers import start_in_process


def png(color: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (4, 4), color).save(out, format="PNG")
    return out.getvalue()


@asynccontextmanager
async def shared_backend(tmp_path: Path) -> AsyncIterator[tuple[Served, Served, Served]]:
    """(root, alice, bob): the tenants of a gateway with auth feeding one backend."""
    backend, _backend_gateway = await start_in_process(tmp_path / "backend", local_slots=1)
    backend_url = f"http://127.0.0.1:{backend.port}"
    try:
        async with serve(
            tmp_path / "gateway",
            local_slots=0,
            backends=({"url": backend_url, "name": "gpu"},),
            auth_tokens=TOKENS,
        ) as served:
            clients = (
                as_tenant(served, ROOT),
                as_tenant(served, ALICE),
                as_tenant(served, BOB),
            )
            try:

                async def backend_up() -> bool:
                    listed = await clients[0].get("/api/fleet/backends")
                    return [b["state"] for b in listed["backends"]] == ["up"]

                await poll(backend_up, what="the backend up")
                yield clients
            finally:
                for client in clients:
                    for sock in client.sockets:
                        await sock.close()
                    await client.session.close()
    finally:
        await backend.close()


async def saved_color(client: Served, tenants_dir: Path, tenant: str, job: str) -> Any:
    entry = await client.history_entry(job)
    assert entry["status"]["completed"], entry
    [saved] = entry["outputs"]["2"]["images"]
    local = tenants_dir / tenant / "output" / saved["subfolder"] / saved["filename"]
    with Image.open(local) as picture:  # copied back into the tenant's folder
        return picture.convert("RGB").getpixel((1, 1))


async def test_tenants_files_stay_apart_on_a_shared_backend(tmp_path: Path) -> None:
    async with shared_backend(tmp_path) as (_root, alice, bob):
        # Both tenants upload a different picture under the same name.
        for client, color in ((alice, (250, 0, 0)), (bob, (0, 0, 250))):
            assert (await upload(client, "same.png", png(color)))["name"] == "same.png"
        sock_a, sock_b = await alice.connect(), await bob.connect()
        job_a = await alice.submit(load_and_save("same.png", "a/out"), sock_a.client_id)
        job_b = await bob.submit(load_and_save("same.png", "b/out"), sock_b.client_id)
        await sock_a.done(job_a)
        await sock_b.done(job_b)

        tenants_dir = tmp_path / "gateway" / "tenants"
        for client, job, color, tenant in (
            (alice, job_a, (250, 0, 0), "alice"),
            (bob, job_b, (0, 0, 250), "bob"),
        ):
            assert await saved_color(client, tenants_dir, tenant, job) == color
            assert (await client.job(job))["lane"] == "backend:gpu"
            [pushed] = (tmp_path / "backend" / "input" / "_tenants" / tenant).glob("*/same.png")
            with Image.open(pushed) as picture:
                assert picture.convert("RGB").getpixel((1, 1)) == color
            entry = await client.history_entry(job)
            [saved] = entry["outputs"]["2"]["images"]
            view = f"/view?filename={saved['filename']}&subfolder={saved['subfolder']}"
            assert await view_status(client, view) == 200
            other = bob if client is alice else alice
            assert await view_status(other, view) == 404
        # Files kept on a backend are no tenant's: /view never fetches them there.
        reference = "/view?filename=same.png&type=input&subfolder=@gpu/_tenants/alice"
        assert await view_status(bob, reference) == 404
        assert not (tmp_path / "backend" / "input" / "same.png").exists()


async def test_no_tenant_can_name_another_tenants_files_on_a_shared_backend(
    tmp_path: Path,
) -> None:
    blue, red = (0, 0, 250), (250, 0, 0)
    async with shared_backend(tmp_path) as (root, _alice, bob):
        sock_b, sock_root = await bob.connect(), await root.connect()
        await upload(bob, "x.png", png(blue))
        first = await bob.submit(load_and_save("x.png", "b/first"), sock_b.client_id)
        await sock_b.done(first)

        # `default` uploads into its own subfolder named like bob's place on the backend,
        # and loads it from there: that must not land on bob's copy.
        await upload(root, "x.png", png(red), subfolder="_tenants/bob")
        theirs = await root.submit(
            load_and_save("_tenants/bob/x.png", "r/out"), sock_root.client_id
        )
        await sock_root.done(theirs)
        assert (await root.history_entry(theirs))["status"]["completed"]

        again = await bob.submit(load_and_save("x.png", "b/again"), sock_b.client_id)
        await sock_b.done(again)
        tenants_dir = tmp_path / "gateway" / "tenants"
        assert await saved_color(bob, tenants_dir, "bob", again) == blue

        # What `default` loaded went to its own place on the backend.
        [mine] = (tmp_path / "backend" / "input" / "_tenants" / "default").glob("*/x.png")
        with Image.open(mine) as picture:
            assert picture.convert("RGB").getpixel((1, 1)) == red
