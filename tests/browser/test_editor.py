"""ComfyUI's graph editor, served by comfyfleet, in a real headless browser.

A user opens the editor, finds the fan-out nodes in the node library, drops an API-format
workflow (examples/flux-concurrent.json, its paid API played by the provider emulator),
runs it with the Run button and sees its output images on the Save Image nodes. Another
user saves a workflow in the editor and finds it again after the server restarted. Each
holds for the editor served by default (1.58.1) and for the one ComfyUI 0.3.64 pins
(1.27.10, with --front-end-root; tests/browser/editors.py). In 1.27.10 a job that failed
outside any node (its only backend died) shows its message, and the queue lists it
(1.58.1: tests/browser/test_editor_1_58.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import PageLog, screenshot
from tests.browser.editors import BOTH, PINNED, Editor, needs_pinned
from tests.integration.fleet.harness import backend_process, poll
from tests.integration.gateway.wire import sleep_prompt
from tests.servers import ServerProcess

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "flux-concurrent.json"
#: An error frontend 1.27.10 throws from its settings store on every load, with ComfyUI
#: 0.3.64 itself too: `onChange` reads the id of a setting it has not registered yet.
FRONTEND_ERROR = "uncaught: Cannot read properties of undefined (reading 'id')"
READY = (
    "() => window.app && window.app.graph && window.LiteGraph"
    " && LiteGraph.registered_node_types['Concurrent Collect Images (30)']"
)
DROP = """(file) => {
    const data = new DataTransfer();
    data.items.add(new File([file.text], file.name, {type: "application/json"}));
    const canvas = document.querySelector("#graph-canvas");
    for (const kind of ["dragenter", "dragover", "drop"]) {
        const init = {dataTransfer: data, bubbles: true, cancelable: true};
        canvas.dispatchEvent(new DragEvent(kind, init));
    }
}"""
SHOWS_IMAGE = """(id) => {
    const node = app.graph.getNodeById(id);
    return !!node && !!node.imgs && node.imgs.length > 0
        && node.imgs.every(img => img.complete && img.naturalWidth > 0);
}"""


def offline_user(server: ServerProcess) -> None:
    """The machine has no outside network: the user turned the editor's check for new
    ComfyUI releases off (its only request to the outside)."""
    server.post("/api/settings", {"Comfy.Notification.ShowVersionUpdates": False})


def open_editor(context: Any, server: ServerProcess, path: str = "/") -> tuple[Any, PageLog]:
    page = context.new_page()
    log = PageLog(server.url)
    log.watch(page)
    page.goto(server.url + path)
    page.wait_for_function(READY, timeout=30_000)
    return page, log


def assert_clean(log: PageLog, editor: Editor) -> None:
    unexpected = [(status, path) for status, path in log.failed if path not in editor.expected_404]
    assert unexpected == []
    # Each expected 404 is also a console line "Failed to load resource: ... 404".
    errors = [
        e
        for e in log.errors
        if "the server responded with a status of 404" not in e
        and not (e.startswith(FRONTEND_ERROR) and "at onChange (" in e)
    ]
    assert errors == []
    assert log.elsewhere == []


@pytest.mark.parametrize("editor", BOTH)
def test_the_editor_runs_a_dropped_workflow_on_the_fleet(
    browser: Any, emulator: str, tmp_path: Path, editor: Editor
) -> None:
    with ServerProcess(tmp_path / "data", *editor.serve_args()) as server:
        offline_user(server)
        context = browser.new_context(viewport={"width": 1600, "height": 1000})
        page, log = open_editor(context, server)
        assert page.evaluate("() => window.__COMFYUI_FRONTEND_VERSION__") == editor.version
        # A new user's editor opens its template browser (tests/browser/test_templates.py).
        page.get_by_text("Get Started with a Template").wait_for()
        page.keyboard.press("Escape")
        page.keyboard.press("n")  # the node library
        search = page.get_by_placeholder("Search Nodes...")
        for name in ("Concurrent Collect Images (30)", "Concurrent Submit | FLUX Image (BFL API)"):
            search.fill(name.split(" (")[0])
            page.get_by_text(name, exact=True).first.wait_for()
        page.get_by_text("Nodes", exact=True).first.click()  # the library closes
        workflow = EXAMPLE.read_text().replace("http://127.0.0.1:8299", emulator)
        page.evaluate(DROP, {"name": EXAMPLE.name, "text": workflow})
        page.wait_for_function(
            "() => app.graph.getNodeById(4)?.type === 'Concurrent Collect Images (30)'"
        )
        with page.expect_response(lambda r: r.url.endswith("/api/prompt")) as queued:
            page.get_by_role("button", name="Run").first.click()
        assert queued.value.status == 200
        prompt_id = queued.value.json()["prompt_id"]
        for node in (5, 6):
            page.wait_for_function(SHOWS_IMAGE, arg=node, timeout=30_000)
        # Nothing selected, then "fit view" (the whole graph, not the node last run).
        page.evaluate("() => app.canvas.deselectAll()")
        page.locator("#graph-canvas").focus()
        page.keyboard.press(".")
        page.wait_for_timeout(300)
        if editor is not PINNED:
            screenshot(page, "editor.png")
        entry = server.get(f"/history/{prompt_id}")[prompt_id]
        assert entry["status"]["status_str"] == "success"
        shown = page.evaluate("() => app.graph.getNodeById(5).imgs[0].src")
        assert entry["outputs"]["5"]["images"][0]["filename"] in shown
        assert_clean(log, editor)
        context.close()


@pytest.mark.parametrize("editor", BOTH)
def test_a_workflow_saved_in_the_editor_is_there_after_a_restart(
    browser: Any, tmp_path: Path, editor: Editor
) -> None:
    server = ServerProcess(tmp_path / "data", *editor.serve_args()).start()
    try:
        offline_user(server)
        context = browser.new_context(viewport={"width": 1600, "height": 1000})
        page, log = open_editor(context, server)
        page.get_by_text("Get Started with a Template").wait_for()
        page.keyboard.press("Escape")
        example = (EXAMPLE.parent / "invert.json").read_text()
        page.evaluate(DROP, {"name": "invert.json", "text": example})
        page.wait_for_function("() => app.graph.nodes.length > 1")
        page.keyboard.press("Control+s")
        name_box = page.get_by_role("dialog").get_by_role("textbox")
        name_box.fill("fleet-invert")
        with page.expect_response(lambda r: "/api/userdata/workflows%2Ffleet-invert.json" in r.url):
            name_box.press("Enter")
        page.close()
        server.terminate()
        server.start()  # same port, same data dir
        listing = "/api/userdata?dir=workflows&recurse=true&split=false&full_info=true"
        with context.expect_event("response", lambda r: r.url.endswith(listing)) as listed:
            page, log = open_editor(context, server)
        assert [f["path"] for f in listed.value.json()] == ["fleet-invert.json"]
        page.get_by_text("Workflows", exact=True).first.click()  # the workflows sidebar
        page.locator("text=fleet-invert >> visible=true").first.click()
        page.wait_for_function("() => app.graph.nodes.some(n => n.type === 'ImageInvert')")
        saved = server.get("/api/userdata?dir=workflows")
        assert saved == ["fleet-invert.json"]
        stored = json.loads(
            (tmp_path / "data" / "user" / "workflows" / "fleet-invert.json").read_text()
        )
        assert any(node["type"] == "ImageInvert" for node in stored["nodes"])
        assert_clean(log, editor)
        context.close()
    finally:
        server.kill()


AUTH_CONFIG = """
[[auth.tokens]]
token = "alice-browser-token-1a2b3c"
tenant = "alice"

[[auth.tokens]]
token = "bob-browser-token-4d5e6f"
tenant = "bob"
"""


@pytest.mark.parametrize("editor", BOTH)
def test_with_authentication_the_editor_works_with_a_token_and_sees_only_its_tenant(
    browser: Any, tmp_path: Path, editor: Editor
) -> None:
    config = tmp_path / "auth.toml"
    config.write_text(AUTH_CONFIG)
    alice_token = "alice-browser-token-1a2b3c"
    server = ServerProcess(
        tmp_path / "data", "--config", str(config), *editor.serve_args(), token=alice_token
    )
    server.start()
    try:
        for token in ("alice-browser-token-1a2b3c", "bob-browser-token-4d5e6f"):
            server.token = token
            offline_user(server)
        server.token = None
        # Alice opens the editor with her token in the URL: it moves to a cookie.
        alice = browser.new_context(viewport={"width": 1600, "height": 1000})
        page, log = open_editor(alice, server, "/?token=alice-browser-token-1a2b3c")
        assert page.url == server.url + "/"
        page.get_by_text("Get Started with a Template").wait_for()
        page.keyboard.press("Escape")
        page.evaluate(
            DROP, {"name": "invert.json", "text": (EXAMPLE.parent / "invert.json").read_text()}
        )
        page.wait_for_function("() => app.graph.nodes.length > 1")
        page.keyboard.press("Control+s")
        name_box = page.get_by_role("dialog").get_by_role("textbox")
        name_box.fill("alice-only")
        with page.expect_response(lambda r: "workflows%2Falice-only.json" in r.url) as saved:
            name_box.press("Enter")
        assert saved.value.status == 200
        assert_clean(log, editor)
        # Bob logs in on the login page: his editor has no workflow of Alice's.
        bob = browser.new_context(viewport={"width": 1600, "height": 1000})
        login = bob.new_page()
        login.goto(server.url + "/")
        assert "/login" in login.url
        login.get_by_label("Token").fill("bob-browser-token-4d5e6f")
        login.get_by_role("button", name="Log in").click()
        login.wait_for_function(READY, timeout=30_000)
        login.get_by_text("Get Started with a Template").wait_for()
        login.keyboard.press("Escape")
        login.get_by_text("Workflows", exact=True).first.click()
        login.get_by_text("Browse", exact=False).first.wait_for()
        assert login.locator("text=alice-only").count() == 0
        listing = login.evaluate("async () => (await fetch('/api/userdata?dir=workflows')).status")
        assert listing == 404  # Bob has saved nothing
        alice.close()
        bob.close()
    finally:
        server.kill()


def fail_outside_any_node(server: ServerProcess, backend: ServerProcess, page: Any) -> str:
    """A job of the page's client whose only backend dies while it runs: with one attempt
    allowed, it ends failed with no node at fault (its lane lost, not a node's error)."""
    body = {"prompt": sleep_prompt(30), "client_id": connected_client_id(page)}
    job_id: str = server.post("/api/prompt", body)["prompt_id"]
    poll(lambda: server.get(f"/api/jobs/{job_id}")["status"] == "in_progress", what="a run")
    backend.kill()
    poll(lambda: server.get(f"/api/jobs/{job_id}")["status"] == "failed", what="the failure")
    return job_id


def connected_client_id(page: Any) -> str:
    """The editor's client id once its socket is open: the editor may be drawn before
    the server's first `status` frame has given it one, and frames sent before that
    reach no one."""
    ready = "() => app.api.clientId && app.api.socket && app.api.socket.readyState === 1"
    page.wait_for_function(ready, timeout=30_000)
    client_id: str = page.evaluate("() => app.api.clientId")
    return client_id


@contextmanager
def fleet_of_one_backend(
    tmp_path: Path, *extra: str
) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """(gateway, backend): a gateway whose only lane is one backend, one attempt a job,
    with one job run there (examples/invert.json); both killed at the end."""
    backend = backend_process(tmp_path / "backend")
    args = ("--local-slots", "0", "--backend", backend.url, "--max-attempts", "1", *extra)
    server = ServerProcess(tmp_path / "data", *args)
    try:
        backend.start()
        server.start()
        offline_user(server)
        up = "/api/fleet/backends"
        poll(lambda: server.get(up)["backends"][0]["state"] == "up", what="the backend")
        prompt = json.loads((EXAMPLE.parent / "invert.json").read_text())
        done = server.post("/api/prompt", {"prompt": prompt})["prompt_id"]
        poll(lambda: server.get(f"/api/jobs/{done}")["status"] == "completed", what="a job")
        yield server, backend
    finally:
        server.kill()
        backend.kill()


@needs_pinned
def test_a_job_failed_outside_any_node_shows_its_message_and_is_listed(
    browser: Any, tmp_path: Path
) -> None:
    """Its `execution_error` frame and history entry name no node (node_id null): the
    pinned editor shows its message, and its queue lists it beside the job that
    succeeded."""
    with fleet_of_one_backend(tmp_path, *PINNED.serve_args()) as (server, backend):
        context = browser.new_context(viewport={"width": 1600, "height": 1000})
        page, log = open_editor(context, server)
        page.keyboard.press("Escape")  # the template browser
        failed = fail_outside_any_node(server, backend, page)
        sent = server.get(f"/history/{failed}")[failed]["status"]["messages"][-1]
        assert (sent[0], sent[1]["node_id"]) == ("execution_error", None)
        page.get_by_text("comfyfleet.LaneFailure", exact=True).wait_for()
        page.get_by_text("the job failed on its lane 1 times", exact=False).first.wait_for()
        for _ in range(10):  # its dialog, and the template browser if it opened late
            if not page.locator(".p-dialog-mask").count():
                break
            page.keyboard.press("Escape")
            page.wait_for_timeout(300)
        page.locator(".queue-tab-button").first.click()
        page.get_by_text("Failed", exact=True).first.wait_for()
        page.wait_for_function(
            """() => [...document.images].some(img => img.src.includes("example_invert")
                && img.complete && img.naturalWidth > 0)"""
        )
        assert_clean(log, PINNED)
        context.close()
