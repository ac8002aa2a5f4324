"""The aiohttp application: middlewares, every route, and the gateway's life cycle."""

from __future__ import annotations

from aiohttp import web

from comfyfleet import __version__
from comfyfleet.folders import Folders
from comfyfleet.server.auth import TokenTable, authenticate, tenant_name
from comfyfleet.server.files import file_routes
from comfyfleet.server.fleet_api import fleet_routes
from comfyfleet.server.gateway import GATEWAY, Gateway
from comfyfleet.server.jobs import job_routes
from comfyfleet.server.middleware import body_limit, cors, json_errors, origin_check
from comfyfleet.server.prompts import prompt_routes
from comfyfleet.server.routing import install
from comfyfleet.server.system import system_routes
from comfyfleet.server.ws import ws_routes
from comfyfleet.store.postgres_url import redact_urls_in


def build_app(gateway: Gateway) -> web.Application:
    config = gateway.config
    tokens = TokenTable(config.auth_tokens)

    def folders_for(request: web.Request) -> Folders:
        """The folders of the tenant a request acts for."""
        return gateway.tenants.of(tenant_name(request))

    routes = prompt_routes() + job_routes() + fleet_routes() + ws_routes()
    routes += file_routes(
        gateway.folders,
        max_upload_bytes=config.max_upload_bytes,
        # Files kept on backends are no one tenant's: with tokens, /view reads local files only.
        remote=None if tokens else gateway.fleet.remote_view,
        folders_for=folders_for,
    )
    routes += system_routes(
        gateway.engine,
        version=__version__,
        max_upload_bytes=config.max_upload_bytes,
        models_root=config.data_dir / "models",
        catalog=gateway.fleet,
        folders_for=folders_for,
        redact=lambda args: [redact_urls_in(arg) for arg in tokens.redact(args)],
    )
    middlewares = [json_errors, cors(config.cors_origins) if config.cors_origins else origin_check]
    if tokens:  # after cross-site checks and CORS answers
        middlewares.append(authenticate(tokens, {r.handler for r in routes if r.admin}))
    middlewares.append(body_limit(config.max_upload_bytes))  # a refusal gets CORS headers
    app = web.Application(client_max_size=config.max_upload_bytes, middlewares=middlewares)
    app[GATEWAY] = gateway
    install(app, routes)

    async def start(_app: web.Application) -> None:
        await gateway.start()

    async def drain(_app: web.Application) -> None:
        await gateway.drain()

    async def close(_app: web.Application) -> None:
        await gateway.close()

    app.on_startup.append(start)
    app.on_shutdown.append(drain)  # after the listener closed, before open requests end
    app.on_cleanup.append(close)
    return app
