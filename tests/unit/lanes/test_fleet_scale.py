"""A fleet of many backends with the same nodes: their object_info is parsed once and
kept once, a refresh that finds nothing new changes nothing, the node union is built
once for a burst of lanes changing together, and a capability check of one prompt is
made once for all the lanes that share the capabilities."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from comfyfleet.engine.executor import Engine
from comfyfleet.folders import Folders
from comfyfleet.lanes.backend import BackendSpec
from comfyfleet.lanes.capabilities import KnownCapabilities
from comfyfleet.lanes.fleet import Fleet
from comfyfleet.lanes.settings import LaneSettings
from comfyfleet.nodes import build_registry
from comfyfleet.tenants import TenantFolders
from tests.unit.lanes.test_capabilities import INFO, prompt

RAW = json.dumps(INFO).encode()


async def test_the_same_object_info_is_read_once_for_every_lane() -> None:
    known = KnownCapabilities()
    key = KnownCapabilities.key(RAW, {})
    together = await asyncio.gather(*(known.of(key, RAW, {}) for _ in range(100)))
    assert all(found is together[0] for found in together)  # one parse, shared
    assert await known.of(key, RAW, {}) is together[0]
    other = KnownCapabilities.key(RAW, {"checkpoints": ["x.safetensors"]})
    assert await known.of(other, RAW, {"checkpoints": ["x.safetensors"]}) is not together[0]


async def test_a_capability_check_of_one_prompt_is_made_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    known = KnownCapabilities()
    capabilities = await known.of(KnownCapabilities.key(RAW, {}), RAW, {})
    checked = prompt()
    assert capabilities.can_run(checked)
    checked_calls = 0
    missing_for = capabilities.missing_for

    def counted(p: dict[str, Any]) -> list[str]:
        nonlocal checked_calls
        checked_calls += 1
        return missing_for(p)

    monkeypatch.setattr(capabilities, "missing_for", counted)
    assert all(capabilities.can_run(checked) for _ in range(1_000))
    assert checked_calls == 0
    assert not capabilities.can_run(prompt(ckpt="other.safetensors"))  # another prompt
    assert checked_calls == 1


async def test_lanes_changing_together_build_the_node_union_once_more(tmp_path: Path) -> None:
    engine = Engine(build_registry(), Folders.under(tmp_path / "data"))
    tenants = TenantFolders(engine.folders, tmp_path / "tenants")
    fleet = Fleet(engine, tenants, 0, LaneSettings())
    try:
        known = KnownCapabilities()
        shared = await known.of(KnownCapabilities.key(RAW, {}), RAW, {})
        for k in range(200):
            lane = fleet.backend_lane(BackendSpec(f"http://127.0.0.1:{9000 + k}", f"b{k}"))
            lane.capabilities = shared
        builds = 0
        build = fleet._build

        async def counted() -> None:
            nonlocal builds
            builds += 1
            await build()

        fleet._build = counted  # type: ignore[method-assign]
        await asyncio.gather(*(fleet.rebuild() for _ in range(200)))
        assert builds == 1  # all asked before it read the lanes
        assert "CheckpointLoaderSimple" in fleet.registry.nodes

        first = asyncio.create_task(fleet.rebuild())
        while builds < 2:  # the build has begun: it read the lanes
            await asyncio.sleep(0)
        meanwhile = [asyncio.create_task(fleet.rebuild()) for _ in range(200)]
        await asyncio.gather(first, *meanwhile)
        assert builds == 3  # one more for all that changed while it was built
    finally:
        await fleet.close()
        engine.close()


async def test_a_refresh_that_finds_the_same_nodes_changes_nothing(tmp_path: Path) -> None:
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    served = {"object_info": RAW}

    async def object_info(_request: web.Request) -> web.Response:
        return web.Response(body=served["object_info"], content_type="application/json")

    async def models(_request: web.Request) -> web.Response:
        return web.json_response([])

    app = web.Application()
    app.router.add_get("/object_info", object_info)
    app.router.add_get("/models", models)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    engine = Engine(build_registry(), Folders.under(tmp_path / "data"))
    fleet = Fleet(engine, TenantFolders(engine.folders, tmp_path / "t"), 0, LaneSettings())
    try:
        spec = BackendSpec(f"http://127.0.0.1:{server.port}", "b")
        lane = fleet.backend_lane(spec)
        assert await lane._refresh()  # new: the union is built anew
        first = lane.capabilities
        assert not await lane._refresh()  # the same bytes: nothing to build
        assert lane.capabilities is first
        served["object_info"] = json.dumps({**INFO, "Extra": INFO["ModelSink"]}).encode()
        assert await lane._refresh()
        assert "Extra" in lane.capabilities.object_info
    finally:
        await fleet.close()
        await server.close()
        engine.close()
