"""The dashboard's charts (`/fleet`, "Last hour") in a real headless browser, on a live
gateway with its local lane and one ComfyUI backend (another comfyfleet), authentication on.

Two tenants' prompts run, one fails with markup in its message. Once a sample closes
the admin's throughput chart has a line, the lanes chart lists both lanes, the tenants
chart both tenants; the failure is listed at once, as text. A tenant's page shows the
lanes and its own failure, not the charts that count every tenant's prompts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.browser.conftest import PageLog, screenshot
from tests.integration.gateway.wire import save_prompt, sleep_prompt
from tests.servers import ServerProcess

ROOT = "root-charts-token-5d4c3b"
ALICE = "alice-charts-token-8e7f6a"
BOB = "bob-charts-token-2b1c0d"
AUTH = f"""
[[auth.tokens]]
token = "{ROOT}"
admin = true

[[auth.tokens]]
token = "{ALICE}"
tenant = "alice"

[[auth.tokens]]
token = "{BOB}"
tenant = "bob"
"""
#: Markup in a failure's message: shown as text, never parsed (an img would request /x).
MESSAGE = '<img src=x onerror="window.injected = 1"> CUDA out of memory'
SAMPLE = 30_000  # ms: a sample closes every 10 s; time for one and the page's next read


def fail_prompt(message: str) -> dict[str, Any]:
    return {
        "1": {"class_type": "Fail", "inputs": {"message": message}},
        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
    }


def _run(gateway: ServerProcess, token: str, prompt: dict[str, Any]) -> str:
    gateway.token = token
    prompt_id: str = gateway.post("/prompt", {"prompt": prompt})["prompt_id"]
    return prompt_id


def _wait_ended(page: Any, prompt_ids: list[str]) -> None:
    for prompt_id in prompt_ids:
        page.wait_for_selector(f'#recent tr[data-job="{prompt_id}"]', timeout=30_000)


def _completed_total(page: Any) -> int:
    text = page.locator('#chart-throughput [data-series="completed"] b').text_content()
    return int(text or 0)


def test_the_charts_show_the_last_hour_live(browser: Any, tmp_path: Path) -> None:
    config = tmp_path / "auth.toml"
    config.write_text(AUTH)
    backend = ServerProcess(tmp_path / "backend", "--local-slots", "1").start()
    lane = f"backend:127.0.0.1-{backend.port}"
    gateway = ServerProcess(
        tmp_path / "gateway",
        "--config",
        str(config),
        "--local-slots",
        "2",
        "--backend",
        backend.url,
        token=ROOT,
    )
    try:
        gateway.start()
        admin = browser.new_context(viewport={"width": 1500, "height": 1000})
        page = admin.new_page()
        log = PageLog(gateway.url)
        log.watch(page)
        page.goto(f"{gateway.url}/fleet?token={ROOT}")
        page.wait_for_selector(f'tr[data-lane="{lane}"]')

        tenant = browser.new_context(viewport={"width": 1500, "height": 1000})
        alice_page = tenant.new_page()
        alice_log = PageLog(gateway.url)
        alice_log.watch(alice_page)
        alice_page.goto(f"{gateway.url}/fleet?token={ALICE}")
        alice_page.wait_for_selector(f'tr[data-lane="{lane}"]')

        first = [_run(gateway, ALICE, sleep_prompt(0.6, n)) for n in range(4)]
        first += [_run(gateway, BOB, sleep_prompt(0.4, 10 + n)) for n in range(2)]
        failed = _run(gateway, ALICE, fail_prompt(MESSAGE))
        _wait_ended(page, [*first, failed])

        # The failure is listed at once (snapshots), its message as text.
        row = f'#failures tr[data-job="{failed}"]'
        page.wait_for_selector(row)
        assert page.locator(f"{row} td.message").text_content() == f"RuntimeError: {MESSAGE}"
        assert page.locator(f"{row} td", has_text="alice").count() == 1  # its tenant
        assert page.locator("#failures img").count() == 0
        assert page.evaluate("() => window.injected") is None

        # A sample closes: the throughput chart draws its line, the lanes and tenants charts
        # list who ran.
        page.wait_for_function(
            "() => /M[\\d.]+,[\\d.]+/.test(document.querySelector("
            "'#chart-throughput path.line.c-completed')?.getAttribute('d') ?? '')",
            timeout=SAMPLE,
        )
        page.wait_for_function(
            "() => +document.querySelector("
            "'#chart-throughput [data-series=completed] b')?.textContent >= 6",
            timeout=SAMPLE,
        )
        assert page.locator('#chart-throughput [data-series="failed"] b').text_content() == "1"
        assert page.locator("#chart-queue path.line.c-running").count() == 1
        for name in ("local", lane):
            cells = page.locator(f'#chart-lanes tr[data-lane="{name}"] td')
            assert cells.count() == 5
        local_busy = page.locator('#chart-lanes tr[data-lane="local"] td').nth(2).text_content()
        assert local_busy is not None and local_busy.endswith("%") and local_busy != "0%"
        assert page.locator('#chart-lanes tr[data-lane="local"] svg path.line').count() == 1
        for name in ("alice", "bob"):
            page.wait_for_selector(f'#chart-tenants tr[data-tenant="{name}"]')
        assert page.locator("#chart-tenants svg.share rect").count() == 2

        # More prompts: the next sample adds to the line, the page reads the charts again.
        before = _completed_total(page)
        second = [_run(gateway, ROOT, save_prompt(0x3B8CF7 + n, "charts")) for n in range(3)]
        second += [_run(gateway, BOB, sleep_prompt(0.8, 20 + n)) for n in range(3)]
        _wait_ended(page, second)
        page.wait_for_function(
            f"() => +document.querySelector("
            f"'#chart-throughput [data-series=completed] b')?.textContent >= {before + 6}",
            timeout=SAMPLE,
        )
        charts = json.loads(page.evaluate("() => JSON.stringify(chartsShown)"))
        assert charts["samples"] >= 2 and len(charts["throughput"]["completed"]) >= 2
        page.locator("#charts").scroll_into_view_if_needed()
        screenshot(page, "fleet-charts.png")

        # Alice: the lanes and her own failure; no chart of every tenant's prompts.
        alice_page.wait_for_selector(f'#failures tr[data-job="{failed}"]')
        alice_page.wait_for_selector('#chart-lanes tr[data-lane="local"]', timeout=SAMPLE)
        for hidden in ("#chart-throughput", "#chart-queue", "#chart-tenants"):
            assert alice_page.locator(hidden).is_hidden()
        assert alice_page.locator("#failures-tenant").is_hidden()
        assert alice_page.locator("#chart-tenants [data-tenant]").count() == 0
        # Of the tenants' table, her own row only.
        shown = alice_page.locator("#tenants tr[data-tenant]")
        tenants = [shown.nth(i).get_attribute("data-tenant") for i in range(shown.count())]
        assert tenants == ["alice"]

        for each in (log, alice_log):
            assert each.errors == [] and each.failed == [] and each.elsewhere == []
        admin.close()
        tenant.close()
    finally:
        gateway.kill()
        backend.kill()
