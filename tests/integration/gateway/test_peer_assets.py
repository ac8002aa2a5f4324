"""v2 assets uploaded through one gateway, used through another: two `comfyfleet serve`
processes on one PostgreSQL store, each with its own data dir. The other gateway fetches
the bytes from its peer, checked against the asset's blake3 hash, and keeps them.
"""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import blake3
import numpy as np
import pytest

from tests.integration.gateway.processes import poll
from tests.integration.gateway.test_peer_cancel import call
from tests.integration.gateway.test_peer_files import (
    TOKEN,
    fetch,
    picture,
    pixels,
    two_gateways,
    view,
)
from tests.servers import ServerProcess


@pytest.fixture
def pair(tmp_path: Path, postgres_database: str) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    with ExitStack() as stack:
        yield two_gateways(stack, tmp_path, postgres_database)


def upload_asset(server: ServerProcess, data: bytes, name: str) -> dict[str, Any]:
    boundary = uuid.uuid4().hex
    body = b""
    for field, value in (("content_type", "image/png"), ("file_path", name)):
        body += (
            f'--{boundary}\r\nContent-Disposition: form-data; name="{field}"\r\n\r\n{value}\r\n'
        ).encode()
    body += (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
        "Content-Type: image/png\r\n\r\n"
    ).encode()
    body += data + f"\r\n--{boundary}--\r\n".encode()
    request = urllib.request.Request(
        server.url + "/api/v2/assets",
        data=body,
        headers={
            "Content-Type": f"multipart/form-data; boundary={boundary}",
            "Authorization": f"Bearer {TOKEN}",
        },
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 201
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def content(server: ServerProcess, asset_id: str, **headers: str) -> tuple[int, bytes]:
    return fetch(
        server,
        f"/api/v2/assets/{asset_id}/content",
        {"Authorization": f"Bearer {TOKEN}", **headers},
    )


def blobs(server: ServerProcess) -> list[Path]:
    return sorted((server.data_dir / "input" / "assets").glob("*.png"))


def with_asset(asset_id: str) -> dict[str, Any]:
    reference = {"__type": "core/ASSET", "info": {"id": asset_id}}
    return {
        "1": {"class_type": "LoadImage", "inputs": {"image": reference}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "as"}},
    }


def succeeded(server: ServerProcess, job_id: str) -> dict[str, Any]:
    poll(
        lambda: (
            call(server, "GET", f"/api/v2/jobs/{job_id}")[1]["status"] not in ("queued", "running")
        ),
        what="the job's end",
        timeout=60,
    )
    found: dict[str, Any] = call(server, "GET", f"/api/v2/jobs/{job_id}")[1]
    assert found["status"] == "succeeded", found
    return found


def test_an_asset_uploaded_on_one_gateway_is_served_and_minted_on_the_other(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = pair
    data = picture(11)
    asset = upload_asset(a, data, "cat.png")
    assert asset["hash"] == "blake3:" + blake3.blake3(data).hexdigest()
    assert blobs(b) == []

    assert call(b, "HEAD", f"/api/v2/assets/by-hash/{asset['hash']}")[0] == 200
    assert content(b, asset["id"]) == (200, data)
    assert content(b, asset["id"], Range="bytes=2-9") == (206, data[2:10])
    (kept,) = blobs(b)
    assert kept.read_bytes() == data  # fetched once, kept here

    status, minted = call(b, "POST", "/api/v2/assets/from-hash", {"hash": asset["hash"]})
    assert status == 201 and minted["created_new"] is False and minted["id"] != asset["id"]
    assert content(b, minted["id"]) == (200, data)


def test_a_job_submitted_on_the_other_gateway_reads_the_asset(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = pair
    data = picture(12)
    asset = upload_asset(a, data, "dog.png")
    minted_on_b = call(b, "POST", "/api/v2/assets/from-hash", {"hash": asset["hash"]})
    assert minted_on_b[0] == 201  # the bytes only a holds, minted through b
    blobs(b)[0].unlink()  # b's copy gone again: the submit fetches it
    for asset_id in (asset["id"], minted_on_b[1]["id"]):
        status, created = call(b, "POST", "/api/v2/jobs", {"workflow": with_asset(asset_id)})
        assert status == 201, created
        done = succeeded(b, created["id"])
        (output,) = done["outputs"]
        status, saved = fetch(b, _path(output["url"]), {"Authorization": f"Bearer {TOKEN}"})
        assert status == 200 and np.array_equal(pixels(saved), pixels(data))


def _path(url: str) -> str:
    return "/" + url.split("/", 3)[3]


def test_bytes_that_do_not_have_the_assets_hash_are_refused(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = pair
    data = picture(13)
    asset = upload_asset(a, data, "bird.png")
    (blob,) = blobs(a)
    blob.write_bytes(picture(14))  # a now serves other bytes under the asset's name

    assert content(b, asset["id"])[0] == 404
    assert call(b, "HEAD", f"/api/v2/assets/by-hash/{asset['hash']}")[0] == 404
    status, body = call(b, "POST", "/api/v2/assets/from-hash", {"hash": asset["hash"]})
    assert status == 404 and body["error"]["code"] == "blob_not_found"
    status, body = call(b, "POST", "/api/v2/jobs", {"workflow": with_asset(asset["id"])})
    assert status == 422, body
    # Nor through the classic routes, which ask the same peer for the same name.
    assert view(b, filename=blob.name, subfolder="assets", type="input")[0] == 404
    assert blobs(b) == []  # nothing kept
    assert not list((b.data_dir / "input" / "assets").glob(".*"))  # nor left staged
