"""What the loopback ComfyUI backends of the tests share: the routes a ComfyUI lane calls,
and a server on a free port. A backend subclasses it and answers the routes that make it
what it is (`_object_info`, `_prompt_info`, `_submit`, `_view`, `_ws`)."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.servers import free_port


class LoopbackComfyUI:
    _server: TestServer | None
    _history: dict[str, Any]  # prompt id -> history entry

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.port}"

    def comfyui_app(self) -> web.Application:
        """An app answering the routes a ComfyUI lane calls; add routes of your own to it."""
        app = web.Application()
        app.router.add_get("/object_info", self._object_info)
        app.router.add_get("/models", self._models)
        app.router.add_get("/prompt", self._prompt_info)
        app.router.add_post("/prompt", self._submit)
        app.router.add_get("/queue", self._queue)
        app.router.add_post("/queue", self._ok)
        app.router.add_post("/interrupt", self._ok)
        app.router.add_get("/history/{prompt_id}", self._history_of)
        app.router.add_get("/view", self._view)
        app.router.add_get("/ws", self._ws)
        return app

    async def serve(self, app: web.Application) -> None:
        self._server = TestServer(app, host="127.0.0.1", port=free_port())
        await self._server.start_server()

    async def stop_serving(self) -> None:
        if self._server is not None:
            await self._server.close()

    # -- the routes every such backend answers alike ----------------------------------

    async def _models(self, _request: web.Request) -> web.Response:
        return web.json_response([])

    async def _queue(self, _request: web.Request) -> web.Response:
        return web.json_response({"queue_running": [], "queue_pending": []})

    async def _ok(self, _request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _history_of(self, request: web.Request) -> web.Response:
        prompt_id = request.match_info["prompt_id"]
        entry = self._history.get(prompt_id)
        return web.json_response({prompt_id: entry} if entry is not None else {})

    # -- the routes each backend answers its own way ----------------------------------

    async def _object_info(self, request: web.Request) -> web.StreamResponse:
        raise NotImplementedError

    async def _prompt_info(self, request: web.Request) -> web.StreamResponse:
        raise NotImplementedError

    async def _submit(self, request: web.Request) -> web.StreamResponse:
        raise NotImplementedError

    async def _view(self, request: web.Request) -> web.StreamResponse:
        raise NotImplementedError

    async def _ws(self, request: web.Request) -> web.StreamResponse:
        raise NotImplementedError
