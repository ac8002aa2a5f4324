"""The graph editor served by default (comfyui-frontend-package 1.58.1), in a real headless
browser.

A new user opens it: every route it calls answers (its subgraph blueprints, its template
indexes with the providers' logos), as recorded in
tests/data/comfyui-editor/routes-1.58.1.json. A workflow dropped on the canvas runs on
the fleet; the editor's job queue and its assets panel list the fleet's jobs and their
images, a job sent by a script as well as the editor's own (beside one cancelled while
it ran), and the assets panel's
"Imported" tab the fleet's input files. A job that failed outside any node is listed too,
and the others still are.

COMFYFLEET_RECORD_ROUTES=1 writes the recording again.
"""

from __future__ import annotations

import io
import json
import os
import time
import urllib.request
from pathlib import Path
from typing import Any

from PIL import Image

from tests.browser.conftest import PageLog, screenshot
from tests.browser.editors import DEFAULT
from tests.browser.test_editor import (
    DROP,
    EXAMPLE,
    SHOWS_IMAGE,
    fail_outside_any_node,
    fleet_of_one_backend,
)
from tests.integration.gateway.wire import sleep_prompt
from tests.servers import ServerProcess

VERSION = DEFAULT.version
REPO = Path(__file__).resolve().parents[2]
ROUTES = REPO / "tests" / "data" / "comfyui-editor" / f"routes-{VERSION}.json"
#: What this editor asks and a new user has not got (as with 1.27.10, tests/browser/
#: test_editor.py): user.css, saved workflows, saved subgraphs, saved templates.
EXPECTED_404 = {
    "GET /user.css",
    "GET /api/userdata/user.css",
    "GET /api/userdata?dir=workflows&recurse=true&split=false&full_info=true",
    "GET /api/userdata?dir=subgraphs&recurse=true&split=false&full_info=true",
    "GET /api/userdata/comfy.templates.json",
}
#: The editor's own files (hashed names that change with every build) and the
#: templates' thumbnails: files, not routes. The templates' indexes are recorded.
FILES = ("/assets/", "/fonts/", "/cursor/", "/materialdesignicons")
READY = "() => window.app && window.app.graph && window.LiteGraph && app.graph.nodes"


def route_of(method: str, path: str) -> str:
    """A request as recorded: method and path, the query kept except /view's file names."""
    if path.startswith("/api/view?"):
        path = "/api/view"
    return f"{method} {path}"


def watch_routes(page: Any, origin: str) -> dict[str, int]:
    """Every route the page calls (not its own files), with the status last answered."""
    seen: dict[str, int] = {}

    def answered(response: Any) -> None:
        path = response.url.removeprefix(origin)
        thumbnail = path.startswith("/templates/") and not path.startswith("/templates/index")
        if not path.startswith(FILES) and not thumbnail:
            seen[route_of(response.request.method, path)] = response.status

    page.on("response", answered)
    return seen


def open_new_editor(
    context: Any, server: ServerProcess, frames: list[str] | None = None
) -> tuple[Any, PageLog, dict[str, int]]:
    """The editor, loaded; `frames` gets the text frames its WebSocket receives."""
    page = context.new_page()
    log = PageLog(server.url)
    log.watch(page)
    if frames is not None:
        page.on("websocket", lambda ws: ws.on("framereceived", lambda f: frames.append(str(f))))
    seen = watch_routes(page, server.url)
    page.goto(server.url + "/")
    page.wait_for_function(READY, timeout=60_000)
    return page, log, seen


def upload(server: ServerProcess, name: str) -> None:
    """An image uploaded to the fleet's input folder, as a script would (not the editor)."""
    png = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 40, 40)).save(png, "PNG")
    boundary = "fleet-boundary-7f3a"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="{name}"\r\n'
            "Content-Type: image/png\r\n\r\n"
        ).encode()
        + png.getvalue()
        + f"\r\n--{boundary}--\r\n".encode()
    )
    request = urllib.request.Request(
        server.url + "/upload/image",
        data=body,
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200


def cancel_while_running(server: ServerProcess) -> None:
    """A job interrupted while it runs: among the finished ones as cancelled."""
    job_id = server.post("/api/prompt", {"prompt": sleep_prompt(30)})["prompt_id"]
    deadline = time.monotonic() + 20
    while server.get(f"/api/jobs/{job_id}")["status"] != "in_progress":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    server.post(f"/api/jobs/{job_id}/cancel", None)
    while server.get(f"/api/jobs/{job_id}")["status"] != "cancelled":
        assert time.monotonic() < deadline
        time.sleep(0.1)


def serve(data: Path) -> ServerProcess:
    server = ServerProcess(data).start()
    # No outside network here: the check for new ComfyUI releases is off.
    server.post("/api/settings", {"Comfy.Notification.ShowVersionUpdates": False})
    return server


def test_the_new_editor_calls_only_routes_that_answer_and_runs_a_workflow(
    browser: Any, emulator: str, tmp_path: Path
) -> None:
    server = serve(tmp_path / "data")
    try:
        context = browser.new_context(viewport={"width": 1600, "height": 1000})
        with context.expect_event(
            "response", lambda r: r.url.endswith("/templates/index_logo.json")
        ) as logos:
            page, log, seen = open_new_editor(context, server)
        # A new user's editor opens its template browser, with the providers' logos.
        page.get_by_role("heading", name="Templates", exact=True).first.wait_for()
        assert logos.value.status == 200
        assert isinstance(logos.value.json(), dict)
        page.keyboard.press("Escape")
        workflow = EXAMPLE.read_text().replace("http://127.0.0.1:8299", emulator)
        page.evaluate(DROP, {"name": EXAMPLE.name, "text": workflow})
        page.wait_for_function(
            "() => app.graph.getNodeById(4)?.type === 'Concurrent Collect Images (30)'"
        )
        with page.expect_response(lambda r: r.url.endswith("/api/prompt")) as queued:
            page.get_by_role("button", name="Run", exact=True).first.click()
        assert queued.value.status == 200
        prompt_id = queued.value.json()["prompt_id"]
        for node in (5, 6):
            page.wait_for_function(SHOWS_IMAGE, arg=node, timeout=30_000)
        assert server.get(f"/history/{prompt_id}")[prompt_id]["status"]["status_str"] == "success"
        assert seen["GET /api/global_subgraphs"] == 200
        check_routes(seen)
        assert log.elsewhere == []
        context.close()
    finally:
        server.kill()


def check_routes(seen: dict[str, int]) -> None:
    """No route the editor called failed, save the expected 404s, and each is recorded."""
    failed = {route for route, status in seen.items() if status >= 400}
    assert failed <= EXPECTED_404, failed - EXPECTED_404
    if os.environ.get("COMFYFLEET_RECORD_ROUTES") == "1":
        # Each test adds what it saw: one file for both.
        ROUTES.write_text(json.dumps(recording({**recorded_routes(), **seen}), indent=1) + "\n")
    recorded = recorded_routes()
    assert {route: recorded.get(route) for route in seen} == seen


def recorded_routes() -> dict[str, int]:
    if not ROUTES.is_file():
        return {}
    entries = json.loads(ROUTES.read_text())["routes"]
    return {f"{e['method']} {e['path']}": e["status"] for e in entries}


def recording(seen: dict[str, int]) -> dict[str, Any]:
    routes = [
        {"method": r.split(" ", 1)[0], "path": r.split(" ", 1)[1], "status": s}
        for r, s in sorted(seen.items(), key=lambda item: item[0].split(" ", 1)[::-1])
    ]
    return {
        "frontend_version": VERSION,
        "description": (
            "The routes the graph editor calls through comfyfleet, from a fresh user "
            "directory: loading, the template browser, running a dropped workflow, the "
            "job queue and the assets panel. Recorded by tests/browser/test_editor_1_58.py "
            "(COMFYFLEET_RECORD_ROUTES=1)."
        ),
        "routes": routes,
    }


def test_the_new_editors_queue_and_assets_panels_show_the_fleets_jobs(
    browser: Any, tmp_path: Path
) -> None:
    server = serve(tmp_path / "data")
    try:
        server.post("/api/settings", {"Comfy.TutorialCompleted": True})
        # A script, not the editor, runs a prompt on the fleet.
        prompt = json.loads((EXAMPLE.parent / "invert.json").read_text())
        prompt_id = server.post("/api/prompt", {"prompt": prompt})["prompt_id"]
        deadline = time.monotonic() + 20
        while prompt_id not in server.get(f"/history/{prompt_id}") and time.monotonic() < deadline:
            time.sleep(0.1)
        image = server.get(f"/history/{prompt_id}")[prompt_id]["outputs"]["3"]["images"][0]
        name = image["filename"]
        cancel_while_running(server)
        context = browser.new_context(viewport={"width": 1600, "height": 1000})
        page, log, seen = open_new_editor(context, server)
        # The job queue (the "0 active" button): the finished job, by its image.
        page.get_by_role("button", name="active").first.click()
        page.get_by_text("Job Queue", exact=True).wait_for()
        page.get_by_text(name, exact=True).wait_for()
        screenshot(page, "editor-1.58-queue.png")
        page.keyboard.press("Escape")
        # The assets panel: the same image among the generated files, shown.
        page.get_by_role("button", name="Assets").first.click()
        page.get_by_text("Media Assets", exact=True).wait_for()
        page.get_by_text(name.rsplit(".", 1)[0], exact=True).wait_for()
        page.wait_for_function(
            """(name) => [...document.images].some(img => img.src.includes(name)
                && img.complete && img.naturalWidth > 0)""",
            arg=name,
        )
        screenshot(page, "editor-1.58-assets.png")
        # Its "Imported" tab: the files uploaded to the fleet's input folder.
        upload(server, "imported-here.png")
        page.get_by_text("Imported", exact=True).click()
        page.get_by_text("imported-here", exact=False).first.wait_for()
        check_routes(seen)
        assert log.elsewhere == []
        context.close()
    finally:
        server.kill()


def test_a_job_failed_outside_any_node_is_listed_with_the_others(
    browser: Any, tmp_path: Path
) -> None:
    """The editor drops its whole list of jobs when one does not parse: the queue and the
    assets panels would show none. The failed job is listed, with its message."""
    fleet = fleet_of_one_backend(tmp_path)
    with fleet as (server, backend):
        server.post("/api/settings", {"Comfy.TutorialCompleted": True})
        done = server.get("/api/jobs?status=completed")["jobs"][0]["id"]
        name = server.get(f"/history/{done}")[done]["outputs"]["3"]["images"][0]["filename"]
        context = browser.new_context(viewport={"width": 1600, "height": 1000})
        frames: list[str] = []
        page, log, _ = open_new_editor(context, server, frames)
        # It fails while the editor is open: its `execution_error` frame (node_id null,
        # as /history keeps it) reaches the editor too.
        failed = fail_outside_any_node(server, backend, page)
        sent = server.get(f"/history/{failed}")[failed]["status"]["messages"][-1]
        assert (sent[0], sent[1]["node_id"]) == ("execution_error", None)
        sent_to_editor = False
        for _ in range(100):  # Playwright hands over events only while it is called
            sent_to_editor = any('"execution_error"' in frame for frame in frames)
            if sent_to_editor:
                break
            page.wait_for_timeout(100)
        assert sent_to_editor
        # The job queue: the finished job by its image, the failed one with its message.
        page.get_by_role("button", name="active").first.click()
        page.get_by_text("Job Queue", exact=True).wait_for()
        page.get_by_text(name, exact=True).wait_for()
        page.get_by_role("button", name="Failed", exact=True).first.click()
        page.get_by_text("Failed", exact=True).last.hover()  # its details
        page.get_by_text("the job failed on its lane 1 times", exact=False).wait_for()
        page.keyboard.press("Escape")
        # The assets panel: the finished job's image (a failed job has none to show).
        page.get_by_role("button", name="Assets").first.click()
        page.get_by_text("Media Assets", exact=True).wait_for()
        page.get_by_text(name.rsplit(".", 1)[0], exact=True).wait_for()
        assert [e for e in log.errors if "Jobs API" in e or e.startswith("uncaught")] == []
        context.close()
