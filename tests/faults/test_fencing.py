"""Fencing what a gateway does outside the store: gateways on one PostgreSQL, each a
process of its own, paused past their lease and cut off from the store for longer than
it. Side effects are counted outside the processes: the files in each data dir."""

from __future__ import annotations

import functools
import json
import os
import signal
import time
from contextlib import AbstractContextManager as ContextManager
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from urllib.error import HTTPError
from urllib.parse import urlencode
from urllib.request import Request, urlopen

import pytest

from comfyfleet.domain.gateways import GatewayRecord
from comfyfleet.domain.jobs import NewJob
from comfyfleet.lanes.fleet import derived_name
from comfyfleet.store.postgres import PostgresStore
from comfyfleet.testing import LEDGER_ENV
from tests.faults.helpers import save_sleep_prompt
from tests.integration.gateway import processes
from tests.integration.gateway.processes import job, logged_events, poll, submit
from tests.integration.gateway.wire import save_prompt, sleep_prompt
from tests.servers import ServerProcess
from tests.store_link import StoreLink

pytestmark = pytest.mark.faults

LEASE = 2.0


def gateways(
    tmp_path: Path, url: str, count: int, lease: float = LEASE, *extra: str
) -> ContextManager[list[ServerProcess]]:
    return processes.gateways(tmp_path, url, count, "--local-slots", "2", *extra, lease=lease)


def view(server: ServerProcess, image: dict[str, str]) -> bytes:
    with urlopen(f"{server.url}/view?{urlencode(image)}", timeout=30) as answer:
        return bytes(answer.read())


def saved(data_dirs: list[Path], prefix: str) -> list[Path]:
    """The files saved under `prefix` in every gateway's output folder."""
    return sorted(p for d in data_dirs for p in (d / "output").glob(f"{prefix}_*"))


def images(server: ServerProcess, prompt_id: str) -> list[dict[str, str]]:
    entry = server.get(f"/history/{prompt_id}")[prompt_id]
    return [image for out in entry["outputs"].values() for image in out.get("images", [])]


def test_two_gateways_never_give_two_files_one_name(tmp_path: Path, postgres_database: str) -> None:
    """Each gateway counted `ComfyUI_00001_.png` from its own folder: the history of two
    prompts named one file, and `/view` of it answered each gateway's own image."""
    with gateways(tmp_path, postgres_database, 2) as (first, second):
        three_saves_three_names(first, second, first)


def in_history(server: ServerProcess, prompt_id: str) -> bool:
    return prompt_id in server.get("/history")


def three_saves_three_names(one: ServerProcess, two: ServerProcess, three: ServerProcess) -> None:
    """Three saves of one prefix, through these gateways in turn: three names, and
    `/view` of each answers the same image on every gateway."""
    ids = []
    for server, color in ((one, 0xFF0000), (two, 0x00FF00), (three, 0x0000FF)):
        prompt_id = submit(server, save_prompt(color, "same"))
        poll(functools.partial(in_history, server, prompt_id), what="the prompt")
        ids.append(prompt_id)
    names = [image["filename"] for p in ids for image in images(one, p)]
    assert len(names) == 3 and len(set(names)) == 3, names
    for prompt_id in ids:
        for image in images(two, prompt_id):
            assert view(one, image) == view(two, image)


def test_a_copy_of_a_backends_output_never_takes_a_name_a_gateway_saved(
    tmp_path: Path, postgres_database: str
) -> None:
    """A backend counts its files from its own folder: its `same_00001_.png`, copied to a
    gateway under that name, met the `same_00001_.png` another gateway had saved, and
    `/view` of the name answered each gateway's own image (chaos seed 1018)."""
    with ExitStack() as stack:
        backend = stack.enter_context(ServerProcess(tmp_path / "backend", "--local-slots", "1"))
        common = ("--store", postgres_database, "--lease", f"{LEASE}s")
        saver = stack.enter_context(
            ServerProcess(
                tmp_path / "saver", *common, "--gateway-id", "saver", "--local-slots", "1"
            )
        )
        relay = ServerProcess(
            tmp_path / "relay",
            *common,
            *("--gateway-id", "relay", "--local-slots", "0", "--backend", backend.url),
        )
        relay = stack.enter_context(relay)
        poll(
            lambda: [b["state"] for b in relay.get("/api/fleet/backends")["backends"]] == ["up"],
            what="the backend",
        )
        three_saves_three_names(saver, relay, relay)


def test_a_gateway_paused_past_its_lease_leaves_no_file_and_serves_the_recorded_one(
    tmp_path: Path, postgres_database: str
) -> None:
    """Gateway 1, SIGSTOPped mid-prompt for longer than its lease, finished the prompt
    after SIGCONT and wrote its own image under the name the re-run recorded: `/view` of
    the history's file answered its unrecorded render there."""
    with gateways(tmp_path, postgres_database, 2) as servers:
        data_dirs = [server.data_dir for server in servers]
        prompt_id = submit(servers[0], save_sleep_prompt("paused", 3.0, 0x112233))
        poll(lambda: job(servers[0], prompt_id)["status"] == "in_progress", what="its start")
        runner = servers[int(job(servers[0], prompt_id)["gateway"].removeprefix("gw-"))]
        other = next(s for s in servers if s is not runner)
        assert runner.proc is not None
        time.sleep(0.5)
        os.kill(runner.proc.pid, signal.SIGSTOP)
        try:
            # The other gateway takes it over once the lease has run out, and runs it.
            poll(lambda: prompt_id in other.get("/history"), what="the re-run", timeout=60)
        finally:
            os.kill(runner.proc.pid, signal.SIGCONT)
        time.sleep(4.0)  # what the paused gateway had left to do, and more
        record = job(other, prompt_id)
        assert (record["status"], record["gateway"]) == ("completed", f"gw-{servers.index(other)}")
        assert record["attempt"] >= 2
        [image] = images(other, prompt_id)
        files = saved(data_dirs, "paused")
        assert [f.parent.parent for f in files] == [other.data_dir], files
        recorded = view(other, image)
        assert view(runner, image) == recorded  # fetched from the gateway that holds it


@pytest.mark.parametrize("shared_backends", [False, True], ids=["alone", "with-backends"])
def test_a_store_outage_longer_than_the_lease_reruns_nothing_finished(
    tmp_path: Path, postgres_database: str, shared_backends: bool
) -> None:
    """PostgreSQL unreachable for longer than the lease, prompts ending meanwhile: when
    it came back every lease had run out, and gateways took each other's finished
    prompts over as orphans and ran them again. With backends they share, the first
    gateway back claimed the backends of those not yet renewed, and with them their
    jobs (chaos seed 1000)."""
    # A lease long enough that the previews end well before it could run out: the last
    # renewal may come up to a third of it before the cut.
    lease = 2 * LEASE
    with ExitStack() as stack:
        extra: list[str] = []
        for n in range(3 if shared_backends else 0):  # each gateway owns one
            backend = ServerProcess(tmp_path / f"backend-{n}", "--local-slots", "1")
            extra += ["--backend", stack.enter_context(backend).url]
        link = stack.enter_context(StoreLink(postgres_database))
        servers = stack.enter_context(gateways(tmp_path, link.url, 3, lease, *extra))
        outage_reruns_nothing(servers, link, lease)


def outage_reruns_nothing(servers: list[ServerProcess], link: StoreLink, lease: float) -> None:
    data_dirs = [server.data_dir for server in servers]
    # Previews end without the store; saves name their file from it first (and are
    # given back, not run twice, if it stays away past the lease).
    previews = [submit(servers[n % 3], sleep_prompt(1.0, n)) for n in range(6)]
    saves = [submit(servers[n % 3], save_sleep_prompt(f"outage{n}", 1.0, n)) for n in range(3)]
    ids = previews + saves
    poll(
        lambda: all(job(servers[0], p)["status"] == "in_progress" for p in previews),
        what="the previews running",
    )
    with link.outage():
        time.sleep(2.5 * lease)  # they end meanwhile; their ends cannot be recorded
    poll(lambda: all(p in servers[1].get("/history") for p in ids), what="every end")
    time.sleep(lease)  # a take-over, if any, would have happened by now
    ran = {p: job(servers[2], p) for p in ids}
    assert {r["status"] for r in ran.values()} == {"completed"}, ran
    assert [ran[p]["attempt"] for p in previews] == [1] * len(previews)
    for n in range(3):
        assert len(saved(data_dirs, f"outage{n}")) == 1


def test_a_store_outage_mid_prompt_goes_on_where_it_stopped(
    tmp_path: Path, postgres_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prompt whose first node had done its side effect when PostgreSQL went away for
    longer than the lease: the fenced gateway gave it back, and it ran again, side
    effect and all, although no one could have taken it over (chaos seeds 1002, 1014).
    Held back instead, its node under way stops and runs again once the lease holds."""
    ledger = tmp_path / "ledger.jsonl"
    monkeypatch.setenv(LEDGER_ENV, str(ledger))
    prompt = {
        "1": {"class_type": "LedgerAppend", "inputs": {"tag": "mid", "seconds": 0.1}},
        "2": {"class_type": "Sleep", "inputs": {"value": ["1", 0], "seconds": 3.0}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "mid"}},
    }
    with StoreLink(postgres_database) as link, gateways(tmp_path, link.url, 2) as servers:
        prompt_id = submit(servers[0], prompt)
        poll(lambda: ledger.exists() and prompt_id in ledger.read_text(), what="the side effect")
        with link.outage():
            time.sleep(2.5 * LEASE)
        poll(lambda: prompt_id in servers[1].get("/history"), what="the end", timeout=60)
        time.sleep(LEASE)  # a second run, if any, would have done its side effect by now
        lines = [line for line in ledger.read_text().splitlines() if prompt_id in line]
        assert len(lines) == 1, lines
        ran = job(servers[1], prompt_id)
        assert (ran["status"], ran["attempt"]) == ("completed", 1), ran
        assert len(saved([server.data_dir for server in servers], "mid")) == 1
        # The frames held back while fenced were sent when it went on: one whole stream.
        events = logged_events(servers[0].url, prompt_id)
        assert events.count("execution_start") == 1, events
        assert events.count("executed") == 1 and "execution_success" in events, events


async def test_a_job_set_aside_for_a_backend_that_ran_it_is_followed_there(
    tmp_path: Path, postgres_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gateway set a job aside for its backend and sent it there, then could record
    its start no more (the store away, then the gateway paused past its lease). The
    gateway that swept it gave the reservation back to the queue and ran the prompt
    again, although the backend had run it (chaos seed 1018). The gateway that has the
    backend now starts the job there and reads its end from there."""
    ledger = tmp_path / "ledger.jsonl"
    monkeypatch.setenv(LEDGER_ENV, str(ledger))
    prompt = {
        "1": {"class_type": "LedgerAppend", "inputs": {"tag": "aside", "seconds": 0.1}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "a"}},
    }
    prompt_id = "5e7a51de-0000-4000-8000-000000000001"
    with ExitStack() as stack:
        backend = stack.enter_context(ServerProcess(tmp_path / "backend", "--local-slots", "1"))
        gone = PostgresStore(postgres_database, owner="gone")
        await gone.open()
        try:
            await gone.join(GatewayRecord("gone", "gone", "host", 1, "", 1.0), LEASE)
            await gone.submit(NewJob(prompt_id, 1, False, prompt, {}, ["2"]))
            queued = await gone.get(prompt_id)
            assert queued is not None
            lane = f"backend:{derived_name(backend.url)}"  # as the gateway names its lane
            assert await gone.reserve_job(queued, lane) is not None
            # Sent to the backend before its start could be recorded; it runs it there.
            backend.post("/prompt", {"prompt": prompt, "prompt_id": prompt_id})
            poll(lambda: prompt_id in backend.get("/history"), what="the backend's run")
            here = ServerProcess(
                tmp_path / "here",
                *("--store", postgres_database, "--lease", f"{LEASE}s", "--gateway-id", "here"),
                *("--local-slots", "1", "--backend", backend.url),
            )
            here = stack.enter_context(here)
            poll(lambda: prompt_id in here.get("/history"), what="the end", timeout=60)
            time.sleep(LEASE)  # a second run, if any, would be done by now
        finally:
            await gone.close()
        lines = [line for line in ledger.read_text().splitlines() if prompt_id in line]
        assert len(lines) == 1, lines
        ran = job(here, prompt_id)
        assert (ran["status"], ran["lane"]) == ("completed", lane), ran
        assert here.get(f"/history/{prompt_id}")[prompt_id]["status"]["status_str"] == "success"


def answer(
    server: ServerProcess, method: str, path: str, body: object = None
) -> tuple[int, Any, dict[str, str]]:
    data = None if body is None else json.dumps(body).encode()
    request = Request(f"{server.url}{path}", data=data, method=method)
    request.add_header("Content-Type", "application/json")
    try:
        with urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read()), dict(reply.headers)
    except HTTPError as refused:
        return refused.code, json.loads(refused.read()), dict(refused.headers)


def test_during_a_store_outage_requests_get_503_and_the_gateway_is_not_ready(
    tmp_path: Path, postgres_database: str
) -> None:
    """With the store away, `POST /prompt`, `GET /queue`, `/history` and `/api/jobs`
    answered 500 `server_error`, and `GET /prompt` 200 with a stale count."""
    with StoreLink(postgres_database) as link, gateways(tmp_path, link.url, 1) as [server]:
        assert answer(server, "GET", "/readyz")[:2] == (200, {"status": "ready"})
        with link.outage():
            time.sleep(LEASE)  # past the part of the lease kept in hand
            calls = [
                ("POST", "/prompt", {"prompt": save_prompt(1, "outage")}),
                ("GET", "/queue", None),
                ("GET", "/history", None),
                ("GET", "/api/jobs", None),
                ("GET", "/prompt", None),
            ]
            for method, path, body in calls:
                status, reply, headers = answer(server, method, path, body)
                assert status == 503, (path, status, reply)
                assert reply["error"]["type"] == "store_unavailable" and "node_errors" in reply
                assert int(headers["Retry-After"]) > 0
            status, reply, _ = answer(server, "GET", "/readyz")
            assert status == 503 and "the store does not answer" in reply["problems"]
            assert answer(server, "GET", "/healthz")[:2] == (200, {"status": "ok"})
        poll(lambda: answer(server, "GET", "/readyz")[0] == 200, what="ready again")
        prompt_id = submit(server, save_prompt(2, "after"))
        poll(lambda: prompt_id in server.get("/history"), what="a prompt after the outage")
