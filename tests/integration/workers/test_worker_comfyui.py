"""`comfyfleet worker --comfyui DIR`: the worker starts a real ComfyUI 0.3.64 (with the
companion pack) on loopback and the gateway, which has no lane of its own, runs
ComfyUI's core nodes there through the worker's connection.

Needs COMFYUI_DIR and COMFY_VENV (tests/real_comfyui.py); skipped without them.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from PIL import Image

from tests.integration.fleet.harness import poll
from tests.integration.workers.test_workers import CONFIG, TOKEN, lanes_up
from tests.real_comfyui import COMFY_VENV, COMFYUI_DIR, needs_comfyui
from tests.servers import ServerProcess

pytestmark = needs_comfyui


def test_a_worker_brings_a_comfyui_and_runs_its_core_nodes(tmp_path: Path) -> None:
    assert COMFYUI_DIR and COMFY_VENV
    config = tmp_path / "gateway.toml"
    config.write_text(CONFIG)
    with ServerProcess(tmp_path / "gateway", "--local-slots", "0", "--config", str(config)) as gw:
        command = [
            str(Path(sys.executable).parent / "comfyfleet"),
            *("worker", "--gateway", gw.url, "--name", "cpu0"),
            *("--comfyui", COMFYUI_DIR, "--comfyui-python", f"{COMFY_VENV}/bin/python"),
            *("--gpu", "cpu", "--data-dir", str(tmp_path / "worker")),
        ]
        env = {**os.environ, "COMFYFLEET_WORKER_TOKEN": TOKEN}
        with (tmp_path / "worker.log").open("wb") as log:
            worker = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            poll(lambda: lanes_up(gw, 1), what="the worker's ComfyUI", timeout=180)
            classes = gw.get("/object_info")
            assert {"KSampler", "CheckpointLoaderSimple", "ImageInvert"} <= set(classes)
            [backend] = gw.get("/api/fleet/backends")["backends"]
            assert backend["validates"]  # its companion pack answers
            prompt = {
                "1": {
                    "class_type": "EmptyImage",
                    "inputs": {"width": 8, "height": 4, "batch_size": 1, "color": 0x102030},
                },
                "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
                "3": {
                    "class_type": "SaveImage",
                    "inputs": {"images": ["2", 0], "filename_prefix": "w"},
                },
            }
            prompt_id = gw.post("/prompt", {"prompt": prompt})["prompt_id"]
            poll(lambda: bool(gw.get(f"/history/{prompt_id}")), what="the prompt", timeout=60)
            entry = gw.get(f"/history/{prompt_id}")[prompt_id]
            assert entry["status"]["status_str"] == "success"
            [image] = entry["outputs"]["3"]["images"]
            view = f"{gw.url}/view?filename={image['filename']}&type=output"
            with urllib.request.urlopen(view, timeout=10) as answer:
                saved = Image.open(io.BytesIO(answer.read())).convert("RGB")
            red, green, blue = saved.getpixel((0, 0))  # type: ignore[misc]
            assert abs(red - (255 - 0x10)) <= 1 and abs(blue - (255 - 0x30)) <= 1
            assert abs(green - (255 - 0x20)) <= 1
            # SIGTERM: the worker and its ComfyUI end; exit 0.
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(timeout=40) == 0
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
