"""Other sites' pages against the login cookie, in a real headless browser: what Chromium
itself sends (Origin, Sec-Fetch-Site, the SameSite=Lax cookie) decides.

The browser maps `fleet.test` and `evil.test` to 127.0.0.1, so the server sees a Host that
is not loopback (ComfyUI's guard does not apply) and the pages of `fleet.test` on another
port are the same site as the server: the browser sends its cookie along with their
requests. `fleet.localhost` is the server at an origin the browser trusts (as https).
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import ARGS, CHROMIUM
from tests.servers import ServerProcess

ALICE = "alice-browser-token-1a2b3c"
MALLORY = "mallory-browser-token-9z8y7x"
CONFIG = f"""
[[auth.tokens]]
token = "{ALICE}"
tenant = "alice"

[[auth.tokens]]
token = "{MALLORY}"
tenant = "mallory"
"""


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    if not shutil.which(CHROMIUM):
        pytest.fail(f"no browser at {CHROMIUM}: install Debian's chromium (.ci/run does)")
    os.environ["PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD"] = "1"
    from playwright.sync_api import sync_playwright

    rules = "--host-resolver-rules=MAP fleet.test 127.0.0.1, MAP evil.test 127.0.0.1"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=[*ARGS, rules])
        try:
            yield browser
        finally:
            browser.close()


class _Pages(BaseHTTPRequestHandler):
    pages: dict[str, str] = {}

    def do_GET(self) -> None:
        body = self.pages.get(self.path, "").encode()
        self.send_response(200 if body else 404)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def attacker() -> Iterator[tuple[int, dict[str, str]]]:
    """A web server on loopback serving the pages put in its dict: (port, pages)."""
    pages: dict[str, str] = {}
    handler = type("Pages", (_Pages,), {"pages": pages})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], pages
    finally:
        server.shutdown()
        server.server_close()


def test_other_origins_cannot_log_the_browser_in_nor_use_its_session(
    chromium: Any, attacker: tuple[int, dict[str, str]], tmp_path: Path
) -> None:
    config = tmp_path / "auth.toml"
    config.write_text(CONFIG)
    server = ServerProcess(tmp_path / "data", "--config", str(config), token=ALICE)
    server.start()
    port, pages = attacker
    fleet = f"http://fleet.test:{server.port}"
    pages["/form"] = f"""<form method="post" action="{fleet}/login">
        <input name="token" value="{MALLORY}"><input name="next" value="/fleet"></form>
        <script>document.forms[0].submit()</script>"""
    pages["/link"] = f'<a id="go" href="{fleet}/fleet?token={MALLORY}">the fleet</a>'
    pages["/fetch"] = f"""<script>
        fetch("{fleet}/api/settings/Csrf", {{method: "POST", body: "1", mode: "no-cors",
            credentials: "include"}}).finally(() => {{ window.done = true; }});</script>"""
    try:
        context = chromium.new_context()
        page = context.new_page()

        def session() -> list[str]:
            cookies = context.cookies(fleet)
            return [c["value"] for c in cookies if c["name"] == "comfyfleet_token"]

        # Alice logs in on the server's own login page.
        page.goto(fleet + "/login?next=/fleet")
        page.get_by_label("Token").fill(ALICE)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url(fleet + "/fleet")
        assert session() == [ALICE]
        # Another site, and another port of the same host (the same site), post a login
        # form with Mallory's token, and link to a page with it.
        for elsewhere in (f"http://evil.test:{port}", f"http://fleet.test:{port}"):
            page.goto(elsewhere + "/form")
            page.wait_for_url(fleet + "/login")
            assert "another site" in page.content()
            page.goto(elsewhere + "/link")
            page.click("#go")
            page.wait_for_url(fleet + "/fleet")  # in Alice's session
            assert session() == [ALICE], elsewhere
        # A script on the other port: the browser sends the cookie, which does not count.
        page.goto(f"http://fleet.test:{port}/fetch")
        page.wait_for_function("window.done === true")
        assert "Csrf" not in server.get("/api/settings")
        # A browser without a session. Chromium says where a request comes from
        # (Sec-Fetch-Site) only to a trustworthy origin (https, localhost): there a link
        # from another site does not log it in, and the login page says why.
        trusted = f"http://fleet.localhost:{server.port}"
        pages["/trusted-link"] = f'<a id="go" href="{trusted}/fleet?token={MALLORY}">fleet</a>'
        fresh = chromium.new_context()
        page = fresh.new_page()
        page.goto(f"http://evil.test:{port}/trusted-link")
        page.click("#go")
        page.wait_for_url(f"{trusted}/login?next=/fleet&link=refused")
        assert "was not used" in page.content()
        assert fresh.cookies(trusted) == []
        # Typed into the address bar, such a link logs in.
        page.goto(f"{trusted}/fleet?token={ALICE}")
        page.wait_for_url(trusted + "/fleet")
        assert [c["value"] for c in fresh.cookies(trusted)] == [ALICE]
        fresh.close()
        context.close()
    finally:
        server.kill()
