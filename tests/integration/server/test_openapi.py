"""docs/openapi.json describes exactly the routes the server registers, no more, no less."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from comfyfleet.lanes.fleet import URL
from comfyfleet.peers import PEER_ROUTES
from tests.servers import start_in_process

SPEC_PATH = Path(__file__).resolve().parents[3] / "docs" / "openapi.json"
_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


def load_spec() -> dict[str, Any]:
    spec: dict[str, Any] = json.loads(SPEC_PATH.read_text(encoding="utf-8"))
    return spec


def _resolve(spec: dict[str, Any], item: dict[str, Any]) -> dict[str, Any]:
    """A path item, following a local `$ref` (the `/api` aliases point at their route)."""
    while "$ref" in item:
        pointer = item["$ref"].removeprefix("#/").split("/")
        node: Any = spec
        for part in pointer:
            node = node[part.replace("~1", "/").replace("~0", "~")]
        item = node
    return item


def documented_operations(spec: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """(METHOD, path) -> the OpenAPI operation object."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for path, item in spec["paths"].items():
        for method, operation in _resolve(spec, item).items():
            if method in _METHODS:
                out[(method.upper(), path)] = operation
    return out


async def test_spec_matches_registered_routes(tmp_path: Path) -> None:
    spec = load_spec()
    assert spec["openapi"].startswith("3.1")
    server, _gateway = await start_in_process(tmp_path, local_slots=1)
    try:
        registered = {
            (route.method, route.resource.canonical)
            for route in server.app.router.routes()
            # The routes between gateways are no client's: left out of the spec.
            if route.resource is not None and route.resource.canonical not in PEER_ROUTES
        }
    finally:
        await server.close()
    documented = set(documented_operations(spec))
    assert registered - documented == set(), "routes without documentation in docs/openapi.json"
    assert documented - registered == set(), "documented routes the server does not register"


def test_every_operation_is_complete() -> None:
    spec = load_spec()
    ids: list[str] = []
    for (method, path), operation in documented_operations(spec).items():
        assert operation.get("summary"), f"{method} {path}: no summary"
        assert operation.get("responses"), f"{method} {path}: no responses"
        ids.append(operation["operationId"])
        names = {p["name"] for p in operation.get("parameters", []) if p["in"] == "path"}
        assert names == _braces(path), f"{method} {path}: path parameters"
    # Aliases share their operation, so each operationId appears for /x and /api/x.
    assert all(ids.count(i) <= 2 for i in ids)


def _braces(path: str) -> set[str]:
    return {part[1:-1] for part in path.split("/") if part.startswith("{")}


def test_every_reference_resolves() -> None:
    spec = load_spec()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "$ref" in node:
                assert node["$ref"].startswith("#/"), node
                _resolve(spec, {"$ref": node["$ref"]})  # KeyError when dangling
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(spec)


def test_backend_urls_are_described_as_the_server_checks_them() -> None:
    """The spec repeats the server's url pattern: schemathesis generates urls from it."""
    spec = load_spec()
    url = spec["components"]["schemas"]["BackendSpec"]["properties"]["url"]
    assert url["pattern"] == URL.pattern
    body = spec["paths"]["/api/fleet/backends"]["post"]["requestBody"]
    just_the_url = body["content"]["application/json"]["schema"]["oneOf"][1]
    assert just_the_url["pattern"] == URL.pattern
