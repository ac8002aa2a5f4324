"""A worker cut off from its gateway mid-prompt (the network, not the process). A
silent cut: its backend stops the prompt once the gateway's hold on it runs out, and
the gateway gives it to another worker only after that. A reset (both ends see the
connection broken): the worker lets go of it when it is not back within
RETURN_WINDOW, and the gateway gives it to another only after that, well before the
hold. Either way, when the cut-off worker comes back it does not run it again. Counted
outside every process: the side effect happens once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from comfyfleet.testing import LEDGER_ENV
from comfyfleet.tunnel.ends import RETURN_WINDOW
from tests.integration.fleet.harness import poll
from tests.integration.workers.test_workers import CONFIG, WorkerProcess, ledger_prompt
from tests.real_comfyui import comfyui_with_pack, needs_comfyui
from tests.servers import ServerProcess, free_port

HOLD = 6.0  # the gateway's hold on a worker's prompt (--backend-hold), s


class Cable:
    """A TCP forwarder on loopback that can be cut and mended: the network between a
    worker and its gateway. Cut, new connections are held unanswered, and the open ones
    are reset (both ends see them end) or, `silent`, go on taking bytes and deliver
    none."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.cut = False
        self.silent = False
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
            while data := await reader.read(65536):
                if self.cut and self.silent:
                    continue  # swallowed
                if self.cut:
                    break
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    def set_cut(self, cut: bool, silent: bool = False) -> None:
        def apply() -> None:
            self.cut, self.silent = cut, silent
            if silent:
                return
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


def running_on_w0(gateway: ServerProcess) -> str:
    """Once worker w0 is up: a prompt twice the hold long, running (on w0); its id."""
    poll(lambda: lanes_up_named(gateway, {"worker-pool.w0"}), what="w0", timeout=60)
    prompt = ledger_prompt("once", 2 * HOLD)
    prompt_id: str = gateway.post("/prompt", {"prompt": prompt})["prompt_id"]
    poll(lambda: gateway.get(f"/api/jobs/{prompt_id}")["status"] == "in_progress", what="run")
    return prompt_id


@pytest.mark.parametrize("silent", [False, True], ids=["reset", "silent"])
def test_a_cut_off_worker_stops_its_prompt_before_another_runs_it(
    gateway: ServerProcess, tmp_path: Path, silent: bool
) -> None:
    cable = Cable(gateway.port)
    cut_off = WorkerProcess(f"http://127.0.0.1:{cable.port}", tmp_path / "w0", "w0")
    other = None
    try:
        prompt_id = running_on_w0(gateway)
        assert lane_of(gateway, prompt_id) == "backend:worker-pool.w0"
        cable.set_cut(True, silent=silent)
        cut_at = time.time()
        other = WorkerProcess(gateway.url, tmp_path / "w1", "w1")
        poll(lambda: bool(gateway.get(f"/history/{prompt_id}")), what="the rerun", timeout=90)
        entry = gateway.get(f"/history/{prompt_id}")[prompt_id]
        assert entry["status"]["status_str"] == "success"
        assert lane_of(gateway, prompt_id) == "backend:worker-pool.w1"
        # Not run in two places: the rerun began only once w0 had let go of it (its
        # hold ran out; reset, it was not back within RETURN_WINDOW).
        rerun = gateway.get(f"/api/jobs/{prompt_id}")
        assert rerun["attempt"] == 2
        took = rerun["execution_start_time"] / 1000 - cut_at
        if silent:
            assert took >= HOLD, f"rerun {took:.2f} s after the cut"
        else:
            assert RETURN_WINDOW <= took < HOLD, f"rerun {took:.2f} s after the cut"
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


def test_a_worker_paused_past_the_hold_runs_nothing_its_gateway_ran_elsewhere(
    gateway: ServerProcess, tmp_path: Path
) -> None:
    """SIGSTOP on the worker (not its backend) past the hold: the gateway hears nothing,
    waits out the hold, and runs the prompt on another worker; the paused worker's
    backend, kept no more, has stopped it by then. Resumed, the worker runs it no more."""
    paused = WorkerProcess(gateway.url, tmp_path / "w0", "w0")
    other = None
    try:
        prompt_id = running_on_w0(gateway)
        other = WorkerProcess(gateway.url, tmp_path / "w1", "w1")
        poll(lambda: lanes_up_named(gateway, {"worker-pool.w1"}), what="w1", timeout=60)
        paused.proc.send_signal(signal.SIGSTOP)
        stopped_at = time.time()
        poll(lambda: bool(gateway.get(f"/history/{prompt_id}")), what="the rerun", timeout=90)
        rerun = gateway.get(f"/api/jobs/{prompt_id}")
        assert rerun["lane"] == "backend:worker-pool.w1" and rerun["attempt"] == 2
        assert rerun["execution_start_time"] / 1000 - stopped_at >= HOLD
        paused.proc.send_signal(signal.SIGCONT)
        time.sleep(2 * HOLD)  # past the end its run would have had
        lines = (tmp_path / "ledger.jsonl").read_text().splitlines()
        assert [json.loads(line)["tag"] for line in lines] == ["once"]
    finally:
        with contextlib.suppress(ProcessLookupError):
            paused.proc.send_signal(signal.SIGCONT)
        paused.kill()
        if other is not None:
            other.kill()


def test_a_worker_back_within_the_window_keeps_its_prompt(
    gateway: ServerProcess, tmp_path: Path
) -> None:
    """A blip: the connection is reset and the worker is back on the same gateway within
    RETURN_WINDOW. Nothing is let go: the prompt runs on there, once, to its end."""
    cable = Cable(gateway.port)
    worker = WorkerProcess(f"http://127.0.0.1:{cable.port}", tmp_path / "w0", "w0")
    try:
        poll(lambda: lanes_up_named(gateway, {"worker-pool.w0"}), what="w0", timeout=60)
        prompt_id = gateway.post("/prompt", {"prompt": ledger_prompt("once", 4.0)})["prompt_id"]
        poll(lambda: gateway.get(f"/api/jobs/{prompt_id}")["status"] == "in_progress", what="run")
        cable.set_cut(True)
        cable.set_cut(False)  # its first reconnect, 0.5 s on, goes through
        poll(lambda: bool(gateway.get(f"/history/{prompt_id}")), what="its end", timeout=60)
        job = gateway.get(f"/api/jobs/{prompt_id}")
        assert (job["status"], job["attempt"]) == ("completed", 1)
        assert job["lane"] == "backend:worker-pool.w0"
        lines = (tmp_path / "ledger.jsonl").read_text().splitlines()
        assert [json.loads(line)["tag"] for line in lines] == ["once"]
        assert worker.log().count("joined the fleet") == 2  # it came back
        assert "lets go" not in worker.log()
    finally:
        worker.kill()
        cable.close()


def test_a_worker_that_comes_back_to_another_gateway_lets_go_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Behind one address (a load balancer), the broken connection comes back to another
    gateway: that one does not follow the first one's prompt, and the first runs it
    elsewhere after RETURN_WINDOW, so the worker lets go of it at once (a 30 s hold
    would have let it run to its end there too)."""
    monkeypatch.setenv(LEDGER_ENV, str(tmp_path / "ledger.jsonl"))
    config = tmp_path / "gateway.toml"
    config.write_text(CONFIG)
    extra = ("--local-slots", "0", "--config", str(config))
    with (
        ServerProcess(tmp_path / "gw-a", *extra) as first,
        ServerProcess(tmp_path / "gw-b", *extra) as second,
    ):
        cable = Cable(first.port)
        hopper = WorkerProcess(f"http://127.0.0.1:{cable.port}", tmp_path / "w0", "w0")
        other = None
        try:
            poll(lambda: lanes_up_named(first, {"worker-pool.w0"}), what="w0", timeout=60)
            prompt = ledger_prompt("once", 6.0)
            prompt_id = first.post("/prompt", {"prompt": prompt})["prompt_id"]
            poll(lambda: first.get(f"/api/jobs/{prompt_id}")["status"] == "in_progress", what="run")
            other = WorkerProcess(first.url, tmp_path / "w1", "w1")
            poll(lambda: lanes_up_named(first, {"worker-pool.w1"}), what="w1", timeout=60)
            cable.set_cut(True)
            cable.target_port = second.port
            cable.set_cut(False)
            poll(lambda: lanes_up_named(second, {"worker-pool.w0"}), what="w0 on B", timeout=30)
            poll(lambda: bool(first.get(f"/history/{prompt_id}")), what="the rerun", timeout=60)
            assert first.get(f"/api/jobs/{prompt_id}")["lane"] == "backend:worker-pool.w1"
            time.sleep(6.0)  # past the end w0's run would have had
            lines = (tmp_path / "ledger.jsonl").read_text().splitlines()
            assert [json.loads(line)["tag"] for line in lines] == ["once"]
            assert "lets go" in hopper.log()
        finally:
            hopper.kill()
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
