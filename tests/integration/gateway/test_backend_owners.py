"""Several gateways on one PostgreSQL store, configured with the same ComfyUI backends:
each backend is dispatched by exactly one of them (checked on the backend's side), and
when its owner is killed another takes it over with what runs there."""

from __future__ import annotations

import itertools
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager as ContextManager
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.integration.gateway import processes
from tests.integration.gateway.processes import Frames, job, poll, submit
from tests.integration.gateway.queue_backend import QueueBackend
from tests.integration.gateway.wire import sleep_prompt
from tests.servers import ServerProcess

LEASE = 2.0
#: The takeover proof: prompts in flight when a gateway is killed, each this short.
IN_FLIGHT = 300
RUN_SECONDS = 0.1


@contextmanager
def backends(count: int) -> Iterator[list[QueueBackend]]:
    started = [QueueBackend(name=f"b{n}").start() for n in range(count)]
    try:
        yield started
    finally:
        for backend in started:
            backend.stop()


def gateways(
    tmp_path: Path, url: str, count: int, served: list[QueueBackend]
) -> ContextManager[list[ServerProcess]]:
    urls = [arg for backend in served for arg in ("--backend", backend.url)]
    return processes.gateways(tmp_path, url, count, "--local-slots", "0", *urls, lease=LEASE)


def owned(server: ServerProcess) -> dict[str, list[str]]:
    listed = server.get("/api/fleet/gateways")["gateways"]
    return {entry["id"]: entry["backends"] for entry in listed}


def spread(server: ServerProcess, gateways: int, per_gateway: int) -> dict[str, list[str]]:
    """Once each live gateway owns `per_gateway` backends (and every one is up there)."""

    def settled() -> bool:
        found = owned(server)
        if len(found) != gateways or any(len(b) != per_gateway for b in found.values()):
            return False
        listed = server.get("/api/fleet/backends")["backends"]
        return all(b["state"] in ("up", "elsewhere") and b["owner"] for b in listed)

    poll(settled, what="the backends to be spread", timeout=30)
    return owned(server)


def backend_named(served: list[QueueBackend], name: str) -> QueueBackend:
    return next(b for b in served if b.url.endswith(name.rsplit("-", 1)[1]))


def finished(server: ServerProcess, ids: list[str]) -> list[str]:
    history = server.get("/history")
    return [prompt_id for prompt_id in ids if prompt_id in history]


def ran_once_each(served: list[QueueBackend], ids: list[str]) -> None:
    """Each prompt sent once, to one backend, and run there once."""
    sent = [prompt_id for backend in served for _, _, prompt_id in backend.submits]
    assert sorted(sent) == sorted(ids)
    runs: dict[str, int] = {}
    for backend in served:
        for prompt_id, count in backend.runs.items():
            runs[prompt_id] = runs.get(prompt_id, 0) + count
    assert runs == dict.fromkeys(ids, 1)


def test_three_gateways_each_dispatch_to_their_own_backend(
    tmp_path: Path, postgres_database: str
) -> None:
    with backends(3) as served, gateways(tmp_path, postgres_database, 3, served) as servers:
        owners = spread(servers[2], 3, 1)
        clients = [Frames(server) for server in servers]
        try:
            ids: list[str] = []
            for n, (server, frames) in zip(range(30), itertools.cycle(zip(servers, clients))):
                ids.append(submit(server, sleep_prompt(0.1, n), frames.client_id))
            poll(lambda: len(finished(servers[0], ids)) == 30, what="every prompt", timeout=90)
        finally:
            for frames in clients:
                frames.close()
        ran_once_each(served, ids)
        # Each backend heard from its owner alone: prompts, and the one socket open there.
        for gateway_id, names in owners.items():
            backend = backend_named(served, names[0])
            assert backend.submitters() == [gateway_id]
            assert backend.open_sockets() == [gateway_id]
        assert all(job(servers[1], p)["gateway"] in owners for p in ids)
        # Any gateway lists every backend with its owner; one it does not own is elsewhere.
        listed = servers[0].get("/api/fleet/backends")["backends"]
        assert sorted(b["owner"] for b in listed) == ["gw-0", "gw-1", "gw-2"]
        assert [b["state"] for b in listed].count("elsewhere") == 2
        # The dashboard says the same; metrics cover only the backends a gateway owns (a
        # backend another gateway dispatches to is not down here).
        lanes = servers[0].get("/api/fleet/status")["lanes"]
        states = {lane["backend"]: lane["state"] for lane in lanes if lane["kind"] == "backend"}
        assert states == {b["name"]: b["state"] for b in listed}
        reported = backend_up_metrics(servers[0])
        assert reported == {b["name"]: 1.0 for b in listed if b["owner"] == "gw-0"}
        # A backend added through one gateway reaches all, owned by one; removed through
        # another, it is gone from all.
        with backends(1) as (extra,):
            servers[0].post("/api/fleet/backends", {"url": extra.url, "name": "extra"})

            def everywhere(present: bool) -> bool:
                for server in servers:
                    found = [b for b in backend_list(server) if b["name"] == "extra"]
                    if bool(found) != present or (present and not found[0]["owner"]):
                        return False
                return True

            poll(lambda: everywhere(True), what="the added backend on every gateway")
            owner = next(b["owner"] for b in backend_list(servers[1]) if b["name"] == "extra")
            assert sum(1 for g in owned(servers[1]).values() if "extra" in g) == 1
            delete(servers[2], "/api/fleet/backends/extra?timeout=5")
            poll(lambda: everywhere(False), what="the removed backend gone from every gateway")
            assert extra.open_sockets() in ([], [owner])


def test_a_killed_owners_backend_and_prompts_are_taken_over(
    tmp_path: Path, postgres_database: str
) -> None:
    with backends(2) as served, gateways(tmp_path, postgres_database, 2, served) as servers:
        doomed, survivor = servers
        owners = spread(survivor, 2, 1)
        orphaned = backend_named(served, owners["gw-0"][0])
        frames = Frames(survivor)
        try:
            # Sent 16 at a time, so that most are still in flight at the kill.
            def send(n: int) -> str:
                if n % 2:
                    return submit(survivor, sleep_prompt(RUN_SECONDS, n), frames.client_id)
                return submit(doomed, sleep_prompt(RUN_SECONDS, n))

            with ThreadPoolExecutor(16) as pool:
                ids = list(pool.map(send, range(IN_FLIGHT)))
            theirs = ids[1::2]
            poll(lambda: len(orphaned.runs) >= 3, what="the doomed gateway's backend to work")
            doomed.kill()
            killed_at = time.time()
            assert len(finished(survivor, ids)) < IN_FLIGHT // 5  # nearly all in flight
            poll(
                lambda: len(finished(survivor, ids)) == IN_FLIGHT, what="every prompt", timeout=120
            )
            records = {p: job(survivor, p) for p in ids}
            # The survivor's client sees each of its prompts that the survivor ran end.
            run_here = [p for p in theirs if records[p]["gateway"] == "gw-1"]
            assert all("execution_success" in reached(frames, p) for p in run_here)
        finally:
            frames.close()
        history = survivor.get("/history")
        assert all(history[p]["status"]["status_str"] == "success" for p in ids)
        ran_once_each(served, ids)  # nothing lost, nothing run twice
        assert orphaned.interrupts == []
        # The orphaned backend: the killed gateway's, then the survivor's, never both.
        assert orphaned.submitters() in (["gw-0"], ["gw-0", "gw-1"])
        assert orphaned.open_sockets() == ["gw-1"]
        connected = [at for at, gateway in orphaned.sockets if gateway == "gw-1"]
        assert connected and connected[0] - killed_at <= LEASE + 2.0
        # What the killed gateway had sent there was adopted (attempt 2) and followed.
        adopted = [p for p, record in records.items() if record["attempt"] > 1]
        assert adopted and all(records[p]["gateway"] == "gw-1" for p in adopted)
        assert all(records[p]["attempt"] == 2 for p in adopted)
        assert owned(survivor) == {"gw-1": sorted(b["name"] for b in backend_list(survivor))}


def delete(server: ServerProcess, path: str) -> None:
    request = urllib.request.Request(server.url + path, method="DELETE")
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200


def backend_list(server: ServerProcess) -> list[dict[str, Any]]:
    listed: list[dict[str, Any]] = server.get("/api/fleet/backends")["backends"]
    return listed


def reached(frames: Frames, prompt_id: str) -> list[str]:
    """The event types of the prompt its client got, up to its done signal (read on)."""
    if not any(
        e["type"] == "executing"
        and e["data"]["node"] is None
        and e["data"]["prompt_id"] == prompt_id
        for e in frames.events
    ):
        frames.done(prompt_id)
    return frames.types(prompt_id)


def backend_up_metrics(server: ServerProcess) -> dict[str, float]:
    request = urllib.request.Request(server.url + "/metrics")
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read().decode()
    return {
        sample.labels["backend"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "comfyfleet_backend_up"
        for sample in family.samples
    }
