"""A real aiohttp server with the file and system routes on temporary folders."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from PIL import Image

from comfyfleet.engine.executor import Engine
from comfyfleet.folders import Folders
from comfyfleet.nodes import build_registry
from comfyfleet.server.comfyui_api.system import system_routes
from comfyfleet.server.files.view_upload import file_routes
from comfyfleet.server.plumbing.middleware import OriginGuard, json_errors, origin_check
from comfyfleet.server.plumbing.routing import Route, install

MiB = 1024 * 1024
# Form fields in order: a text value, or (file name, bytes) for a file part.
Fields = list[tuple[str, str | tuple[str, bytes]]]


@dataclass
class Served:
    client: TestClient[web.Request, web.Application]
    folders: Folders
    engine: Engine
    root: Path

    @property
    def port(self) -> int:
        port = self.client.server.port
        assert port is not None
        return port


async def _queue_info(request: web.Request) -> web.StreamResponse:
    # Stands in for the prompt routes, which the Origin steps of the recording use.
    return web.json_response({"exec_info": {"queue_remaining": 0}})


@asynccontextmanager
async def serve(
    root: Path,
    *,
    max_upload_bytes: int = 100 * MiB,
    models_root: Path | None = None,
    extra: list[Route] | None = None,
) -> AsyncIterator[Served]:
    folders = Folders.under(root).ensure()
    engine = Engine(build_registry(testing=True), folders)
    app = web.Application(middlewares=[json_errors, origin_check(OriginGuard())])
    routes = file_routes(folders, max_upload_bytes=max_upload_bytes) + system_routes(
        engine, version="9.9.9", max_upload_bytes=max_upload_bytes, models_root=models_root
    )
    routes += [Route("GET", "/prompt", _queue_info), Route("POST", "/prompt", _queue_info)]
    install(app, routes + (extra or []))
    try:
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            yield Served(client, folders, engine, folders.output.parent)
    finally:
        engine.close()


def png_bytes(color: tuple[int, ...], size: tuple[int, int] = (8, 8), mode: str = "RGB") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size, color).save(buf, format="PNG")
    return buf.getvalue()


def open_image(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


def multipart(fields: Fields) -> tuple[bytes, str]:
    """A multipart/form-data body and its Content-Type, with file names sent verbatim.

    (aiohttp's FormData percent-encodes `/` in file names; browsers and ComfyUI's
    recorded client do not, and path checks must see the raw name.) Lone surrogates are
    written as their UTF-8-like bytes, which are not UTF-8: what a hostile client can send.
    """
    boundary = "comfyfleet-test-boundary"
    out = io.BytesIO()
    for name, value in fields:
        out.write(f"--{boundary}\r\n".encode())
        if isinstance(value, tuple):
            filename, data = value
            out.write(
                f'Content-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
                "Content-Type: image/png\r\n\r\n".encode("utf-8", "surrogatepass")
            )
            out.write(data)
        else:
            out.write(f'Content-Disposition: form-data; name="{name}"\r\n\r\n'.encode())
            out.write(value.encode("utf-8", "surrogatepass"))
        out.write(b"\r\n")
    out.write(f"--{boundary}--\r\n".encode())
    return out.getvalue(), f"multipart/form-data; boundary={boundary}"
