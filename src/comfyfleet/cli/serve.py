"""`comfyfleet serve`: the ComfyUI-compatible server."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from comfyfleet import logs
from comfyfleet.provider_http.redact import Redactor
from comfyfleet.server.config import ConfigError, ServerConfig, load_config
from comfyfleet.store.base import StoreError
from comfyfleet.store.postgres_parts.url import is_postgres_url, redact_url, redact_urls_in

if TYPE_CHECKING:
    from comfyfleet.server.gateway import Gateway

log = logging.getLogger("comfyfleet")


def add_serve_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = commands.add_parser(
        "serve",
        help="run the ComfyUI-compatible server",
        description="Settings come from --config FILE (TOML), then COMFYFLEET_* variables, "
        "then these flags.",
    )
    serve.add_argument("--config", type=Path, help="TOML config file")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--data-dir", type=Path, help="SQLite store, inputs and outputs")
    serve.add_argument(
        "--store",
        metavar="URL",
        help="where jobs and history live: postgresql://user@host/db, or a SQLite file "
        "(default: comfyfleet.db in the data dir)",
    )
    serve.add_argument(
        "--gateway-id",
        help="this gateway among several sharing one store (default: the id kept in the data dir)",
    )
    serve.add_argument(
        "--peer-url",
        metavar="URL",
        help="where the other gateways of a shared store reach this one, for files it holds "
        "(default: http://HOST:PORT)",
    )
    serve.add_argument(
        "--lease",
        help="how long this gateway's jobs stay its own without a heartbeat before another "
        "gateway takes them over (default 10s)",
    )
    serve.add_argument("--local-slots", type=int, help="prompts run at once by the built-in engine")
    serve.add_argument("--custom-nodes", action="append", type=Path, metavar="DIR")
    serve.add_argument("--testing-nodes", action="store_true", default=None)
    serve.add_argument(
        "--backend",
        action="append",
        dest="backends",
        metavar="URL",
        help="a ComfyUI backend to feed (repeatable); see [[backends]] in the config file",
    )
    serve.add_argument(
        "--comfyui",
        type=Path,
        metavar="DIR",
        help="run the ComfyUI in DIR as managed backends (per GPU); see [[comfyui]] in the "
        "config file",
    )
    serve.add_argument(
        "--gpus", metavar="LIST", help="with --comfyui: all (default), cpu, or GPU numbers 0,1,..."
    )
    serve.add_argument(
        "--per-gpu", type=int, metavar="N", help="with --comfyui: instances per GPU (default 1)"
    )
    serve.add_argument(
        "--comfyui-python",
        metavar="PYTHON",
        help="with --comfyui: its interpreter (default: DIR's venv, else this Python)",
    )
    serve.add_argument("--hang-timeout", type=float, help="seconds without a frame from a backend")
    serve.add_argument(
        "--backend-hold",
        type=float,
        help="seconds a comfyfleet backend runs this gateway's prompts past its last word",
    )
    serve.add_argument("--max-attempts", type=int, help="attempts per prompt when lanes fail")
    serve.add_argument(
        "--output-mode", choices=("copy", "reference"), help="backend outputs: copy or reference"
    )
    serve.add_argument(
        "--cors-origin",
        action="append",
        dest="cors_origins",
        metavar="ORIGIN",
        help="a browser origin allowed to call the API (repeatable; * for any)",
    )
    serve.add_argument(
        "--trusted-proxy",
        action="append",
        dest="trusted_proxies",
        metavar="ADDR",
        help="a reverse proxy (IP address or CIDR network; repeatable) whose Forwarded or "
        "X-Forwarded-Proto/-Host headers say the scheme and host the client used",
    )
    serve.add_argument(
        "--auth-token",
        action="append",
        metavar="TOKEN",
        help="require this bearer token (repeatable; tenant default, admin). Other processes "
        "can read argv: prefer --auth-token-file or COMFYFLEET_AUTH_TOKEN",
    )
    serve.add_argument(
        "--auth-token-file",
        type=Path,
        metavar="FILE",
        help="like --auth-token, with the token read from the first line of FILE",
    )
    serve.add_argument(
        "--front-end-root",
        type=Path,
        metavar="DIR",
        help="serve the graph editor from this build of ComfyUI's frontend "
        "(default: the comfyui-frontend-package installed with comfyfleet)",
    )
    serve.add_argument("--max-pending", type=int, help="pending prompts before 429")
    serve.add_argument(
        "--max-prompt-nodes", type=int, help="nodes a prompt may have (default 25,000)"
    )
    serve.add_argument(
        "--max-prompt-bytes", type=int, help="bytes of a POST /prompt body (default 32 MiB)"
    )
    serve.add_argument("--history-max-entries", type=int)
    serve.add_argument("--history-max-age", help="e.g. 30d, 12h")
    serve.add_argument(
        "--events-retention",
        help="how long a prompt's events are kept for followers after its end, e.g. 1h "
        "(0: no event log)",
    )
    serve.add_argument(
        "--shutdown-grace", type=float, help="seconds running prompts get on SIGTERM"
    )
    serve.add_argument("--log-level", default="INFO")
    serve.add_argument(
        "--log-format",
        choices=("text", "json"),
        help="text lines (default), or one JSON object per line with the job's prompt_id, "
        "tenant, lane and attempt",
    )


def serve_main(args: argparse.Namespace) -> int:
    overrides = {
        key: getattr(args, key)
        for key in (
            "host",
            "port",
            "data_dir",
            "store",
            "gateway_id",
            "peer_url",
            "lease",
            "local_slots",
            "custom_nodes",
            "testing_nodes",
            "max_pending",
            "max_prompt_nodes",
            "max_prompt_bytes",
            "history_max_entries",
            "history_max_age",
            "events_retention",
            "shutdown_grace",
            "backends",
            "comfyui",
            "gpus",
            "per_gpu",
            "comfyui_python",
            "hang_timeout",
            "backend_hold",
            "max_attempts",
            "output_mode",
            "cors_origins",
            "trusted_proxies",
            "auth_token",
            "auth_token_file",
            "front_end_root",
            "log_format",
        )
    }
    try:
        config = load_config(args.config, overrides=overrides)
    except ConfigError as exc:
        print(f"comfyfleet: {exc}", file=sys.stderr)
        return 2
    formatter = logs.configure(config.log_format, args.log_level)
    return asyncio.run(_serve(config, formatter))


async def _serve(config: ServerConfig, formatter: logging.Formatter | None = None) -> int:
    from comfyfleet.domain.backend_names import FleetError
    from comfyfleet.server.app import build_app
    from comfyfleet.server.gateway import Gateway

    try:
        gateway = Gateway.create(config)
    except FleetError as exc:  # a backend that cannot be set up (a name taken, no port)
        log.error("%s", exc)
        return 2
    if isinstance(formatter, logs.JsonFormatter):
        formatter.redact = log_redactor(config, gateway)
    runner = web.AppRunner(build_app(gateway), handle_signals=False, access_log=None)
    try:
        await runner.setup()  # opens the store
    except StoreError as exc:
        log.error("cannot open the store (%s): %s", _store_name(config), exc)
        await runner.cleanup()
        return 1
    site = web.TCPSite(runner, config.host, config.port)
    try:
        await site.start()
    except OSError as exc:
        log.error("cannot listen on %s:%s: %s", config.host, config.port, exc)
        await runner.cleanup()
        return 1
    log.info(
        "comfyfleet listening on http://%s:%s, data in %s, store %s",
        config.host,
        config.port,
        config.data_dir.resolve(),
        _store_name(config),
    )
    if config.auth_enabled:
        tenants = sorted({entry.tenant for entry in config.auth_tokens})
        log.info("authentication on: %d tokens, tenants %s", len(config.auth_tokens), tenants)
    elif not _is_loopback(config.host):
        log.warning(
            "listening on %s, which is not a loopback address, with no authentication: "
            "anyone who can reach it can run prompts and read outputs",
            config.host,
        )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down: running prompts get %.0f s to finish", config.shutdown_grace)
    await runner.cleanup()  # stops accepting, then the gateway drains (app on_shutdown)
    log.info("stopped")
    return 0


def log_redactor(config: ServerConfig, gateway: Gateway) -> Callable[[str], str]:
    """What JSON log text passes through: known secrets (auth tokens, API keys the server
    has seen, backends' auth header values, the store URL's password) and secret-shaped
    text (bearer tokens, key headers, URL query strings: see providers.redact) become ***."""
    tokens = [entry.token for entry in config.auth_tokens]
    store = config.store if config.store and is_postgres_url(config.store) else None

    def redact(text: str) -> str:
        specs = [lane.client.spec for lane in list(gateway.fleet.backends.values())]
        values = [value for spec in specs for value in spec.headers().values()]
        known: Redactor = gateway.fanout.vault.redactor().including(*tokens, *values)
        text = known.text(text)
        return redact_urls_in(redact_url(store, text) if store else text)

    return redact


def _store_name(config: ServerConfig) -> str:
    """The store as a log line shows it: a URL without its password, or the file."""
    if config.store and is_postgres_url(config.store):
        return redact_url(config.store)
    return str(Path(config.store).resolve() if config.store else config.database.resolve())


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything
