"""The editor loads the web extensions of the fleet's ComfyUI backends through the gateway:
`/extensions` lists each backend's node packs, and their files are fetched from the
backend that has them. What a backend lists is checked: names that are not plain paths,
the editor's own `core` and comfyfleet's own pack are never taken from it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.integration.fleet.scripted import ScriptedBackend
from tests.integration.gateway.wire import poll, serve

WIDGET = b"export const widget = 'from the backend';"


async def test_backend_packs_are_listed_and_fetched_from_the_backend(tmp_path: Path) -> None:
    backend = ScriptedBackend(
        extensions=[
            "/extensions/core/groupNode.js",  # the backend's own editor: ours is served
            "/extensions/widget%20pack/js/widget.js",
            "/extensions/widget%20pack/js/page.html",
            "/extensions/comfyfleet/fleet.js",  # comfyfleet's own pack is never replaced
            "/extensions/../../etc/passwd",
            "/extensions/evil/..%2F..%2Fsecret.js",
            "/elsewhere/x.js",
            "/extensions/lonely",
            42,  # type: ignore[list-item]
        ],
        web_files={
            "widget pack/js/widget.js": WIDGET,
            "widget pack/js/page.html": b"<script>alert(1)</script>",
            "comfyfleet/fleet.js": b"the backend's",
            "core/groupNode.js": b"the backend's",
        },
    )
    await backend.start()
    try:
        async with serve(tmp_path, local_slots=1, backends=(backend.url,)) as served:
            lane = next(iter(served.gateway.fleet.backends.values()))

            async def up() -> bool:
                return lane.connected

            async def down() -> bool:
                return not lane.connected

            await poll(up, what="the backend connected")
            listed = await served.get("/extensions")
            ours = [e for e in listed if not e.startswith("/extensions/core/")]
            assert ours == [
                "/extensions/comfyfleet/fleet.js",
                "/extensions/widget%20pack/js/widget.js",
                "/extensions/widget%20pack/js/page.html",
            ]
            assert "/extensions/core/groupNode.js" in listed  # once: the editor's own
            assert listed.count("/extensions/core/groupNode.js") == 1
            widget = await served.request("GET", "/extensions/widget%20pack/js/widget.js")
            assert widget.status == 200 and widget.text == WIDGET.decode()
            assert widget.content_type == "application/javascript"
            page = await served.request("GET", "/extensions/widget%20pack/js/page.html")
            assert page.content_type == "application/octet-stream"  # never HTML here
            own = await served.request("GET", "/extensions/comfyfleet/fleet.js")
            assert "registerExtension" in own.text
            core = await served.request("GET", "/extensions/core/groupNode.js")
            assert core.text.startswith("// Shim for extensions/core/groupNode")
            missing = await served.request("GET", "/extensions/widget%20pack/js/none.js")
            assert missing.status == 404
            # A backend that goes away takes its packs with it.
            await backend.close()
            await poll(down, what="the backend down")
            assert "/extensions/widget%20pack/js/widget.js" not in await served.get("/extensions")
            gone = await served.request("GET", "/extensions/widget%20pack/js/widget.js")
            assert gone.status == 404
    finally:
        await backend.close()
        await asyncio.sleep(0)
