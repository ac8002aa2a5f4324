"""The aiohttp application: middlewares, every route, and the gateway's life cycle."""

from __future__ import annotations

from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Middleware

from comfyfleet import __version__
from comfyfleet.children.jobs import CHILD_JOBS
from comfyfleet.folders import Folders
from comfyfleet.lanes.settings import HOLD_MARGIN
from comfyfleet.peers import FileRef
from comfyfleet.server.access.auth import TokenTable, authenticate, tenant_name
from comfyfleet.server.access.login import login_routes
from comfyfleet.server.access.proxies import trusted_proxies
from comfyfleet.server.admin.fleet_api import fleet_routes
from comfyfleet.server.admin.health import health_routes
from comfyfleet.server.admin.metrics import GatewayMetrics
from comfyfleet.server.admin.webhooks_api import webhook_routes
from comfyfleet.server.comfy_api_v2.events import v2_event_routes
from comfyfleet.server.comfy_api_v2.jobs import v2_job_routes
from comfyfleet.server.comfy_api_v2.live import PROGRESS_READS, ProgressReads
from comfyfleet.server.comfy_api_v2.outputs import v2_asset_routes
from comfyfleet.server.comfyui_api.children import GatewayChildren, children_routes
from comfyfleet.server.comfyui_api.follow import follow_routes
from comfyfleet.server.comfyui_api.prompts import prompt_routes
from comfyfleet.server.comfyui_api.system import system_routes
from comfyfleet.server.comfyui_api.waits import WAITS, PromptWaits
from comfyfleet.server.comfyui_api.ws import ws_routes
from comfyfleet.server.delivery.client_events import client_key
from comfyfleet.server.files.peer_files import peer_file_routes
from comfyfleet.server.files.view_upload import file_routes
from comfyfleet.server.gateway import GATEWAY, Gateway
from comfyfleet.server.jobs_api.cancels import peer_cancel_routes
from comfyfleet.server.jobs_api.jobs import job_routes
from comfyfleet.server.pages.dashboard import DashboardFeed, FleetWatch, dashboard_routes
from comfyfleet.server.pages.editor_api import editor_routes, terminal_size
from comfyfleet.server.pages.extensions import Extensions, extension_routes
from comfyfleet.server.pages.frontend import frontend_routes, web_root
from comfyfleet.server.pages.logbuffer import LogBuffer, LogFeed
from comfyfleet.server.pages.settings import settings_routes
from comfyfleet.server.pages.userdata import userdata_routes
from comfyfleet.server.plumbing.middleware import (
    ORIGIN_GUARD,
    OriginGuard,
    body_limit,
    cors,
    json_errors,
    origin_check,
)
from comfyfleet.server.plumbing.routing import Route, install
from comfyfleet.server.workers.demand import Demand
from comfyfleet.server.workers.hub import WorkerHub, worker_routes
from comfyfleet.store.postgres_parts.url import redact_urls_in


def build_app(gateway: Gateway) -> web.Application:
    config = gateway.config
    tokens = TokenTable(config.auth_tokens)

    def folders_for(request: web.Request) -> Folders:
        """The folders of the tenant a request acts for."""
        return gateway.tenants.of(tenant_name(request))

    async def from_peers(
        request: web.Request, folders: Folders, kind: str, subfolder: str, name: str
    ) -> bool:
        """A file another gateway of the store holds (it ran the prompt), kept here."""
        ref = FileRef(tenant_name(request), kind, subfolder, name)
        return await gateway.peers.fetch(ref, folders)

    routes = prompt_routes() + children_routes() + job_routes() + follow_routes()
    routes += fleet_routes() + ws_routes()
    routes += webhook_routes()
    # Comfy API v2: a second face of the same queue, history, files and event log.
    routes += v2_job_routes() + v2_event_routes() + v2_asset_routes(from_peers)
    routes += file_routes(
        gateway.folders,
        max_upload_bytes=config.max_upload_bytes,
        # Files kept on backends are no one tenant's: with tokens, /view reads local files only.
        remote=None if tokens else gateway.fleet.remote_view,
        folders_for=folders_for,
        fetch_missing=from_peers,
    )
    routes += peer_file_routes(
        gateway.store, gateway.peer_key, gateway.identity.id, gateway.tenants
    )
    routes += peer_cancel_routes()
    routes += system_routes(
        gateway.engine,
        version=__version__,
        max_upload_bytes=config.max_upload_bytes,
        models_root=config.data_dir / "models",
        catalog=gateway.fleet,
        folders_for=folders_for,
        redact=lambda args: [redact_urls_in(arg) for arg in tokens.redact(args)],
    )
    routes += login_routes(tokens)
    routes += health_routes()
    watch = FleetWatch(gateway.scheduler)
    gateway.scheduler.observers.add(watch)
    dashboards = DashboardFeed(gateway, watch)
    waits = PromptWaits(gateway.store)  # POST /prompt?wait=
    gateway.scheduler.observers.add(waits)
    gateway.engine.services.add(CHILD_JOBS, GatewayChildren(gateway, waits))
    routes += dashboard_routes(dashboards)
    metrics = GatewayMetrics(gateway)
    metrics.jobs.idle_gap_listeners.append(watch.charts.idle_gap)  # measured once, there
    routes += metrics.routes()
    # A worker away keeps its lane past the hold on what it ran: given up on by then (it
    # may have been cut off, still running it), that goes back to the queue first.
    grace = max(config.lease * 2, config.backend_hold + HOLD_MARGIN + 1.0)
    workers = WorkerHub(gateway, config.worker_tokens, grace=grace)
    routes += worker_routes(workers)
    demand = Demand(gateway, workers)
    routes += demand.routes()
    metrics.live.more.append(demand.gauges)
    logs = LogBuffer()  # the editor's terminal panel
    routes += _editor_routes(gateway, logs)  # last: its files' catch-all comes last
    middlewares: list[Middleware] = [json_errors]
    if config.trusted_proxies:  # first: every check after it sees the client's scheme and host
        middlewares.append(trusted_proxies(config.trusted_proxies))
    guard = OriginGuard()
    middlewares.append(
        cors(config.cors_origins, guard) if config.cors_origins else origin_check(guard)
    )
    if tokens:  # after cross-site checks and CORS answers
        middlewares.append(
            authenticate(
                tokens,
                {r.handler for r in routes if r.admin},
                public={r.handler for r in routes if r.public},
                pages={r.handler for r in routes if r.page},
            )
        )
    middlewares.append(body_limit(config.max_upload_bytes))  # a refusal gets CORS headers
    app = web.Application(client_max_size=config.max_upload_bytes, middlewares=middlewares)
    app[GATEWAY] = gateway
    app[WAITS] = waits
    app[PROGRESS_READS] = ProgressReads()
    app[ORIGIN_GUARD] = guard
    install(app, routes)

    async def start(_app: web.Application) -> None:
        logs.attach()
        await gateway.start()
        workers.start()

    async def drain(_app: web.Application) -> None:
        waits.close()  # waiting requests answer 202 now
        await dashboards.stop()
        await gateway.drain()
        logs.detach()

    async def close(_app: web.Application) -> None:
        await workers.close()  # after the drain: their jobs ended or were re-queued
        await gateway.close()

    app.on_startup.append(start)
    app.on_shutdown.append(drain)  # after the listener closed, before open requests end
    app.on_cleanup.append(close)
    return app


def _editor_routes(gateway: Gateway, logs: LogBuffer) -> list[Route]:
    """What the graph editor calls, its files last (their catch-all must come last)."""
    config = gateway.config

    def user_dir(request: web.Request) -> Path:
        return gateway.tenants.user_dir(tenant_name(request))

    feed = LogFeed(logs, gateway.hub)
    feed.sized_by(terminal_size)

    def subscribe(request: web.Request, client_id: str, enabled: bool) -> None:
        feed.subscribe(client_key(tenant_name(request), client_id), enabled)

    pages, files = frontend_routes(config.front_end_root)
    extensions = Extensions(
        web_root(config.front_end_root), gateway.engine.registry.web_dirs, gateway.fleet.backends
    )
    routes = settings_routes(user_dir) + userdata_routes(user_dir)
    routes += editor_routes(
        config.data_dir / "models",
        lambda request: gateway.tenants.of(tenant_name(request)),
        logs,
        subscribe,
    )
    return routes + extension_routes(extensions) + pages + [files]
