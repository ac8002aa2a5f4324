"""Through a real `comfyfleet serve`: kill -9 mid-batch and restart without duplicate jobs;
typed keys never stored."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from PIL import Image

from comfyfleet.fanout.secrets import parse_reference
from tests.emulators import Emulator
from tests.integration.fanout.conftest import KEY, KEY_ENV, Graph, start_emulator
from tests.integration.gateway.wire import sleep_prompt
from tests.servers import ServerProcess

WRONG_TYPED = "typed-WRONG-key-9f8e7d6c5b4a"


@pytest.fixture
async def slow_emulator() -> AsyncIterator[Emulator]:
    started = await start_emulator(latency=4.0)
    yield started
    await started.server.close()


async def serve(data: Path, *flags: str) -> ServerProcess:
    server = ServerProcess(data, "--local-slots", "2", *flags)
    return await asyncio.to_thread(server.start)


async def post(session: aiohttp.ClientSession, server: ServerProcess, body: Any) -> Any:
    async with session.post(f"{server.url}/prompt", json=body) as response:
        answer = await response.json()
        assert response.status == 200, answer
        return answer


async def history(
    session: aiohttp.ClientSession, server: ServerProcess, prompt_id: str, timeout: float = 20.0
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        async with session.get(f"{server.url}/history/{prompt_id}") as response:
            found: dict[str, Any] = await response.json()
        if prompt_id in found:
            entry: dict[str, Any] = found[prompt_id]
            return entry
        await asyncio.sleep(0.1)
    raise AssertionError(f"{prompt_id} did not finish within {timeout} s")


async def until(check: Any, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def batch(url: str, count: int, key: str = f"env:{KEY_ENV}") -> Graph:
    graph = Graph(url, key=key, poll=0.1)
    graph.collect("c", [graph.submit(f"s{n}", "durable", seed=n) for n in range(count)])
    graph.save("first", "c", 0, prefix="durable")
    return graph


async def test_a_batch_killed_mid_flight_completes_after_restart_without_duplicates(
    tmp_path: Path, slow_emulator: Emulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    data = tmp_path / "data"
    graph = batch(slow_emulator.url, 10)
    async with aiohttp.ClientSession() as session:
        first = await serve(data)
        try:
            prompt_id = (await post(session, first, {"prompt": graph.prompt}))["prompt_id"]
            await until(lambda: slow_emulator.stats()["jobs"] == 10, "all ten jobs sent")
            await asyncio.sleep(0.3)  # their ids reach the journal
        finally:
            await asyncio.to_thread(first.kill)
        second = await serve(data)
        try:
            entry = await history(session, second, prompt_id)
            assert entry["status"]["status_str"] == "success", entry["status"]
            report = json.loads(entry["outputs"]["c"]["text"][0])
            assert report["counts"] == {"success": 10, "not_connected": 20}
            stats = slow_emulator.stats()
            assert (stats["jobs"], stats["duplicates"]) == (10, 0)
        finally:
            await asyncio.to_thread(second.terminate)
        third = await serve(data)
        try:
            # Queued again in a fresh process (empty cache): the journal answers.
            again = (await post(session, third, {"prompt": graph.prompt}))["prompt_id"]
            entry = await history(session, third, again)
            reused = json.loads(entry["outputs"]["c"]["text"][0])["slots"][:10]
            assert all(slot["reused"] for slot in reused)
            assert slow_emulator.stats()["jobs"] == 10
        finally:
            await asyncio.to_thread(third.terminate)


def grep_everywhere(data: Path, server: ServerProcess, texts: list[str], *secrets: str) -> None:
    """No secret in what the server said over HTTP, in its files, its log or its PNGs."""
    haystacks = {f"http {n}": text.encode() for n, text in enumerate(texts)}
    for path in data.rglob("*"):
        if path.is_file():
            haystacks[str(path)] = path.read_bytes()
    haystacks["log"] = server.log.read_bytes()
    for png in (data / "output").rglob("*.png"):
        with Image.open(png) as picture:
            haystacks[f"{png} text"] = json.dumps(dict(picture.text)).encode()  # type: ignore[attr-defined]
    for secret in secrets:
        leaks = [name for name, content in haystacks.items() if secret.encode() in content]
        assert leaks == [], f"{secret!r} found in {leaks}"


async def read(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url) as response:
        return await response.text()


async def test_a_typed_key_works_but_is_never_stored_logged_or_shown(
    tmp_path: Path, emulator: Emulator
) -> None:
    data = tmp_path / "data"
    graph = Graph(emulator.url, key=KEY, poll=0.1)
    wrong = graph.api(emulator.url, WRONG_TYPED)
    graph.collect(
        "c",
        [graph.submit("ok", "secret test", seed=1), graph.submit("no", "x", 2, settings=wrong)],
        mode="placeholder",
    )
    graph.save("saved", "c", 0, prefix="secret")
    workflow = {"nodes": [{"type": "APISettings", "widgets_values": [emulator.url, KEY]}]}
    body = {"prompt": graph.prompt, "extra_data": {"extra_pnginfo": {"workflow": workflow}}}
    async with aiohttp.ClientSession() as session:
        server = await serve(data, "--log-level", "DEBUG")
        try:
            prompt_id = (await post(session, server, body))["prompt_id"]
            entry = await history(session, server, prompt_id)
            assert entry["status"]["status_str"] == "success", entry["status"]
            report = json.loads(entry["outputs"]["c"]["text"][0])
            assert [s["state"] for s in report["slots"][:2]] == ["success", "failed"]
            assert report["slots"][1]["http_status"] == 403
            assert emulator.stats()["jobs"] == 1  # the typed key reached the provider
            texts = [
                await read(session, f"{server.url}/history"),
                await read(session, f"{server.url}/api/jobs/{prompt_id}"),
                await read(session, f"{server.url}/queue"),
            ]
            # Now a long job with the typed key, and the server killed while it runs.
            emulator.settings.latency = 5.0
            long_graph = batch(emulator.url, 1, key=KEY)
            long_id = (await post(session, server, {"prompt": long_graph.prompt}))["prompt_id"]
            await until(lambda: emulator.stats()["jobs"] == 2, "the long job sent")
        finally:
            await asyncio.to_thread(server.kill)
        server = await serve(data, "--log-level", "DEBUG")
        try:
            # Re-queued at start-up, its key is gone: it fails at once, saying why.
            entry = await history(session, server, long_id, timeout=10)
            assert entry["status"]["status_str"] == "error"
            error = next(m[1] for m in entry["status"]["messages"] if m[0] == "execution_error")
            assert error["node_type"] == "APISettings"
            assert "kept in memory only" in error["exception_message"]
            texts.append(await read(session, f"{server.url}/history"))
        finally:
            await asyncio.to_thread(server.terminate)
    assert "redacted-key" in texts[0]  # the prompt is there, with the marker
    grep_everywhere(data, server, texts, KEY, WRONG_TYPED)


async def test_a_batch_cut_off_by_sigterm_is_re_attached_not_cancelled_or_resent(
    tmp_path: Path, slow_emulator: Emulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    data = tmp_path / "data"
    graph = batch(slow_emulator.url, 6)
    async with aiohttp.ClientSession() as session:
        first = await serve(data, "--shutdown-grace", "0.2")
        try:
            prompt_id = (await post(session, first, {"prompt": graph.prompt}))["prompt_id"]
            await until(lambda: slow_emulator.stats()["jobs"] == 6, "all six jobs sent")
            await asyncio.sleep(0.3)  # their ids reach the journal
            # Past the grace period the prompt is re-queued: its paid jobs are left running.
            assert await asyncio.to_thread(first.terminate) == 0
        finally:
            await asyncio.to_thread(first.kill)
        assert slow_emulator.stats()["cancels"] == 0
        second = await serve(data)
        try:
            entry = await history(session, second, prompt_id)
            assert entry["status"]["status_str"] == "success", entry["status"]
            report = json.loads(entry["outputs"]["c"]["text"][0])
            assert report["counts"]["success"] == 6
            stats = slow_emulator.stats()
            assert (stats["jobs"], stats["duplicates"], stats["cancels"]) == (6, 0, 0)
        finally:
            await asyncio.to_thread(second.terminate)


def linked_key_graph(url: str) -> tuple[Graph, dict[str, Any]]:
    """The key typed into a String node whose output reaches the settings' api_key through a
    pass-through node (what the editor's "convert widget to input" makes), and the editor's
    UI workflow, which holds the key among the String node's widget values."""
    graph = Graph(url, poll=0.1)
    graph.prompt["key"] = {"class_type": "PrimitiveString", "inputs": {"value": KEY}}
    graph.prompt["via"] = {"class_type": "Sleep", "inputs": {"value": ["key", 0], "seconds": 0}}
    graph.prompt[graph.settings]["inputs"]["api_key"] = ["via", 0]
    graph.collect("c", [graph.submit("s", "linked key", seed=1)])
    graph.save("saved", "c", 0, prefix="linked")
    workflow = {
        "nodes": [
            {"id": 5, "type": "PrimitiveString", "widgets_values": [KEY]},
            {"id": 6, "type": "APISettings", "widgets_values": [url, KEY, 0, 0.0, 0.1, 900.0]},
        ],
        "links": [[1, 5, 0, 6, 1, "STRING"]],
    }
    return graph, workflow


async def frames(session: aiohttp.ClientSession, url: str, client_id: str, into: list[str]) -> None:
    """Every text frame the server sends this client, until cancelled."""
    async with session.ws_connect(f"{url}/ws?clientId={client_id}") as ws:
        async for message in ws:
            if message.type == aiohttp.WSMsgType.TEXT:
                into.append(message.data)


async def test_a_key_linked_into_api_key_runs_but_is_never_stored_logged_or_shown(
    tmp_path: Path, emulator: Emulator
) -> None:
    data = tmp_path / "data"
    graph, workflow = linked_key_graph(emulator.url)
    extra = {"client_id": "watcher", "extra_pnginfo": {"workflow": workflow}}
    received: list[str] = []
    async with aiohttp.ClientSession() as session:
        server = await asyncio.to_thread(
            ServerProcess(data, "--local-slots", "1", "--log-level", "DEBUG").start
        )
        watcher = asyncio.create_task(frames(session, server.url, "watcher", received))
        try:
            # The only slot is busy: the keyed prompt waits in the queue, where /queue shows it.
            await post(session, server, {"prompt": sleep_prompt(2.0), "client_id": "watcher"})
            body = {"prompt": graph.prompt, "client_id": "watcher", "extra_data": extra}
            prompt_id = (await post(session, server, body))["prompt_id"]
            queue = await read(session, f"{server.url}/queue")
            assert prompt_id in [item[1] for item in json.loads(queue)["queue_pending"]]
            entry = await history(session, server, prompt_id)
            assert entry["status"]["status_str"] == "success", entry["status"]
            report = json.loads(entry["outputs"]["c"]["text"][0])
            assert report["slots"][0]["state"] == "success"
            assert emulator.stats()["jobs"] == 1  # the linked key reached the provider
            texts = [
                queue,
                await read(session, f"{server.url}/history"),
                await read(session, f"{server.url}/api/jobs/{prompt_id}"),
            ]
            await until(lambda: any("execution_success" in f for f in received), "the frames")
            grep_everywhere(data, server, [*texts, *received], KEY)  # the WAL is still there
        finally:
            watcher.cancel()
            await asyncio.to_thread(server.terminate)
    stored = json.loads(texts[1])[prompt_id]["prompt"][2]
    assert parse_reference(stored["key"]["inputs"]["value"])[0] == "memory"
    assert stored["via"]["inputs"]["seconds"] == 0  # only the key was taken out
    assert list((data / "output").rglob("linked*.png"))
    grep_everywhere(data, server, [*texts, *received], KEY)
