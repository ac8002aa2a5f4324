"""The fleet admin API: backends added, refused, redacted, persisted and removed."""

from __future__ import annotations

import json
import time
import urllib.request

from tests.integration.fleet.conftest import MakeFleet
from tests.integration.fleet.harness import call, sleep_prompt
from tests.servers import ServerProcess

SECRET = "sekrit-value-123"


def raw_listing(fleet_url: str) -> str:
    with urllib.request.urlopen(f"{fleet_url}/api/fleet/backends", timeout=10) as response:
        body: bytes = response.read()
    return body.decode()


def test_backends_added_at_run_time_are_persisted_redacted_and_removable(
    make_fleet: MakeFleet, backend_pool: list[ServerProcess]
) -> None:
    fleet = make_fleet(shared=1, flags=True)  # the first backend comes from --backend URL
    (first,) = fleet.backends
    assert first == f"127.0.0.1-{backend_pool[0].port}"
    added = backend_pool[1]
    url = fleet.gateway.url

    status, body = call(
        url,
        "POST",
        "/api/fleet/backends",
        {
            "url": added.url,
            "name": "extra",
            "tags": ["gpu"],
            "auth_header": f"X-Fleet-Token: {SECRET}",
        },
    )
    assert status == 201, body
    assert (body["name"], body["url"], body["tags"]) == ("extra", added.url, ["gpu"])
    assert body["auth_header"] == "X-Fleet-Token: ***"
    assert "memory only" in body["warning"]  # a literal secret is never stored
    assert SECRET not in json.dumps(body)
    fleet.backends["extra"] = added
    fleet.wait_states({"extra": "up", first: "up"})

    # It takes work: two prompts at once run on both backends.
    ids = [fleet.submit(sleep_prompt(0.5, color)) for color in range(2)]
    for prompt_id in ids:
        fleet.wait_job(prompt_id, "completed")
    assert {fleet.lane_of(p) for p in ids} == {first, "extra"}

    # Refused: a bad url, a bad name, a name taken (at run time or by --backend).
    for bad in ({"url": "ftp://example.com"}, {"url": "not a url"}, {"name": "x"}):
        status, body = call(url, "POST", "/api/fleet/backends", bad)
        assert (status, body["error"]["type"]) == (400, "invalid_backend"), bad
    status, body = call(url, "POST", "/api/fleet/backends", {"url": added.url, "name": "a b"})
    assert status == 400
    for name in ("extra", first):
        status, body = call(url, "POST", "/api/fleet/backends", {"url": added.url, "name": name})
        assert (status, body["error"]["type"]) == (409, "backend_exists"), name

    listing = fleet.backend_states()
    assert set(listing) == {first, "extra"}
    assert listing["extra"]["auth_header"] == "X-Fleet-Token: ***"
    assert SECRET not in raw_listing(url)

    # Persisted: back after a restart, and up by itself; its literal auth header was
    # never written to the store, so it is gone (a header given as env:NAME would stay).
    fleet.restart_gateway(kill=True)
    fleet.wait_states({"extra": "up", first: "up"})
    assert "auth_header" not in fleet.backend_states()["extra"]
    assert SECRET not in raw_listing(fleet.gateway.url)
    for path in fleet.gateway.data_dir.rglob("*.db*"):
        assert SECRET.encode() not in path.read_bytes(), path

    started = time.monotonic()
    status, body = call(fleet.gateway.url, "DELETE", "/api/fleet/backends/extra?timeout=5")
    assert (status, body) == (200, {"removed": "extra"})
    assert time.monotonic() - started < 3.0  # idle slots leave at once
    del fleet.backends["extra"]
    assert set(fleet.backend_states()) == {first}
    # The other backend's slots are untouched: it still takes work.
    prompt_id = fleet.submit(sleep_prompt(0.1, 7))
    fleet.wait_job(prompt_id, "completed")
    assert fleet.lane_of(prompt_id) == first
    status, _ = call(fleet.gateway.url, "DELETE", "/api/fleet/backends/extra")
    assert status == 404

    # And gone for good.
    fleet.restart_gateway(kill=True)
    fleet.wait_states({first: "up"})
    assert set(fleet.backend_states()) == {first}
    one = fleet.submit(sleep_prompt(0.1, 7))
    assert fleet.wait_job(one, "completed")["lane"] == f"backend:{first}"
