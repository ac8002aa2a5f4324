"""The fan-out nodes inside a real ComfyUI (the companion pack), against the provider emulator.

Needs a ComfyUI checkout: COMFYUI_DIR, and the Python of its venv in COMFY_PYTHON
(default: $COMFY_VENV/bin/python, else `python` next to the checkout's venv). Without
COMFYUI_DIR it prints why and exits 0 (so `make bench` skips it). comfyfleet reaches
ComfyUI's Python through PYTHONPATH (this checkout's src), as a `pip install` of
comfyfleet into ComfyUI's venv would; the pack is added with
`--extra-model-paths-config` (a `custom_nodes:` entry), so the checkout is not touched.

Measured, with jobs of 2 s at 512x512 (0.25 MP at 1:1):
- 30 submits and one collector, inside ComfyUI: wall time from `POST /prompt` to
  `execution_success` against the ideal (one job's latency), for the first batch
  and as the median of five warm ones after it, and the jobs the emulator received
  (one per submit);
- an interrupt (`POST /interrupt`) while 30 jobs run: how many the emulator saw
  cancelled, and how long from the interrupt to `execution_interrupted`;
- the first batch queued again after ComfyUI restarted (same user directory): the
  new jobs it sent (target 0: every result comes from the journal);
- a mixed graph (8 submits, a collector, ComfyUI's own ImageSharpen on a result,
  SaveImage) sent to a comfyfleet gateway (4 local slots, and the ComfyUI with the
  pack as its backend): the lane it ran on (the backend: the gateway's engine has
  no ImageSharpen), wall time, and the image in the gateway's history.

    .venv/bin/python bench/bench_pack.py [--latency 2] [--jobs 30] [--poll 0.5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from comfyfleet.managed.pack import pack_paths
from comfyfleet.testing.emulators.app import build_emulator_app, emulator_state
from comfyfleet.testing.emulators.state import EmulatorSettings, EmulatorState

sys.path.insert(0, str(Path(__file__).resolve().parent))
from figures import figure

ROOT = Path(__file__).resolve().parent.parent
SLOTS = 30
RESULT_SIZE = (512, 512)
#: The submits' poll interval (s): `--poll`; 0.5 is what issue 32's figures used.
POLL = {"interval": 0.5}
#: Warm batches run one after another; their median is the warm figure.
WARM_RUNS = 5
LOCAL_NODE = "ImageSharpen"  # ComfyUI's own node, which comfyfleet's engine does not have


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def comfy_python(comfyui: Path) -> str:
    explicit = os.environ.get("COMFY_PYTHON")
    if explicit:
        return explicit
    venv = os.environ.get("COMFY_VENV")
    if venv:
        return str(Path(venv) / "bin" / "python")
    return str(comfyui.parent / "venv" / "bin" / "python")


def submits(prompt: dict[str, Any], url: str, jobs: int, tag: str) -> list[str]:
    """API settings and `jobs` FLUX submits with distinct seeds; returns the submit ids."""
    prompt["api"] = {
        "class_type": "APISettings",
        "inputs": {
            "base_url": url,
            "api_key": "env:BENCH_PACK_KEY",
            "poll_interval": POLL["interval"],
        },
    }
    ids = []
    for n in range(jobs):
        ids.append(f"s{n}")
        prompt[f"s{n}"] = {
            "class_type": "Concurrent Submit | BFLFluxImage",
            "inputs": {
                "prompt": f"{tag} variant {n}",
                "resolution": "0.25 MP",
                "aspect_ratio": "1:1",
                "grounding": False,
                "safety_tolerance": 2,
                "seed": n,
                "model": "flux-2-pro",
                "api_config": ["api", 0],
            },
        }
    return ids


def batch(url: str, jobs: int, tag: str, mode: str = "placeholder") -> dict[str, Any]:
    """Submits and collectors of 30 (no save node: the collector is an output node)."""
    prompt: dict[str, Any] = {}
    ids = submits(prompt, url, jobs, tag)
    for c, start in enumerate(range(0, jobs, SLOTS)):
        tasks = {f"task_{k + 1}": [i, 0] for k, i in enumerate(ids[start : start + SLOTS])}
        prompt[f"c{c}"] = {
            "class_type": "Concurrent Collect Images (30)",
            "inputs": {**tasks, "failure_mode": mode},
        }
    return prompt


def mixed(url: str, jobs: int, tag: str) -> dict[str, Any]:
    """Fan-out, then ComfyUI's own node on the first image, then SaveImage."""
    prompt: dict[str, Any] = {}
    ids = submits(prompt, url, jobs, tag)
    tasks = {f"task_{k + 1}": [i, 0] for k, i in enumerate(ids)}
    prompt["collect"] = {
        "class_type": "Concurrent Collect Images (30)",
        "inputs": {**tasks, "failure_mode": "fail_fast"},
    }
    prompt["sharpen"] = {
        "class_type": LOCAL_NODE,
        "inputs": {"image": ["collect", 0], "sharpen_radius": 1, "sigma": 1.0, "alpha": 1.0},
    }
    prompt["save"] = {
        "class_type": "SaveImage",
        "inputs": {"images": ["sharpen", 0], "filename_prefix": "mixed"},
    }
    return prompt


class Server:
    """A ComfyUI-protocol server (ComfyUI or a gateway) on loopback, driven over HTTP + WS."""

    def __init__(self, session: aiohttp.ClientSession, port: int) -> None:
        self.session = session
        self.url = f"http://127.0.0.1:{port}"
        self.client_id = uuid.uuid4().hex
        self.ws: aiohttp.ClientWebSocketResponse | None = None

    async def wait_up(self, probe: str, process: subprocess.Popen[bytes], limit: float) -> None:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"{probe}: the process exited with {process.returncode}")
            try:
                async with self.session.get(self.url + probe) as response:
                    if response.status == 200 and await response.json():
                        return
            except (aiohttp.ClientError, ValueError):
                pass
            await asyncio.sleep(0.2)
        raise RuntimeError(f"{self.url}{probe} did not answer within {limit} s")

    async def connect(self) -> None:
        self.ws = await self.session.ws_connect(f"{self.url}/ws?clientId={self.client_id}")

    async def queue(self, prompt: dict[str, Any]) -> str:
        body = {"prompt": prompt, "client_id": self.client_id}
        async with self.session.post(self.url + "/prompt", json=body) as response:
            answer = await response.json()
            if response.status != 200:
                raise RuntimeError(json.dumps(answer)[:2000])
            prompt_id: str = answer["prompt_id"]
            return prompt_id

    async def ended(self, prompt_id: str) -> str:
        """How the prompt ended: the type of its last execution_* frame."""
        assert self.ws is not None
        async for message in self.ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                continue
            frame = json.loads(message.data)
            data = frame.get("data") or {}
            if data.get("prompt_id") != prompt_id:
                continue
            if frame["type"] in ("execution_success", "execution_error", "execution_interrupted"):
                if frame["type"] == "execution_error":
                    print("   ", data.get("exception_type"), data.get("exception_message"))
                kind: str = frame["type"]
                return kind
        raise RuntimeError("the WebSocket closed")

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()

    async def history(self, prompt_id: str) -> dict[str, Any]:
        for _ in range(100):
            async with self.session.get(f"{self.url}/history/{prompt_id}") as response:
                found: dict[str, Any] = await response.json()
            if prompt_id in found:
                entry: dict[str, Any] = found[prompt_id]
                return entry
            await asyncio.sleep(0.1)
        raise RuntimeError(f"no history for {prompt_id}")


class ComfyUIProcess:
    """Real ComfyUI with the pack, in a user directory that outlives a restart."""

    def __init__(self, comfyui: Path, root: Path, env: dict[str, str]) -> None:
        self.comfyui = comfyui
        self.root = root
        self.port = free_port()
        self.env = env
        self.process: subprocess.Popen[bytes] | None = None
        self.paths = pack_paths(root / "pack")
        (root / "base" / "custom_nodes").mkdir(parents=True, exist_ok=True)

    def start(self) -> subprocess.Popen[bytes]:
        command = [
            comfy_python(self.comfyui),
            str(self.comfyui / "main.py"),
            "--cpu",
            "--listen",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--base-directory",
            str(self.root / "base"),
            "--extra-model-paths-config",
            str(self.paths),
        ]
        log = (self.root / "comfyui.log").open("ab")
        self.process = subprocess.Popen(
            command, cwd=self.root, env=self.env, stdout=log, stderr=subprocess.STDOUT
        )
        return self.process

    def stop(self) -> None:
        """SIGKILL, as a crash would: nothing gets to tidy up."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()


async def emulator(latency: float) -> tuple[TestServer, EmulatorState]:
    settings = EmulatorSettings(latency=latency, jitter=0.0, seed=7, keys=["bench-key"])
    app = build_emulator_app(settings)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server, emulator_state(app)


async def started(
    comfy: ComfyUIProcess, session: aiohttp.ClientSession, limit: float = 120.0
) -> Server:
    process = comfy.start()
    server = Server(session, comfy.port)
    await server.wait_up("/object_info/Concurrent%20Collect%20Images%20(30)", process, limit)
    await server.connect()
    return server


async def fan_out(
    server: Server, state: EmulatorState, url: str, jobs: int, latency: float, tag: str, kind: str
) -> float:
    """One batch (`tag` makes its seeds, so no result comes from the journal; `kind`
    names its figure); its time."""
    before = state.stats()["jobs"]
    known = set(state.tasks)
    begun = time.monotonic()
    prompt_id = await server.queue(batch(url, jobs, tag))
    ended = await server.ended(prompt_id)
    finished = time.monotonic()
    elapsed = finished - begun
    entry = await server.history(prompt_id)
    report = json.loads(entry["outputs"]["c0"]["text"][0])
    sent = state.stats()["jobs"] - before
    new = [task for task_id, task in state.tasks.items() if task_id not in known]
    created = sorted(task.ready_at - task.duration for task in new)
    ready = max(task.ready_at for task in new)
    print(
        f"  {jobs} jobs x {latency:g} s inside ComfyUI ({tag}): {ended}, {elapsed:.2f} s "
        f"(ideal {latency:g} s, ratio {elapsed / latency:.3f}x), counts {report['counts']}, "
        f"jobs at the emulator {sent}, result sizes {sorted({t.size for t in new})}\n"
        f"    first job created after {(created[0] - begun) * 1000:.0f} ms, the last "
        f"{(created[-1] - begun) * 1000:.0f} ms; the prompt ended "
        f"{(finished - ready) * 1000:.0f} ms after the last job was ready"
    )
    figure(f"inside_jobs{jobs}_{kind}_sent", sent, "count", jobs)
    return elapsed


async def interrupt(server: Server, state: EmulatorState, url: str, jobs: int) -> None:
    before = state.stats()
    prompt_id = await server.queue(batch(url, jobs, "interrupted", mode="fail_fast"))
    deadline = time.monotonic() + 30
    while state.stats()["jobs"] - before["jobs"] < jobs and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    running = state.stats()["jobs"] - before["jobs"]
    begun = time.perf_counter()
    async with server.session.post(server.url + "/interrupt", json={}) as response:
        assert response.status == 200, response.status
    ended = await server.ended(prompt_id)
    elapsed = time.perf_counter() - begun
    await asyncio.sleep(0.5)  # any cancel still in flight lands
    after = state.stats()
    cancelled = after["cancelled"] - before["cancelled"]
    downloads = after["downloads"] - before["downloads"]
    print(
        f"  interrupt with {running} jobs running: {ended} after {elapsed * 1000:.0f} ms, "
        f"cancelled at the emulator {cancelled} of {running}, results downloaded {downloads}"
    )
    figure("interrupt_cancelled", cancelled, "count", running)
    figure("interrupt_downloads", downloads, "count")
    figure("interrupt_ms", elapsed * 1000, "ms")


async def after_restart(
    comfy: ComfyUIProcess, before: Server, state: EmulatorState, url: str, jobs: int
) -> Server:
    await before.close()
    comfy.stop()
    session = before.session
    begun = time.perf_counter()
    server = await started(comfy, session)
    print(f"  ComfyUI killed and started again: up in {time.perf_counter() - begun:.1f} s")
    before = state.stats()["jobs"]
    begun = time.perf_counter()
    prompt_id = await server.queue(batch(url, jobs, "warm0"))  # ran before the restart
    ended = await server.ended(prompt_id)
    elapsed = time.perf_counter() - begun
    entry = await server.history(prompt_id)
    report = json.loads(entry["outputs"]["c0"]["text"][0])
    sent = state.stats()["jobs"] - before
    print(
        f"  a batch queued again after the restart: {ended} in {elapsed:.2f} s, "
        f"counts {report['counts']}, new jobs at the emulator {sent} (target 0)"
    )
    figure("requeue_after_restart_new_jobs", sent, "count")
    return server


async def through_gateway(
    comfy: ComfyUIProcess, session: aiohttp.ClientSession, state: EmulatorState, url: str
) -> None:
    port = free_port()
    data = comfy.root / "gateway"
    command = [
        str(ROOT / ".venv" / "bin" / "comfyfleet"),
        "serve",
        "--port",
        str(port),
        "--data-dir",
        str(data),
        "--local-slots",
        "4",  # the gateway's own engine could run fan-out nodes, but not ImageSharpen
        "--backend",
        f"http://127.0.0.1:{comfy.port}",
    ]
    log = (comfy.root / "gateway.log").open("ab")
    process = subprocess.Popen(command, env=comfy.env, stdout=log, stderr=subprocess.STDOUT)
    try:
        gateway = Server(session, port)
        await gateway.wait_up(f"/object_info/{LOCAL_NODE}", process, 60)
        await gateway.connect()
        jobs = 8
        before = state.stats()["jobs"]
        begun = time.perf_counter()
        prompt_id = await gateway.queue(mixed(url, jobs, "mixed"))
        ended = await gateway.ended(prompt_id)
        elapsed = time.perf_counter() - begun
        entry = await gateway.history(prompt_id)
        images = entry["outputs"].get("save", {}).get("images", [])
        sent = state.stats()["jobs"] - before
        async with session.get(f"{gateway.url}/api/jobs/{prompt_id}") as response:
            lane = (await response.json()).get("lane") or ""
        print(
            f"  mixed graph through the gateway ({jobs} submits, collector, {LOCAL_NODE}, "
            f"SaveImage): {ended} in {elapsed:.2f} s on lane {lane}, jobs {sent}, "
            f"saved images {len(images)}"
        )
        await gateway.close()
        figure("mixed_via_gateway_wall", elapsed, "s")
        figure(
            "mixed_via_gateway_ok",
            int(ended == "execution_success" and len(images) == 1),
            "count",
            1,
        )
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def main(comfyui: Path, latency: float, jobs: int, keep: Path | None) -> None:
    emu, state = await emulator(latency)
    url = str(emu.make_url("")).rstrip("/")
    with tempfile.TemporaryDirectory(prefix="bench-pack-") as tmp:
        root = Path(tmp) if keep is None else keep.resolve()
        root.mkdir(parents=True, exist_ok=True)
        paths = [str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(path for path in paths if path),
            "BENCH_PACK_KEY": "bench-key",
        }
        comfy = ComfyUIProcess(comfyui, root, env)
        try:
            async with aiohttp.ClientSession() as session:
                server = await started(comfy, session)
                print(f"fan-out inside ComfyUI ({comfyui}), emulator jobs of {latency:g} s")
                # The first prompt also pays ComfyUI's and the pack's first-use costs.
                first = await fan_out(server, state, url, jobs, latency, "first", "first")
                figure(f"inside_jobs{jobs}_first_wall", first, "s", latency)
                # One batch varies by tens of ms with what else the cores do: the median.
                warm = [
                    await fan_out(server, state, url, jobs, latency, f"warm{n}", "warm")
                    for n in range(WARM_RUNS)
                ]
                median = statistics.median(warm)
                print(
                    f"  warm: median {median:.2f} s of {WARM_RUNS} "
                    f"({', '.join(f'{w:.2f}' for w in warm)})"
                )
                figure(f"inside_jobs{jobs}_warm_wall", median, "s", latency)
                await interrupt(server, state, url, jobs)
                server = await after_restart(comfy, server, state, url, jobs)
                await through_gateway(comfy, session, state, url)
                await server.close()
        finally:
            comfy.stop()
            await emu.close()
        leaked = sum(
            path.read_bytes().count(b"bench-key")
            for path in root.rglob("*")
            if path.is_file() and path.suffix in (".log", ".db", ".json", ".png", ".db-wal")
        )
        print(f"  the key in logs, journals and images: {leaked} time(s) (target 0)")
        figure("key_leaks", leaked, "count")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--latency", type=float, default=2.0, help="seconds per job")
    parser.add_argument("--jobs", type=int, default=30, help="submits in the batch")
    parser.add_argument("--poll", type=float, default=0.5, help="the submits' poll interval")
    parser.add_argument(
        "--keep", type=Path, help="work in this folder and keep it (logs, journal, outputs)"
    )
    args = parser.parse_args()
    POLL["interval"] = args.poll
    directory = os.environ.get("COMFYUI_DIR")
    if not directory:
        print("bench_pack: COMFYUI_DIR is not set (a ComfyUI checkout); skipped")
        sys.exit(0)
    asyncio.run(main(Path(directory).resolve(), args.latency, args.jobs, args.keep))
