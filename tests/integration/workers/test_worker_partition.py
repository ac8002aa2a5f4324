"""A worker cut off from its gateway mid-prompt (the network, not the process): its
backend stops the prompt once the gateway's hold on it runs out, the gateway gives it
to another worker only after that, and when the cut-off worker comes back it does not
run it again. Counted outside every process: the side effect happens once."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from comfyfleet.testing import LEDGER_ENV
from tests.integration.fleet.harness import poll
from tests.integration.workers.test_workers import CONFIG, WorkerProcess, ledger_prompt
from tests.real_comfyui import comfyui_with_pack, needs_comfyui
from tests.servers import ServerProcess, free_port

HOLD = 3.0  # the gateway's hold on a worker's prompt (--backend-hold), s


class Cable:
    """A TCP forwarder on loopback that can be cut (every connection dropped, new ones
    held unanswered) and mended: the network between a worker and its gateway."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.cut = False
        self._writers: set[asyncio.StreamWriter] = set()
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        self._thread.start()
        started.wait(10)

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(
            asyncio.start_server(self._accepted, "127.0.0.1", self.port)
        )
        started.set()
        self.loop.run_forever()
        server.close()
        for writer in self._writers:
            writer.transport.abort()
        self.loop.run_until_complete(server.wait_closed())
        self.loop.run_until_complete(asyncio.sleep(0))  # the aborts' callbacks
        self.loop.close()

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut:
            self._writers.add(writer)  # held: neither answered nor refused
            return
        self._writers.add(writer)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers.add(up_writer)
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        self._writers -= {writer, up_writer}

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while not self.cut and (data := await reader.read(65536)):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    def set_cut(self, cut: bool) -> None:
        def apply() -> None:
            self.cut = cut
            for writer in self._writers:
                writer.transport.abort()  # gone without a goodbye (held ones too)
            self._writers.clear()

        self.loop.call_soon_threadsafe(apply)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


@pytest.fixture
def gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ServerProcess]:
    monkeypatch.setenv(LEDGER_ENV, str(tmp_path / "ledger.jsonl"))
    config = tmp_path / "gateway.toml"
    config.write_text(CONFIG)
    extra = ("--local-slots", "0", "--config", str(config), "--backend-hold", f"{HOLD:g}")
    with ServerProcess(tmp_path / "gateway", *extra) as server:
        yield server


def lane_of(gateway: ServerProcess, prompt_id: str) -> str | None:
    lane: str | None = gateway.get(f"/api/jobs/{prompt_id}").get("lane")
    return lane


def test_a_cut_off_worker_stops_its_prompt_before_another_runs_it(
    gateway: ServerProcess, tmp_path: Path
) -> None:
    cable = Cable(gateway.port)
    cut_off = WorkerProcess(f"http://127.0.0.1:{cable.port}", tmp_path / "w0", "w0")
    other = None
    try:
        poll(lambda: lanes_up_named(gateway, {"worker-pool.w0"}), what="w0", timeout=60)
        prompt_id = gateway.post("/prompt", {"prompt": ledger_prompt("once", 6.0)})["prompt_id"]
        poll(lambda: gateway.get(f"/api/jobs/{prompt_id}")["status"] == "in_progress", what="run")
        assert lane_of(gateway, prompt_id) == "backend:worker-pool.w0"
        cable.set_cut(True)
        cut_at = time.time()
        other = WorkerProcess(gateway.url, tmp_path / "w1", "w1")
        poll(lambda: bool(gateway.get(f"/history/{prompt_id}")), what="the rerun", timeout=90)
        entry = gateway.get(f"/history/{prompt_id}")[prompt_id]
        assert entry["status"]["status_str"] == "success"
        assert lane_of(gateway, prompt_id) == "backend:worker-pool.w1"
        # Not run in two places: the rerun began only once w0's hold had run out.
        rerun = gateway.get(f"/api/jobs/{prompt_id}")
        assert rerun["attempt"] == 2
        started = rerun["execution_start_time"] / 1000
        assert started >= cut_at + HOLD, f"rerun {started - cut_at:.2f} s after the cut"
        # w0 comes back: it takes work again, and runs nothing it was cut off from.
        cable.set_cut(False)
        poll(lambda: lanes_up_named(gateway, {"worker-pool.w0"}), what="w0 back", timeout=60)
        later = [
            gateway.post("/prompt", {"prompt": ledger_prompt(f"later{n}", 0.5)})["prompt_id"]
            for n in range(4)
        ]
        poll(lambda: all(gateway.get(f"/history/{p}") for p in later), what="later", timeout=60)
        lines = [json.loads(line) for line in (tmp_path / "ledger.jsonl").read_text().splitlines()]
        tags = sorted(line["tag"] for line in lines)
        assert tags == ["later0", "later1", "later2", "later3", "once"]  # once: w1's run
    finally:
        cut_off.kill()
        if other is not None:
            other.kill()
        cable.close()


def lanes_up_named(gateway: ServerProcess, names: set[str]) -> bool:
    backends = {b["name"]: b["state"] for b in gateway.get("/api/fleet/backends")["backends"]}
    return all(backends.get(name) == "up" for name in names)


@needs_comfyui
async def test_a_cut_off_worker_stops_its_comfyuis_prompt_at_once(tmp_path: Path) -> None:
    """A ComfyUI holds nothing for the gateway, which moves the prompt of a worker it
    lost at once: the worker, cut off too, stops it there rather than let it run on."""
    async with comfyui_with_pack(tmp_path / "comfy", {}, "TestSleep", testing_nodes=True) as url:
        await asyncio.to_thread(cut_off_comfyui, tmp_path, url)


def cut_off_comfyui(tmp_path: Path, comfyui: str) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(CONFIG)
    with ServerProcess(tmp_path / "gateway", "--local-slots", "0", "--config", str(config)) as gw:
        cable = Cable(gw.port)
        worker = WorkerProcess(
            f"http://127.0.0.1:{cable.port}", tmp_path / "w0", "w0", backend=comfyui
        )
        try:
            poll(lambda: lanes_up_named(gw, {"worker-pool.w0"}), what="w0", timeout=60)
            prompt = {
                "1": {
                    "class_type": "EmptyImage",
                    "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0},
                },
                "2": {"class_type": "TestSleep", "inputs": {"value": ["1", 0], "seconds": 8}},
                "3": {
                    "class_type": "SaveImage",
                    "inputs": {"images": ["2", 0], "filename_prefix": "cut"},
                },
            }
            prompt_id = gw.post("/prompt", {"prompt": prompt})["prompt_id"]
            poll(lambda: running_there(comfyui, prompt_id), what="the run", timeout=30)
            cable.set_cut(True)
            poll(lambda: bool(comfyui_get(comfyui, f"/history/{prompt_id}")), what="its end")
            ended = comfyui_get(comfyui, f"/history/{prompt_id}")[prompt_id]["status"]
            assert ended["status_str"] == "error"  # interrupted, not run on to its end
            assert "execution_interrupted" in [name for name, _ in ended["messages"]]
            poll(lambda: gw.get(f"/api/jobs/{prompt_id}")["status"] == "pending", what="requeue")
        finally:
            worker.kill()
            cable.close()


def comfyui_get(url: str, path: str) -> Any:
    with urllib.request.urlopen(url + path, timeout=10) as answer:
        return json.loads(answer.read())


def running_there(comfyui: str, prompt_id: str) -> bool:
    return any(item[1] == prompt_id for item in comfyui_get(comfyui, "/queue")["queue_running"])
