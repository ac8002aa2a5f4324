"""Files any gateway serves: two `comfyfleet serve` processes on one PostgreSQL store,
each with its own data dir. An upload to one is used by a prompt the other runs (in its
engine, or on its ComfyUI backend), an output one wrote is viewed through the other,
the route between them takes only the fleet's signature, and a gone peer is a quick 404.
"""

from __future__ import annotations

import asyncio
import io
import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import asyncpg
import numpy as np
import pytest
from PIL import Image

from comfyfleet.peers.signing import KEY_NAME, PEER_FILE_ROUTE, signed_headers
from tests.integration.fleet.harness import backend_process
from tests.integration.gateway.processes import job, poll, submit
from tests.integration.gateway.wire import sleep_prompt
from tests.servers import ServerProcess

TOKEN = "peer-test-user-token-5c1e9a"


def two_gateways(
    stack: ExitStack,
    tmp_path: Path,
    url: str,
    b_args: tuple[str, ...] = (),
    a_args: tuple[str, ...] = (),
) -> tuple[ServerProcess, ServerProcess]:
    """gw-a and gw-b on one store, authentication on, one engine slot each (unless
    `a_args` or `b_args` says otherwise)."""
    started = []
    for name, extra in (("a", a_args), ("b", b_args)):
        server = ServerProcess(
            tmp_path / f"gateway-{name}",
            *("--store", url, "--gateway-id", f"gw-{name}", "--lease", "2s"),
            *("--auth-token", TOKEN, "--local-slots", "1", *extra),
            token=TOKEN,
        )
        started.append(stack.enter_context(server))
    return started[0], started[1]


@pytest.fixture
def pair(tmp_path: Path, postgres_database: str) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    with ExitStack() as stack:
        yield two_gateways(stack, tmp_path, postgres_database)


def picture(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (12, 16, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def pixels(data: bytes) -> Any:
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB"))


def upload(server: ServerProcess, data: bytes, name: str) -> dict[str, Any]:
    boundary = uuid.uuid4().hex
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="{name}"\r\n'
        "Content-Type: image/png\r\n\r\n"
    ).encode()
    body += data + f"\r\n--{boundary}--\r\n".encode()
    request = urllib.request.Request(
        server.url + "/upload/image",
        data=body,
        headers={
            "Content-Type": f"multipart/form-data; boundary={boundary}",
            "Authorization": f"Bearer {TOKEN}",
        },
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def fetch(
    server: ServerProcess, path: str, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    request = urllib.request.Request(server.url + path, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


def view(server: ServerProcess, **query: str) -> tuple[int, bytes]:
    return fetch(server, f"/view?{urlencode(query)}", {"Authorization": f"Bearer {TOKEN}"})


def load_and_save(image: str, prefix: str) -> dict[str, Any]:
    return {
        "1": {"class_type": "LoadImage", "inputs": {"image": image}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": prefix}},
    }


def finished(server: ServerProcess, prompt_id: str) -> dict[str, Any]:
    found: dict[str, Any] = {}

    def ended() -> bool:
        found.update(server.get(f"/history/{prompt_id}"))
        return prompt_id in found

    poll(ended, what=f"{prompt_id} in the history", timeout=60)
    entry: dict[str, Any] = found[prompt_id]
    assert entry["status"]["status_str"] == "success", entry["status"]
    return entry


def saved_file(entry: dict[str, Any]) -> dict[str, str]:
    (image,) = entry["outputs"]["2"]["images"]
    return {key: image[key] for key in ("filename", "subfolder", "type")}


def shared_key(url: str) -> bytes:
    async def read() -> bytes:
        conn = await asyncpg.connect(url)
        try:
            return bytes(
                await conn.fetchval("SELECT key FROM fleet_keys WHERE name = $1", KEY_NAME)
            )
        finally:
            await conn.close()

    return asyncio.run(read())


def peer_target(**query: str) -> str:
    return f"{PEER_FILE_ROUTE}?{urlencode(query, quote_via=quote)}"


def test_an_upload_runs_on_the_other_gateway_and_its_output_is_viewed_on_the_first(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = pair
    data = picture(1)
    uploaded = upload(a, data, "peer_in.png")
    assert uploaded == {"name": "peer_in.png", "subfolder": "", "type": "input"}
    assert not (b.data_dir / "input" / "peer_in.png").exists()

    # Queued on b, which validates it (LoadImage checks the file) and runs it at once.
    prompt_id = submit(b, load_and_save("peer_in.png", "peer/out"))
    entry = finished(a, prompt_id)
    assert job(a, prompt_id)["gateway"] == "gw-b"
    assert (b.data_dir / "input" / "peer_in.png").read_bytes() == data  # kept on b

    saved = saved_file(entry)
    assert not (a.data_dir / "output" / saved["subfolder"] / saved["filename"]).exists()
    status, from_a = view(a, **saved)
    assert status == 200
    assert (status, from_a) == view(b, **saved)  # byte for byte b's file
    assert np.array_equal(pixels(from_a), pixels(data))  # b's engine read a's upload
    kept = a.data_dir / "output" / saved["subfolder"] / saved["filename"]
    assert kept.read_bytes() == from_a  # kept on a: the next view is local
    assert view(a, **saved, preview="webp;50")[0] == 200


def test_a_prompt_queued_on_one_gateway_runs_on_the_other_with_its_upload(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = pair
    busy = submit(a, sleep_prompt(60.0, 7))  # a's only slot, for longer than any hand-over
    poll(lambda: job(a, busy)["status"] == "in_progress", what="a busy")
    assert job(a, busy)["gateway"] == "gw-a"
    data = picture(2)
    upload(a, data, "queued_in.png")
    prompt_id = submit(a, load_and_save("queued_in.png", "queued/out"))  # validated on a
    entry = finished(b, prompt_id)
    assert job(b, prompt_id)["gateway"] == "gw-b"  # b's idle slot took it from the queue
    status, body = view(b, **saved_file(entry))
    assert status == 200 and np.array_equal(pixels(body), pixels(data))


def test_the_route_between_gateways_takes_only_the_fleets_signature(
    pair: tuple[ServerProcess, ServerProcess], postgres_database: str
) -> None:
    a, b = pair
    upload(a, picture(3), "secret_in.png")
    submit(b, load_and_save("secret_in.png", "signed/out"))  # b fetches it: the key exists
    poll(lambda: (b.data_dir / "input" / "secret_in.png").exists(), what="b's copy")
    key = shared_key(postgres_database)
    target = peer_target(tenant="default", type="input", subfolder="", filename="secret_in.png")

    def signed(
        path: str = target, gateway: str = "gw-b", at: float | None = None, sign_key: bytes = key
    ) -> tuple[int, bytes]:
        now = time.time() if at is None else at
        return fetch(a, path, signed_headers(sign_key, gateway, "GET", path, now))

    assert signed()[0] == 200
    assert fetch(a, target)[0] == 403  # nothing signed
    assert fetch(a, target, {"Authorization": f"Bearer {TOKEN}"})[0] == 403  # a user's token
    assert signed(sign_key=b"x" * 32)[0] == 403  # another key
    assert signed(at=time.time() - 120)[0] == 403  # too old
    assert signed(gateway="gw-a")[0] == 403  # a's own id
    assert signed(gateway="gw-zz")[0] == 403  # no live gateway
    headers = signed_headers(key, "gw-b", "GET", target, time.time())
    assert fetch(a, target.replace("secret_in", "other_in"), headers)[0] == 403  # another file
    status, body = fetch(a, target, {**headers, "X-Comfyfleet-Signature": "0" * 64})
    assert status == 403 and json.loads(body)["error"]["type"] == "forbidden"

    # Signed, and still /view's checks: no way out of the tenant's folders.
    traversal = peer_target(tenant="default", type="input", subfolder="", filename="../x.png")
    assert signed(traversal)[0] == 400
    leaving = peer_target(tenant="default", type="input", subfolder="../..", filename="x.png")
    assert signed(leaving)[0] == 403
    bad_tenant = peer_target(tenant="../a", type="input", subfolder="", filename="x.png")
    assert signed(bad_tenant)[0] == 400
    other_tenant = peer_target(tenant="bob", type="input", subfolder="", filename="secret_in.png")
    assert signed(other_tenant)[0] == 404
    # Through /view, a traversing name is refused before any peer is asked.
    assert view(b, filename="../secret_in.png", type="input")[0] == 400
    assert view(b, filename="x.png", subfolder="../../..", type="input")[0] == 403

    assert a.terminate() == 0 and b.terminate() == 0
    for path in [*a.data_dir.rglob("*"), *b.data_dir.rglob("*")]:
        if path.is_file():
            content = path.read_bytes()
            assert key not in content and key.hex().encode() not in content, path


def test_a_gone_peer_is_a_quick_404(pair: tuple[ServerProcess, ServerProcess]) -> None:
    a, b = pair
    upload(b, picture(4), "only_on_b.png")
    assert view(a, filename="only_on_b.png", type="input")[0] == 200  # b is asked
    upload(b, picture(5), "lost.png")
    b.kill()  # its lease still holds for a while: a still lists it
    started = time.monotonic()
    assert view(a, filename="lost.png", type="input")[0] == 404
    assert time.monotonic() - started < 5
    assert view(a, filename="never.png", type="input")[0] == 404


def test_a_backend_lane_pushes_an_upload_another_gateway_holds(
    tmp_path: Path, postgres_database: str
) -> None:
    with ExitStack() as stack:
        backend = stack.enter_context(backend_process(tmp_path / "backend"))
        b_args = ("--local-slots", "0", "--backend", backend.url)
        a, b = two_gateways(stack, tmp_path, postgres_database, b_args)
        poll(
            lambda: all(s["state"] == "up" for s in b.get("/api/fleet/backends")["backends"]),
            what="b's backend up",
        )
        # a stays busy far longer than a slow machine takes to hand the prompt to b
        busy = submit(a, sleep_prompt(60.0, 9))
        poll(lambda: job(a, busy)["status"] == "in_progress", what="a busy")
        data = picture(6)
        upload(a, data, "pushed_in.png")
        prompt_id = submit(a, load_and_save("pushed_in.png", "pushed/out"))
        entry = finished(b, prompt_id)
        ran = job(b, prompt_id)
        assert ran["gateway"] == "gw-b" and ran["lane"].startswith("backend:"), ran
        status, body = view(a, **saved_file(entry))  # copied to b, then fetched by a
        assert status == 200 and np.array_equal(pixels(body), pixels(data))
