"""One gateway's metrics: its own registry, the job observer, the live collector, and
`GET /metrics` in Prometheus's text format.

Each gateway has a registry of its own (never prometheus-client's global one), so
several gateways in one process (tests, benchmarks) keep their numbers apart.
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CollectorRegistry, disable_created_metrics, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.process_collector import ProcessCollector

from comfyfleet.server.admin.metrics.jobs import JobMetrics
from comfyfleet.server.admin.metrics.live import LiveCollector
from comfyfleet.server.gateway import Gateway
from comfyfleet.server.plumbing.routing import Route


class GatewayMetrics:
    def __init__(self, gateway: Gateway) -> None:
        # No `_created` series: they double the answer and no dashboard reads them.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry()
        self.jobs = JobMetrics(self.registry)
        self.live = LiveCollector(gateway)
        self.registry.register(self.live)
        ProcessCollector(namespace="comfyfleet", registry=self.registry)
        gateway.scheduler.observers.add(self.jobs)

    async def render(self) -> bytes:
        """The text format of everything now (the store's counts read first)."""
        await self.live.refresh()
        return generate_latest(self.registry)

    def routes(self) -> list[Route]:
        """`GET /metrics`: an admin's route when authentication is on. The text format
        every Prometheus reads (0.0.4)."""

        async def metrics(_request: web.Request) -> web.Response:
            body = await self.render()
            return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_PLAIN_0_0_4})

        return [Route("GET", "/metrics", metrics, api_alias=False, admin=True)]
