"""Cancelling a job another gateway runs: two `comfyfleet serve` processes on one
PostgreSQL store. A cancel (v2, the jobs API, `/interrupt` with an id) received by one
gateway for a job the other runs is passed to that gateway with a signed request; the
route between them takes only the fleet's signature, and a dead owner does not hang it.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import pytest

from comfyfleet.peers.signing import PEER_CANCEL_ROUTE, signed_headers
from tests.integration.gateway.processes import job, poll, submit
from tests.integration.gateway.test_peer_files import TOKEN, shared_key, two_gateways
from tests.integration.gateway.wire import sleep_prompt
from tests.servers import ServerProcess


@pytest.fixture
def pair(tmp_path: Path, postgres_database: str) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """gw-a runs nothing (no engine slot), so every job runs on gw-b."""
    with ExitStack() as stack:
        yield two_gateways(stack, tmp_path, postgres_database, a_args=("--local-slots", "0"))


def call(
    server: ServerProcess,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30,
) -> tuple[int, Any]:
    """(status, JSON body or None) of one request, as the user of TOKEN unless `headers`."""
    sent = {"Authorization": f"Bearer {TOKEN}"} if headers is None else headers
    data = None if body is None else json.dumps(body).encode()
    if data is not None:
        sent = {**sent, "Content-Type": "application/json"}
    request = urllib.request.Request(server.url + path, data=data, headers=sent, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
            return int(response.status), json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        with exc:
            raw = exc.read()
            try:
                return exc.code, json.loads(raw) if raw else None
            except ValueError:
                return exc.code, None


def running_on_b(a: ServerProcess, b: ServerProcess, prompt: dict[str, Any]) -> str:
    """A prompt queued through b, seen running on b from a."""
    prompt_id = submit(b, prompt)
    poll(lambda: job(a, prompt_id)["status"] == "in_progress", what="running")
    assert job(a, prompt_id)["gateway"] == "gw-b"
    return prompt_id


def ended_as(server: ServerProcess, prompt_id: str, status: str, within: float) -> dict[str, Any]:
    poll(lambda: job(server, prompt_id)["status"] != "in_progress", what="ended", timeout=within)
    found = job(server, prompt_id)
    assert found["status"] == status, found
    return found


def test_a_v2_cancel_through_one_gateway_stops_the_job_the_other_runs(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = pair
    prompt_id = running_on_b(a, b, sleep_prompt(60.0, 1))
    started = time.monotonic()
    status, body = call(a, "POST", f"/api/v2/jobs/{prompt_id}/cancel")
    assert status == 200
    assert body["id"] == prompt_id and body["status"] in ("canceling", "canceled")
    poll(
        lambda: call(a, "GET", f"/api/v2/jobs/{prompt_id}")[1]["status"] == "canceled",
        what="canceled",
        timeout=10,
    )
    assert time.monotonic() - started < 10
    assert call(a, "POST", f"/api/v2/jobs/{prompt_id}/cancel")[1]["status"] == "canceled"
    time.sleep(1.0)  # nothing runs it again
    found = job(a, prompt_id)
    assert found["status"] == "cancelled" and found["attempt"] == 1 and found["gateway"] == "gw-b"
    entry = a.get(f"/history/{prompt_id}")[prompt_id]
    kinds = [message[0] for message in entry["status"]["messages"]]
    assert "execution_interrupted" in kinds


def test_the_jobs_api_cancel_and_interrupt_reach_the_other_gateway(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = pair
    first = running_on_b(a, b, sleep_prompt(60.0, 2))
    assert a.post(f"/api/jobs/{first}/cancel", {}) == {"cancelled": [first]}
    assert ended_as(a, first, "cancelled", within=10)["attempt"] == 1

    second = running_on_b(a, b, sleep_prompt(60.0, 3))
    assert a.post("/api/jobs/cancel", {"job_ids": [second]}) == {"cancelled": [second]}
    ended_as(a, second, "cancelled", within=10)

    third = running_on_b(a, b, sleep_prompt(60.0, 4))
    a.post("/interrupt", {"prompt_id": third})
    ended_as(a, third, "interrupted", within=10)  # as a local interrupt ends it
    entry = a.get(f"/history/{third}")[third]
    assert entry["status"]["status_str"] == "error"


def peer_target(**query: str) -> str:
    return f"{PEER_CANCEL_ROUTE}?{urlencode(query, quote_via=quote)}"


def test_the_cancel_route_between_gateways_takes_only_the_fleets_signature(
    pair: tuple[ServerProcess, ServerProcess], postgres_database: str
) -> None:
    a, b = pair
    prompt_id = running_on_b(a, b, sleep_prompt(60.0, 5))
    target = peer_target(tenant="default", prompt_id=prompt_id, how="cancel")

    def signed(path: str = target, gateway: str = "gw-a", **kw: Any) -> int:
        key = kw.get("key") or shared_key(postgres_database)
        at = kw.get("at", time.time())
        return call(b, "POST", path, headers=signed_headers(key, gateway, "POST", path, at))[0]

    assert call(b, "POST", target, headers={})[0] == 403  # nothing signed
    assert call(b, "POST", target)[0] == 403  # a user's token
    # The fleet's key is made by the first gateway that needs it: a's first cancel.
    assert call(a, "POST", f"/api/v2/jobs/{prompt_id}/cancel")[0] == 200
    ended_as(a, prompt_id, "cancelled", within=10)

    other = running_on_b(a, b, sleep_prompt(60.0, 7))
    target = peer_target(tenant="default", prompt_id=other, how="cancel")
    assert signed(target, key=b"x" * 32) == 403  # another key
    assert signed(target, at=time.time() - 120) == 403  # too old
    assert signed(target, gateway="gw-b") == 403  # b's own id
    assert signed(target, gateway="gw-zz") == 403  # no live gateway
    assert signed(peer_target(tenant="bob", prompt_id=other, how="cancel")) == 200  # not bob's
    assert signed(peer_target(tenant="default", prompt_id=other, how="explode")) == 400
    time.sleep(0.5)
    assert job(a, other)["status"] == "in_progress"  # none of these touched it
    assert signed(target) == 200
    ended_as(a, other, "cancelled", within=10)


def test_a_dead_owner_does_not_hang_the_cancel(pair: tuple[ServerProcess, ServerProcess]) -> None:
    a, b = pair
    warm = running_on_b(a, b, sleep_prompt(60.0, 8))
    assert a.post(f"/api/jobs/{warm}/cancel", {}) == {"cancelled": [warm]}  # the key exists
    ended_as(a, warm, "cancelled", within=10)

    prompt_id = running_on_b(a, b, sleep_prompt(60.0, 9))
    assert b.proc is not None
    os.kill(b.proc.pid, signal.SIGSTOP)  # hung: it takes connections and never answers
    started = time.monotonic()
    status, body = call(a, "POST", f"/api/v2/jobs/{prompt_id}/cancel")
    assert time.monotonic() - started < 6
    assert status == 200 and body["id"] == prompt_id
    b.kill()  # gone: refused at once
    started = time.monotonic()
    assert call(a, "POST", f"/api/jobs/{prompt_id}/cancel")[0] == 200
    assert time.monotonic() - started < 6
