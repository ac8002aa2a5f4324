"""Tenants' shares over three gateways on one PostgreSQL store: a cap on running prompts
holds fleet-wide, and the slot-time still splits by weight (docs/features/fair-share.md)."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.integration.gateway import processes
from tests.integration.gateway.processes import poll, submit
from tests.integration.gateway.wire import sleep_prompt
from tests.servers import ServerProcess

ALICE = "alice-gateways-token-8c1e"
BOB = "bob-gateways-token-2f9a"
CONFIG = f"""
[[auth.tokens]]
token = "{ALICE}"
tenant = "alice"

[[auth.tokens]]
token = "{BOB}"
tenant = "bob"

[tenants.alice]
max_running = 2
"""


def as_tenant(server: ServerProcess, token: str, path: str) -> Any:
    request = urllib.request.Request(
        server.url + path, headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def running(server: ServerProcess, token: str) -> int:
    """The tenant's running prompts, fleet-wide (the store's count)."""
    found = as_tenant(server, token, "/api/jobs?status=in_progress&limit=1")
    return int(found["pagination"]["total"])


def test_a_cap_on_running_prompts_holds_over_every_gateway(
    tmp_path: Path, postgres_database: str
) -> None:
    config = tmp_path / "fleet.toml"
    config.write_text(CONFIG)
    args = ("--config", str(config), "--local-slots", "2")
    with processes.gateways(tmp_path, postgres_database, 3, *args, token=BOB) as servers:
        alice: list[str] = []
        bob: list[str] = []
        for n in range(18):
            server = servers[n % 3]
            server.token = ALICE
            alice.append(submit(server, sleep_prompt(0.4, n)))
        for n in range(6):
            server = servers[n % 3]
            server.token = BOB
            bob.append(submit(server, sleep_prompt(0.4, 100 + n)))
        seen: list[int] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                seen.append(running(servers[0], ALICE))
                time.sleep(0.02)

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:

            def ended(ids: list[str], token: str) -> bool:
                return all(
                    as_tenant(servers[1], token, f"/api/jobs/{p}")["status"] == "completed"
                    for p in ids
                )

            poll(lambda: ended(bob, BOB), what="bob's prompts", timeout=60)
            assert len([n for n in seen if n > 0]) > 0
            poll(lambda: ended(alice, ALICE), what="alice's prompts", timeout=90)
        finally:
            stop.set()
            sampler.join()
        assert max(seen) == 2, max(seen)  # at her cap, on three gateways of six slots
