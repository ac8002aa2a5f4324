"""The editor's template browser through comfyfleet, in a real headless browser.

A new user's editor opens "Get Started with a Template" with the templates of the
`comfyui-workflow-templates` package; the logo menu's "Browse Templates" opens it again.
Loading a template whose nodes no lane of the fleet has shows the editor's own
missing-nodes dialog, listing exactly those: the node library is the union of every
lane's nodes, so a node a backend has (here one from a pack on a comfyfleet backend) or
the built-in engine has is not listed. The editor served by default (1.58.1) shows them in
its "issues" panel, the one ComfyUI 0.3.64 pins (1.27.10) in its missing-nodes dialog.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.browser.conftest import PageLog, screenshot
from tests.browser.editors import DEFAULT, PINNED, Editor, needs_pinned
from tests.browser.test_editor import FRONTEND_ERROR, offline_user, open_editor
from tests.servers import ServerProcess

#: A node pack for the backend: one node of ComfyUI's core, so that the fleet has it.
DECODER_PACK = """
class VAEDecode:
    CATEGORY = "latent"
    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "decode"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"samples": ("LATENT",), "vae": ("VAE",)}}

    def decode(self, samples, vae):
        raise RuntimeError("no models here")


NODE_CLASS_MAPPINGS = {"VAEDecode": VAEDecode}
"""
#: The editor's own node types (notes, reroutes), never in `/object_info`.
EDITOR_NODES = {"MarkdownNote", "Note", "PrimitiveNode", "Reroute"}
CARDS = "[data-testid^='template-workflow-']"
TEMPLATES_DIALOG = "Get Started with a Template"
#: "Image to Image" (image2image.json): VAEDecode is the backend's, LoadImage the
#: built-in engine's; no lane has the rest.
MISSING = [
    "CLIPTextEncode",
    "CheckpointLoaderSimple",
    "ImageScaleToTotalPixels",
    "KSampler",
    "VAEEncode",
]
#: What the editor itself looks up for a workflow with missing nodes and models: which
#: registry pack has each node, and the size of the template's model download.
LOOKUPS = ("https://api.comfy.org/", "https://huggingface.co/Comfy-Org/")
#: LoadImage's default image: ComfyUI ships an `input/example.png`, comfyfleet's data dir
#: starts empty.
EXAMPLE_IMAGE = "/api/view?type=input&filename=example.png"


def card_titles(page: Any) -> list[str]:
    titles: list[str] = page.locator(f"{CARDS} h3").all_inner_texts()
    return [title.strip() for title in titles]


def wait_for_lane_node(server: ServerProcess, node: str) -> None:
    deadline = time.monotonic() + 20
    while node not in server.get("/object_info"):
        assert time.monotonic() < deadline, f"{node} never reached the gateway's object_info"
        time.sleep(0.1)


@contextmanager
def fleet_with_a_decoder(tmp_path: Path, editor: Editor) -> Iterator[ServerProcess]:
    """A gateway whose lanes are its built-in engine and a backend with VAEDecode."""
    pack = tmp_path / "packs" / "decoder"
    pack.mkdir(parents=True)
    (pack / "__init__.py").write_text(DECODER_PACK)
    backend_args = ("--local-slots", "1", "--custom-nodes", str(pack.parent))
    backend = ServerProcess(tmp_path / "backend", *backend_args).start()
    try:
        gateway_args = ("--backend", backend.url, *editor.serve_args())
        with ServerProcess(tmp_path / "data", *gateway_args) as server:
            wait_for_lane_node(server, "VAEDecode")
            offline_user(server)
            yield server
    finally:
        backend.kill()


def missing_by_the_fleet(server: ServerProcess) -> None:
    """The template's nodes against the fleet's node library: what no lane has."""
    template = server.get("/templates/image2image.json")
    node_info = server.get("/object_info")
    used = {n["type"] for n in template["nodes"]} - EDITOR_NODES
    assert {"VAEDecode", "LoadImage"} <= used  # a backend's node, a built-in one
    assert sorted(used - set(node_info)) == MISSING


def assert_no_other_failure(log: PageLog, editor: Editor) -> None:
    unexpected = [
        (status, path)
        for status, path in log.failed
        if path not in editor.expected_404 and not path.startswith(EXAMPLE_IMAGE)
    ]
    assert unexpected == []
    assert [url for url in log.elsewhere if not url.startswith(LOOKUPS)] == []
    errors = [
        e
        for e in log.errors
        if "the server responded with a status of 404" not in e
        and "net::ERR_FAILED" not in e  # the look-ups elsewhere, refused here
        and not e.startswith("Error fetching file size")
        and not (e.startswith(FRONTEND_ERROR) and "at onChange (" in e)
    ]
    assert errors == []


def first_visit_lists_the_packages_templates(page: Any) -> None:
    page.get_by_text(TEMPLATES_DIALOG).wait_for()
    page.locator(CARDS).first.wait_for()
    assert "Image Generation" in card_titles(page)
    page.keyboard.press("Escape")
    page.get_by_text(TEMPLATES_DIALOG).wait_for(state="hidden")


def reopened_lists_them_with_thumbnails(page: Any) -> None:
    page.locator(CARDS).first.wait_for()
    titles = card_titles(page)
    assert {"Image Generation", "Image to Image", "LoRA"} <= set(titles)
    thumbnail = page.locator("[data-testid='template-workflow-default'] img").first
    page.wait_for_function(
        "(img) => img.complete && img.naturalWidth > 0", arg=thumbnail.element_handle()
    )


def test_the_default_editors_templates_and_the_nodes_no_lane_has(
    browser: Any, tmp_path: Path
) -> None:
    with fleet_with_a_decoder(tmp_path, DEFAULT) as server:
        context = browser.new_context(viewport={"width": 1600, "height": 1000})
        page, log = open_editor(context, server)
        first_visit_lists_the_packages_templates(page)
        # Opened again from the sidebar.
        page.get_by_text("Templates", exact=True).first.click()
        reopened_lists_them_with_thumbnails(page)
        screenshot(page, "templates.jpg")
        missing_by_the_fleet(server)
        page.locator("[data-testid='template-workflow-image2image']").click()
        page.wait_for_function("() => app.graph.nodes.some(n => n.type === 'VAEDecode')")
        # Its "issues found" notice opens the panel that lists the missing nodes.
        page.get_by_test_id("error-overlay-see-errors").click()
        card = page.get_by_test_id("missing-node-card")
        card.get_by_test_id("missing-node-pack-expand").first.click()
        locate = card.locator("li button[aria-label^='Locate ']")
        locate.first.wait_for()
        labels = locate.evaluate_all("(buttons) => buttons.map(b => b.ariaLabel)")
        assert sorted({label.removeprefix("Locate ") for label in labels}) == MISSING
        assert_no_other_failure(log, DEFAULT)
        context.close()


@needs_pinned
def test_the_pinned_editors_templates_and_the_nodes_no_lane_has(
    browser: Any, tmp_path: Path
) -> None:
    with fleet_with_a_decoder(tmp_path, PINNED) as server:
        context = browser.new_context(viewport={"width": 1600, "height": 1000})
        page, log = open_editor(context, server)
        first_visit_lists_the_packages_templates(page)
        # Opened again from the menu.
        page.locator(".comfyui-logo-wrapper").click()
        page.get_by_role("menuitem", name="Browse Templates").click()
        page.get_by_text(TEMPLATES_DIALOG).wait_for()
        reopened_lists_them_with_thumbnails(page)
        missing_by_the_fleet(server)
        page.locator("[data-testid='template-workflow-image2image']").click()
        page.wait_for_function("() => app.graph.nodes.some(n => n.type === 'VAEDecode')")
        # Its checkpoint is not in the models folder either: that dialog comes on top.
        page.get_by_text("Missing Models").wait_for()
        page.keyboard.press("Escape")
        page.get_by_text("Some Nodes Are Missing").wait_for()
        listed = page.locator(".comfy-missing-nodes .node-type").all_inner_texts()
        assert sorted(listed) == MISSING
        assert_no_other_failure(log, PINNED)
        context.close()
