"""A worker connected to one gateway of a shared PostgreSQL store, and a client of
another: the worker's nodes (here a custom node only it loads) are known to both
gateways, a prompt using them is accepted by either and run on the worker once, and
they are forgotten when the worker leaves or its gateway dies."""

from __future__ import annotations

import io
import signal
import urllib.error
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from tests.integration.fleet.harness import poll
from tests.integration.gateway.processes import job, submit
from tests.integration.gateway.test_peer_files import two_gateways
from tests.integration.workers.test_workers import TOKEN, WorkerProcess
from tests.servers import ServerProcess

NODE = "WorkerOnlyInvert"
PACK = f'''
import numpy as np


class {NODE}:
    @classmethod
    def INPUT_TYPES(cls):
        return {{"required": {{"image": ("IMAGE",)}}}}

    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "invert"
    CATEGORY = "testing"

    def invert(self, image):
        return (1.0 - image,)


NODE_CLASS_MAPPINGS = {{"{NODE}": {NODE}}}
'''


def prompt(color: int) -> dict[str, Any]:
    return {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": 4, "height": 4, "batch_size": 1, "color": color},
        },
        "2": {"class_type": NODE, "inputs": {"image": ["1", 0]}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "w"}},
    }


def refused(server: ServerProcess, body: dict[str, Any]) -> int | None:
    """The status of a refused submit, None when it was accepted."""
    try:
        server.post("/prompt", body)
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code
    return None


def knows(server: ServerProcess) -> bool:
    return NODE in server.get("/object_info")


@pytest.fixture
def fleet(
    tmp_path: Path, postgres_database: str
) -> Iterator[tuple[ServerProcess, ServerProcess, WorkerProcess]]:
    """gw-a takes workers, gw-b does not; neither runs anything itself."""
    config = tmp_path / "gateway-a.toml"
    config.write_text(f'[[worker_tokens]]\nname = "pool"\ntoken = "{TOKEN}"\n')
    pack = tmp_path / "pack" / "worker_only"
    pack.mkdir(parents=True)
    (pack / "__init__.py").write_text(PACK)
    with ExitStack() as stack:
        a, b = two_gateways(
            stack,
            tmp_path,
            postgres_database,
            a_args=("--local-slots", "0", "--config", str(config)),
            b_args=("--local-slots", "0"),
        )
        worker = WorkerProcess(
            a.url, tmp_path / "w0", "w0", "--custom-nodes", str(pack.parent), "--grace", "10"
        )
        stack.callback(worker.kill)
        yield a, b, worker


def test_a_prompt_for_a_worker_of_another_gateway_is_accepted_and_run_there(
    fleet: tuple[ServerProcess, ServerProcess, WorkerProcess],
) -> None:
    a, b, worker = fleet
    poll(lambda: knows(a), what="the worker's node at its gateway", timeout=60)
    poll(lambda: knows(b), what="the worker's node at the other gateway", timeout=15)
    prompt_id = submit(b, prompt(0x102030))
    poll(lambda: job(b, prompt_id)["status"] == "completed", what="the run", timeout=60)
    entry = b.get(f"/history/{prompt_id}")[prompt_id]
    assert entry["status"]["status_str"] == "success"
    assert job(b, prompt_id)["lane"] == "backend:worker-pool.w0"
    [saved] = entry["outputs"]["3"]["images"]
    view = b.get_bytes(f"/view?filename={saved['filename']}&type=output")
    with Image.open(io.BytesIO(view)) as image:
        assert image.convert("RGB").getpixel((0, 0)) == (0xEF, 0xDF, 0xCF)  # inverted there

    # The worker leaves: its node is forgotten by both, and a prompt needing it refused.
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.proc.wait(timeout=15) == 0
    poll(lambda: not knows(b), what="the other gateway to forget the node", timeout=15)
    assert refused(b, {"prompt": prompt(0)}) == 400


def test_a_dead_gateways_workers_are_not_counted_once_its_lease_ran_out(
    fleet: tuple[ServerProcess, ServerProcess, WorkerProcess],
) -> None:
    a, b, _worker = fleet
    poll(lambda: knows(b), what="the worker's node at the other gateway", timeout=60)
    assert a.proc is not None
    a.proc.kill()  # the worker's only way in is gone with it
    poll(lambda: not knows(b), what="the node to go with the lease (2 s)", timeout=15)
    assert refused(b, {"prompt": prompt(0)}) == 400
