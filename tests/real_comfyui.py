"""A real ComfyUI with comfyfleet's companion pack (fan-out nodes too), for tests that
check the pack inside ComfyUI itself, as `bench/bench_pack.py` loads it.

Needs a ComfyUI checkout with its venv: COMFYUI_DIR and COMFY_VENV (as `make
conformance` does); tests using it are skipped without them.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from comfyfleet.managed.pack import pack_paths
from tests.servers import free_port

COMFYUI_DIR = os.environ.get("COMFYUI_DIR")
COMFY_VENV = os.environ.get("COMFY_VENV")
needs_comfyui = pytest.mark.skipif(
    not (COMFYUI_DIR and COMFY_VENV), reason="needs COMFYUI_DIR and COMFY_VENV"
)
SRC = Path(__file__).resolve().parents[1] / "src"


@asynccontextmanager
async def comfyui_with_pack(
    folder: Path,
    env: Mapping[str, str],
    ready_node: str = "APISettings",
    *,
    testing_nodes: bool = False,
) -> AsyncIterator[str]:
    """ComfyUI on a free port with its base directory in `folder`, comfyfleet importable
    and `env` added to its environment; yields its URL once `ready_node` is known.
    `testing_nodes` also loads the testing nodes of ComfyUI's own execution suite
    (`TestSleep`, ...), as its tests do."""
    assert COMFYUI_DIR and COMFY_VENV
    port = free_port()
    command = [
        *(str(Path(COMFY_VENV) / "bin" / "python"), str(Path(COMFYUI_DIR) / "main.py")),
        *("--cpu", "--listen", "127.0.0.1", "--port", str(port)),
        *("--base-directory", str(folder / "base")),
        *("--extra-model-paths-config", str(pack_paths(folder / "pack"))),
    ]
    if testing_nodes:
        suite_paths = Path(COMFYUI_DIR) / "tests" / "execution" / "extra_model_paths.yaml"
        command += ["--extra-model-paths-config", str(suite_paths)]
    (folder / "base" / "custom_nodes").mkdir(parents=True)
    log_path = folder / "comfyui.log"
    with log_path.open("wb") as log:
        comfyui = subprocess.Popen(
            command,
            env={**os.environ, "PYTHONPATH": str(SRC), **env},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session, asyncio.timeout(120):
            while True:
                assert comfyui.poll() is None, log_path.read_text()
                try:
                    async with session.get(f"{url}/object_info/{ready_node}") as response:
                        if response.status == 200 and await response.json():
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.3)
        yield url
    finally:
        comfyui.terminate()
        await asyncio.to_thread(comfyui.wait, 30)
