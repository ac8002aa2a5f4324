"""A real headless browser for the editor and dashboard tests: Debian's chromium driven by
Playwright (never a browser Playwright downloads), one browser per test module.

Not one per session: Playwright's sync API keeps its event loop marked as running in this
thread while it is open, and the asyncio tests of later modules could not run their own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.servers import free_port

CHROMIUM = os.environ.get("COMFYFLEET_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: Screenshots for the docs are written here when COMFYFLEET_SCREENSHOTS=1.
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not shutil.which(CHROMIUM):
        # A missing browser is a failing test, never a skipped one: the pages go untested.
        pytest.fail(f"no browser at {CHROMIUM}: install Debian's chromium (.ci/run does)")
    os.environ["PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD"] = "1"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@dataclass
class PageLog:
    """What a page did: console errors, answers of 400 and above, requests to elsewhere."""

    origin: str
    errors: list[str] = field(default_factory=list)
    failed: list[tuple[int, str]] = field(default_factory=list)
    elsewhere: list[str] = field(default_factory=list)

    def watch(self, page: Any) -> None:
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda exc: self.errors.append(f"uncaught: {exc} {exc.stack}"))
        page.on(
            "response",
            lambda r: (
                self.failed.append((r.status, r.url.removeprefix(self.origin)))
                if r.status >= 400
                else None
            ),
        )

        def route(route: Any) -> None:
            # Nothing may come from the outside: the machine has no network, the page no CDN.
            self.elsewhere.append(route.request.url)
            route.abort()

        page.route(lambda url: not url.startswith(self.origin), route)


def screenshot(page: Any, name: str) -> None:
    if os.environ.get("COMFYFLEET_SCREENSHOTS") == "1":
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / name))


class Process:
    """A child process (`comfyfleet <args>`) that answers on `port`, killed at the end."""

    def __init__(self, args: list[str], port: int, log: Path) -> None:
        self.args, self.port, self.log = args, port, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, ready_path: str = "/", timeout: float = 20.0) -> Process:
        command = [str(Path(sys.executable).parent / "comfyfleet"), *self.args]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.args[0]} exited:\n{self.log.read_text()}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}{ready_path}", timeout=2)
                return self
            except OSError as exc:
                if getattr(exc, "code", None):  # an HTTP answer: it is up
                    return self
                time.sleep(0.05)
        raise TimeoutError(f"{self.args[0]} did not start:\n{self.log.read_text()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def emulator(tmp_path: Path) -> Iterator[str]:
    """The provider emulator (`comfyfleet emulate-provider`): the paid API's stand-in."""
    port = free_port()
    process = Process(
        ["emulate-provider", "--port", str(port), "--latency", "0.5s", "--jitter", "0s"],
        port,
        tmp_path / "emulator.log",
    )
    process.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.stop()
