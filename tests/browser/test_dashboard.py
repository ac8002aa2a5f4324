"""The fleet dashboard (`/fleet`) in a real headless browser, authentication on.

An admin and a tenant watch the same fleet: a gateway with its local lane and one
ComfyUI backend (another comfyfleet). The tenant's prompt shows up and then completes
with its output in the gallery; a backend that goes down shows as down within a few
seconds; only the admin's page offers admin actions.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.browser.conftest import PageLog, screenshot
from tests.integration.fleet.test_fleet_children import fleet_prompt
from tests.integration.gateway.wire import save_prompt, sleep_prompt
from tests.integration.workers.test_workers import WorkerProcess
from tests.servers import ServerProcess

ROOT = "root-dashboard-token-9f8e7d"
ALICE = "alice-dashboard-token-1a2b3c"
WORKER_TOKEN = "pool-worker-dashboard-token-5d6e"
AUTH = f"""
[[auth.tokens]]
token = "{ROOT}"
admin = true

[[auth.tokens]]
token = "{ALICE}"
tenant = "alice"

[tenants.alice]
weight = 2
max_running = 3
"""


def _state(page: Any, lane: str) -> str:
    cell = page.locator(f'tr[data-lane="{lane}"] td.state')
    text: str = cell.text_content() or ""
    return text


def test_the_dashboard_shows_backends_prompts_and_outputs_live(
    browser: Any, tmp_path: Path
) -> None:
    config = tmp_path / "auth.toml"
    config.write_text(AUTH)
    backend = ServerProcess(tmp_path / "backend", "--local-slots", "1").start()
    lane = f"backend:127.0.0.1-{backend.port}"
    gateway = ServerProcess(
        tmp_path / "gateway",
        "--config",
        str(config),
        "--local-slots",
        "1",
        "--backend",
        backend.url,
        "--hang-timeout",
        "60",
        token=ROOT,
    ).start()
    try:
        admin = browser.new_context(viewport={"width": 1500, "height": 950})
        root_page = admin.new_page()
        root_log = PageLog(gateway.url)
        root_log.watch(root_page)
        root_page.goto(f"{gateway.url}/fleet?token={ROOT}")
        assert root_page.url == f"{gateway.url}/fleet"  # the token moved to the cookie
        root_page.wait_for_function(
            f"() => document.querySelector('tr[data-lane=\"{lane}\"] td.state')"
            "?.textContent === 'up'"
        )
        assert root_page.locator("button.admin", has_text="drain").count() == 1

        tenant = browser.new_context(viewport={"width": 1500, "height": 950})
        alice_page = tenant.new_page()
        alice_log = PageLog(gateway.url)
        alice_log.watch(alice_page)
        alice_page.goto(f"{gateway.url}/fleet?token={ALICE}")
        alice_page.wait_for_selector(f'tr[data-lane="{lane}"]')

        gateway.token = ALICE
        slow = gateway.post("/prompt", {"prompt": sleep_prompt(1.5, 7)})["prompt_id"]
        alice_page.wait_for_selector(
            f'#running tr[data-job="{slow}"], #pending tr[data-job="{slow}"]'
        )
        quick = gateway.post("/prompt", {"prompt": save_prompt(5, "dash")})["prompt_id"]
        for prompt_id in (slow, quick):
            alice_page.wait_for_selector(
                f'#recent tr[data-job="{prompt_id}"] td.state:text("completed")', timeout=30_000
            )
        alice_page.wait_for_selector('#gallery img[alt^="dash"]')
        # Her fleet batch: its children are her prompts, each shown with its parent.
        parent = gateway.post("/prompt", {"prompt": fleet_prompt(2, 0.2)})["prompt_id"]
        alice_page.wait_for_selector(f'#recent tr[data-job="{parent}"]', timeout=30_000)
        assert alice_page.locator(f'#recent [data-parent="{parent}"]').count() == 2
        alice_page.wait_for_function(
            "() => [...document.querySelectorAll('#gallery img')].every(i => i.naturalWidth > 0)"
        )
        # Her row of the tenants' table (only hers), with her weight and cap.
        alice_row = alice_page.locator('#tenants tr[data-tenant="alice"]')
        assert "3 running" in (alice_row.text_content() or "")
        assert alice_page.locator("#tenants tr").count() == 1
        assert alice_page.locator("button.admin").count() == 0  # no admin actions for her
        assert alice_page.locator("body[data-admin=no]").count() == 1
        # The admin sees her prompts too (all tenants), and only its own tenant's files.
        root_page.wait_for_selector(f'#recent tr[data-job="{quick}"]')
        root_page.wait_for_selector('#tenants tr[data-tenant="alice"]')  # every tenant's rows
        assert root_page.locator('#gallery img[alt^="dash"]').count() == 0
        gateway.token = ROOT
        gateway.post("/prompt", {"prompt": save_prompt(0x3B8CF7, "fleet")})
        root_page.wait_for_function(
            "() => [...document.querySelectorAll('#gallery img')].some(i => i.naturalWidth > 0)"
        )
        screenshot(root_page, "fleet.png")

        backend.kill()
        went_down = time.monotonic()
        root_page.wait_for_function(
            f"() => document.querySelector('tr[data-lane=\"{lane}\"] td.state')"
            "?.textContent === 'down'",
            timeout=10_000,
        )
        assert time.monotonic() - went_down < 5.0
        assert _state(alice_page, lane) in ("up", "down")
        for log in (root_log, alice_log):
            assert log.errors == [] and log.failed == [] and log.elsewhere == []
        admin.close()
        tenant.close()
    finally:
        gateway.kill()
        backend.kill()


def test_a_worker_shows_where_it_connected_from_and_its_machine(
    browser: Any, tmp_path: Path
) -> None:
    """A worker's row: for the admin where it connected from, for everyone when it was
    last heard, its node classes and its devices (as its backend reports them)."""
    config = tmp_path / "gateway.toml"
    config.write_text(AUTH + f'\n[[worker_tokens]]\nname = "pool"\ntoken = "{WORKER_TOKEN}"\n')
    gateway = ServerProcess(
        tmp_path / "gateway", "--config", str(config), "--local-slots", "0", token=ROOT
    ).start()
    worker = WorkerProcess(gateway.url, tmp_path / "w0", "w0", token=WORKER_TOKEN)
    lane = "backend:worker-pool.w0"
    row = f'tr[data-lane="{lane}"]'
    try:
        pages = {}
        for token in (ROOT, ALICE):
            page = browser.new_context(viewport={"width": 1500, "height": 950}).new_page()
            PageLog(gateway.url).watch(page)
            page.goto(f"{gateway.url}/fleet?token={token}")
            page.wait_for_function(
                f"() => document.querySelector('{row}')?.textContent.includes('(cpu)')",
                timeout=60_000,
            )
            pages[token] = page.locator(row).text_content() or ""
        root_row, alice_row = pages[ROOT], pages[ALICE]
        assert "worker from 127.0.0.1, heard" in root_row
        assert "node classes, cpu (cpu) " in root_row and " GB" in root_row
        assert "from 127.0.0.1" not in alice_row  # where it is, for the admin only
        assert "cpu (cpu)" in alice_row
    finally:
        worker.kill()
        gateway.kill()
