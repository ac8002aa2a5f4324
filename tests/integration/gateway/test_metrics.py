"""`GET /metrics`: Prometheus's text format, parsed with prometheus-client's own parser, whose
numbers match what the gateway ran (real gateway, real prompts, a real backend on
loopback, the provider emulator)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests.emulators import start_emulator
from tests.integration.fleet.scripted import ScriptedBackend
from tests.integration.gateway.test_auth import tenants
from tests.integration.gateway.wire import Served, poll, save_prompt, serve, sleep_prompt
from tests.integration.webhooks.receiver import Receiver, new_secret

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "docs" / "grafana-dashboard.json"
EXAMPLE = ROOT / "examples" / "flux-concurrent.json"
KEY = "emulator-key-51c7e2"


class Scrape:
    """One /metrics answer, parsed."""

    def __init__(self, text: str) -> None:
        self.families = {f.name: f for f in text_string_to_metric_families(text)}
        self.samples: list[Sample] = [s for f in self.families.values() for s in f.samples]

    def matching(self, name: str, **labels: str) -> list[float]:
        """The values of the samples called `name` whose labels include `labels`."""
        return [
            s.value
            for s in self.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        ]

    def value(self, name: str, **labels: str) -> float:
        """The one such sample's value (0 if none)."""
        found = self.matching(name, **labels)
        assert len(found) <= 1, (name, labels, found)
        return found[0] if found else 0.0

    def total(self, name: str, **labels: str) -> float:
        return sum(self.matching(name, **labels))


async def scrape(served: Served) -> Scrape:
    reply = await served.request("GET", "/metrics")
    assert reply.status == 200, reply.text
    assert reply.content_type is not None and reply.content_type.startswith("text/plain")
    return Scrape(reply.text)


def fail_prompt(message: str) -> dict[str, Any]:
    return {
        "1": {"class_type": "Fail", "inputs": {"message": message}},
        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
    }


async def test_the_counters_match_the_prompts_run(tmp_path: Path) -> None:
    async with serve(tmp_path, local_slots=1) as served:
        sock = await served.connect()
        first = await served.submit(sleep_prompt(0.5, 1), sock.client_id)
        second = await served.submit(save_prompt(2, "waits"), sock.client_id)

        async def one_runs_one_waits() -> bool:
            now = await scrape(served)
            running = now.value("comfyfleet_queue_jobs", status="running")
            return (running, now.value("comfyfleet_queue_jobs", status="pending")) == (1, 1)

        await poll(one_runs_one_waits, what="one prompt running and one pending")
        await sock.done(first)
        await sock.done(second)
        ids = [await served.submit(save_prompt(n, "ok"), sock.client_id) for n in range(3)]
        ids += [await served.submit(fail_prompt(f"no {n}"), sock.client_id) for n in range(2)]
        for prompt_id in ids:
            await sock.done(prompt_id)
        await served.wait_idle()

        now = await scrape(served)
        assert all(s.name.startswith("comfyfleet_") for s in now.samples)
        assert now.value("comfyfleet_jobs_submitted_total", tenant="default") == 7
        assert now.value("comfyfleet_jobs_finished_total", status="success") == 5
        assert now.value("comfyfleet_jobs_finished_total", status="error") == 2
        assert now.value("comfyfleet_job_attempts_total", lane="local") == 7
        assert now.total("comfyfleet_job_requeues_total") == 0
        assert now.value("comfyfleet_queue_wait_seconds_count") == 7
        # The second prompt waited for the first one's Sleep node (0.5 s) to end.
        assert now.value("comfyfleet_queue_wait_seconds_sum") >= 0.4
        assert now.value("comfyfleet_job_run_seconds_count", lane="local") == 7
        assert now.value("comfyfleet_job_run_seconds_sum", lane="local") >= 0.5
        assert now.value("comfyfleet_lane_idle_gap_seconds_count", lane="local") >= 1
        assert now.value("comfyfleet_queue_jobs", status="pending") == 0
        assert now.value("comfyfleet_queue_jobs", status="running") == 0
        assert now.value("comfyfleet_lane_slots", lane="local") == 1
        assert now.value("comfyfleet_websocket_clients") == 1
        assert now.value("comfyfleet_websocket_dropped_total") == 0
        # Seven submits and seven ends at least, each committed.
        assert now.value("comfyfleet_store_commit_seconds_count") >= 14
        assert now.value("comfyfleet_store_commit_seconds_bucket", le="+Inf") == now.value(
            "comfyfleet_store_commit_seconds_count"
        )
        assert now.total("comfyfleet_webhook_deliveries_total") == 0  # no webhook here


class FlakyBackend(ScriptedBackend):
    """A backend that refuses its first prompt with a 500, then runs every prompt."""

    refused: int = 0

    async def _submit(self, request: web.Request) -> web.Response:
        if not self.refused:
            self.refused += 1
            return web.json_response({"error": "out of sorts"}, status=500)
        return await super()._submit(request)


async def test_a_requeue_attempts_and_the_backends_state(tmp_path: Path) -> None:
    backend = await FlakyBackend().start()
    try:
        async with serve(
            tmp_path, local_slots=0, backends=({"url": backend.url, "name": "flaky"},)
        ) as served:

            async def up() -> bool:
                return (await scrape(served)).value("comfyfleet_backend_up", backend="flaky") == 1

            await poll(up, what="the backend up")
            prompt_id = await served.submit(save_prompt(1, "moved"))
            await served.wait_job(prompt_id, "completed")
            now = await scrape(served)
            assert now.value("comfyfleet_job_requeues_total", reason="lane") == 1
            assert now.value("comfyfleet_job_attempts_total", lane="backend:flaky") == 2
            assert now.value("comfyfleet_jobs_finished_total", status="success") == 1
            assert now.value("comfyfleet_queue_wait_seconds_count") == 1  # first start only
            assert now.value("comfyfleet_backend_suspect", backend="flaky") == 0
            assert now.value("comfyfleet_backend_draining", backend="flaky") == 0
            assert now.value("comfyfleet_lane_slots", lane="backend:flaky") == 1

            assert (await served.post("/api/fleet/backends/flaky/drain", {})).status == 200
            drained = await scrape(served)
            assert drained.value("comfyfleet_backend_draining", backend="flaky") == 1
            assert drained.value("comfyfleet_backend_up", backend="flaky") == 1
    finally:
        await backend.close()


async def test_fanout_jobs_429s_cooldowns_and_journal_reuses(tmp_path: Path) -> None:
    # One pending job per key: the second submit hears 429 (with Retry-After) until the
    # first is done.
    emulator = await start_emulator(KEY, latency=0.3, max_active=1, retry_after=0.2)
    try:
        prompt = json.loads(EXAMPLE.read_text())
        prompt["1"]["inputs"]["base_url"] = emulator.url
        prompt["1"]["inputs"]["api_key"] = KEY
        async with serve(tmp_path, local_slots=1) as served:
            sock = await served.connect()
            await sock.done(await served.submit(prompt, sock.client_id), timeout=60)
            now = await scrape(served)
            ended = now.value("comfyfleet_fanout_jobs_ended_total", provider="bfl", state="success")
            assert ended == now.total("comfyfleet_fanout_jobs_ended_total") == 2
            assert now.total("comfyfleet_fanout_jobs") == 0  # none left in the pools
            limited = now.value("comfyfleet_provider_rate_limited_total", provider="bfl")
            assert limited == emulator.stats()["rate_limited"] > 0
            assert now.value("comfyfleet_provider_cooldowns_total", provider="bfl") >= 1
            assert now.value("comfyfleet_fanout_journal_reuses_total", provider="bfl") == 0

            served.gateway.engine.cache.clear()  # evicted: the journal still has both
            await sock.done(await served.submit(prompt, sock.client_id), timeout=60)
            again = await scrape(served)
            assert again.value("comfyfleet_fanout_journal_reuses_total", provider="bfl") == 2
            assert emulator.stats()["jobs"] == 2  # no new paid job
    finally:
        await emulator.server.close()


async def test_webhook_deliveries_and_dead_letters(tmp_path: Path) -> None:
    secret = new_secret()
    settings = {
        "webhooks_secret": secret,
        "webhooks_allow_private": True,
        "webhooks_retry_for": 0.0,  # a failed attempt is dead-lettered at once
    }
    async with (
        Receiver(secret) as fine,
        Receiver(secret, mode="fail") as failing,
        serve(tmp_path, local_slots=2, **settings) as served,
    ):
        await served.submit(save_prompt(1, "a"), extra_data={"webhook_url": fine.url})
        await served.submit(save_prompt(2, "b"), extra_data={"webhook_url": fine.url})
        await served.submit(save_prompt(3, "c"), extra_data={"webhook_url": failing.url})
        await fine.wait_for(2)

        async def counted() -> bool:
            now = await scrape(served)
            return now.total("comfyfleet_webhook_deliveries_total") == 3

        await poll(counted, what="three delivery attempts counted")
        now = await scrape(served)
        assert now.value("comfyfleet_webhook_deliveries_total", result="delivered") == 2
        assert now.value("comfyfleet_webhook_deliveries_total", result="failed") == 1
        assert now.value("comfyfleet_webhook_dead_letters_total") == 1


async def test_metrics_need_an_admin_token(tmp_path: Path) -> None:
    async with tenants(tmp_path) as clients:
        assert (await clients.anonymous.request("GET", "/metrics")).status == 401
        refused = await clients.alice.request("GET", "/metrics")
        assert refused.status == 403 and refused.json["error"]["type"] == "forbidden"
        assert (await clients.alice.request("GET", "/api/metrics")).status == 404  # no alias
        await clients.alice.submit(save_prompt(1, "alice"))

        async def counted() -> bool:  # an admin sees every tenant's counts
            now = await scrape(clients.root)
            return now.value("comfyfleet_jobs_finished_total", tenant="alice") == 1

        await poll(counted, what="alice's prompt counted")
        now = await scrape(clients.root)
        assert now.value("comfyfleet_jobs_finished_total", status="success", tenant="alice") == 1


async def test_hostile_strings_from_clients_never_break_the_answer(tmp_path: Path) -> None:
    hostile = 'a"b\\c\nd} 1\n# TYPE x counter\n\u2028\U0001f600'
    async with serve(tmp_path, local_slots=2) as served:
        sock = await served.connect(hostile[:40].replace("\n", " "))
        body = {"prompt": save_prompt(1, "x"), "client_id": hostile, "prompt_id": hostile}
        reply = await served.post("/prompt", body)
        assert reply.status in (200, 400), reply.text
        await served.submit(fail_prompt(hostile), sock.client_id)
        await served.wait_idle()
        text = (await served.request("GET", "/metrics")).text
        now = Scrape(text)
        assert "# TYPE x" not in text and "\U0001f600" not in text
        assert now.total("comfyfleet_jobs_finished_total") >= 1
        assert all(s.name.startswith("comfyfleet_") for s in now.samples)


#: Words of PromQL and Grafana the queries hold besides metric names.
PROMQL_WORDS = {"histogram_quantile", "label_values"}


def dashboard_queries(node: Any) -> Iterable[str]:
    """Every query of the dashboard: its panels' targets and its template variables."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "query", "definition") and isinstance(value, str):
                yield value
            else:
                yield from dashboard_queries(value)
    elif isinstance(node, list):
        for value in node:
            yield from dashboard_queries(value)


def exposed_names(now: Scrape) -> set[str]:
    """Every name a query may use: the families, and their samples' names (a family
    without a sample yet still has its `_total`, `_bucket`, `_sum` and `_count`)."""
    names = set(now.families) | {s.name for s in now.samples}
    for family in now.families.values():
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names.update(family.name + suffix for suffix in ("_bucket", "_sum", "_count"))
    return names


async def test_the_dashboard_uses_only_metrics_the_gateway_exposes(tmp_path: Path) -> None:
    queries = list(dashboard_queries(json.loads(DASHBOARD.read_text())))
    # Names with an underscore, Grafana's own variables ($__rate_interval) aside.
    words = {w for q in queries for w in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", q) if "_" in w}
    words = {w for w in words if not w.startswith("__")} - PROMQL_WORDS
    assert {w for w in words if not w.startswith("comfyfleet_")} == set()  # only these
    assert len(words) >= 15
    async with serve(tmp_path, local_slots=1) as served:
        now = await scrape(served)
    assert words - exposed_names(now) == set()
