"""The fleet inside one graph over two gateways on one PostgreSQL store: a parent
queued on gw-b (whose only lane is its engine, where parents wait) has its children
run on a worker of gw-a, reads what they made from gw-a, and the tiles it cut are
carried to gw-a for the worker."""

from __future__ import annotations

import io
import urllib.error
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from comfyfleet import latents
from tests.integration.fleet.harness import poll
from tests.integration.fleet.test_fleet_children import (
    INVERT,
    latent_prompt,
    seeded_latents,
    tiles_prompt,
)
from tests.integration.gateway.processes import job, submit
from tests.integration.gateway.test_peer_files import finished, two_gateways, upload, view
from tests.integration.workers.test_workers import TOKEN, WorkerProcess
from tests.servers import ServerProcess


@pytest.fixture
def pair(tmp_path: Path, postgres_database: str) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """gw-a: workers only (one joins); gw-b: one engine slot, where its parents wait."""
    config = tmp_path / "gateway-a.toml"
    config.write_text(f'[[worker_tokens]]\nname = "pool"\ntoken = "{TOKEN}"\n')
    with ExitStack() as stack:
        a, b = two_gateways(
            stack,
            tmp_path,
            postgres_database,
            a_args=("--local-slots", "0", "--config", str(config)),
        )
        worker = WorkerProcess(a.url, tmp_path / "w0", "w0", "--grace", "10")
        stack.callback(worker.kill)
        poll(lambda: worker_known(b), what="gw-b to follow the worker of gw-a", timeout=60)
        yield a, b


def worker_known(server: ServerProcess) -> bool:
    """Whether `server` accepts a prompt whose children need a backend or worker (its
    own engine never runs children, so the worker of the other gateway must be known)."""
    prompt = {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0},
        },
        "2": {
            "class_type": "Run on the Fleet",
            "inputs": {"image": ["1", 0], "count": 1, "vary": "seed"},
        },
        "3": {
            "class_type": "Collect from the Fleet",
            "inputs": {"batch": ["2", 0], "failure_mode": "fail_fast"},
        },
    }
    try:
        server.post("/comfyfleet/validate", {"prompt": prompt})
    except urllib.error.HTTPError as exc:
        with exc:
            return False
    return True


def children(server: ServerProcess, parent: str) -> list[dict[str, Any]]:
    listed = server.get("/api/jobs?limit=100")["jobs"]
    return [job(server, j["id"]) for j in listed if j["parent"] == parent]


def kept(server: ServerProcess, ref: dict[str, Any]) -> bytes:
    status, data = view(server, **{k: ref[k] for k in ("filename", "subfolder", "type")})
    assert status == 200, ref
    return data


def test_latents_made_behind_another_gateway_come_back(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    _, b = pair
    parent = submit(b, latent_prompt(5, 3))
    entry = finished(b, parent)
    assert job(b, parent)["gateway"] == "gw-b"
    (ref,) = entry["outputs"]["5"]["latents"]
    assert np.array_equal(latents.decode(kept(b, ref))["samples"], seeded_latents(5, 3))
    ran = children(b, parent)
    assert {(c["gateway"], c["lane"]) for c in ran} == {("gw-a", "backend:worker-pool.w0")}
    assert len(ran) == 3


def test_tiles_cut_on_one_gateway_run_behind_the_other(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    _, b = pair
    picture = np.random.default_rng(11).integers(0, 256, (40, 52, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(picture).save(buffer, format="PNG")
    upload(b, buffer.getvalue(), "two_tiles.png")
    prompt = tiles_prompt("two_tiles.png", INVERT, overlap=6)
    parent = submit(b, prompt)
    (ref,) = finished(b, parent)["outputs"]["5"]["images"]
    stitched = np.asarray(Image.open(io.BytesIO(kept(b, ref))).convert("RGB")).astype(int)
    assert np.abs(stitched - (255 - picture.astype(int))).max() <= 1
    ran = children(b, parent)
    assert len(ran) == 4 and {c["gateway"] for c in ran} == {"gw-a"}
    assert not list((b.data_dir / "input").glob("fleet-tile-*"))
