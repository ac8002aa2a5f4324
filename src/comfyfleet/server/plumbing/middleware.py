"""Middlewares: ComfyUI's cross-site request guard, the request body cap, and JSON bodies for
unexpected errors."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import time
from collections.abc import Iterable
from typing import NamedTuple
from urllib.parse import urlsplit

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler, Middleware

from comfyfleet.store.base import StoreError

log = logging.getLogger(__name__)

#: While the store does not answer: ComfyUI's error shape, and when to come back (s).
_STORE_UNAVAILABLE = {
    "error": {
        "type": "store_unavailable",
        "message": "The job store does not answer; try again shortly",
        "details": "",
        "extra_info": {},
    },
    "node_errors": {},
}
#: Seconds a client is asked to wait when the store refuses or does not answer.
STORE_RETRY_AFTER = 5

_SERVER_ERROR = {
    "error": {
        "type": "server_error",
        "message": "Internal server error",
        "details": "",
        "extra_info": {},
    },
    "node_errors": {},
}

# Host names resolved to "loopback or not", kept briefly: the Host header is client-chosen.
_LOOPBACK_TTL = 60.0
_LOOPBACK_CACHE_SIZE = 1024


class OriginGuard:
    """What one app's origin checks keep: which Host names are loopback, and whether
    it has told of a TLS proxy missing from trusted_proxies (once)."""

    def __init__(self) -> None:
        self._loopback: dict[str, tuple[float, bool]] = {}
        self._hinted_at_proxy = False

    async def is_loopback(self, host: str) -> bool:
        """True if `host` is, or resolves to, a loopback address."""
        host = host.strip("[]")
        literal = _loopback_literal(host)
        if literal is not None:
            return literal
        if host == "localhost" or host.endswith(".localhost"):
            return True
        now = time.monotonic()
        cached = self._loopback.get(host)
        if cached is not None and cached[0] > now:
            return cached[1]
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            infos = []
        # Any loopback address counts: the check then applies rather than being skipped.
        result = any(_loopback_literal(str(info[4][0])) for info in infos)
        if len(self._loopback) >= _LOOPBACK_CACHE_SIZE:
            self._loopback.clear()
        self._loopback[host] = (now + _LOOPBACK_TTL, result)
        return result

    def hint_at_proxy(self, origin: str) -> None:
        """Once: a page of this very host, over https, sent a request that arrived over
        http: the mark of a TLS proxy not listed in trusted_proxies."""
        if not self._hinted_at_proxy:
            self._hinted_at_proxy = True
            log.warning(
                "a page of %s sent a request that arrived over http: it is not taken as the "
                "server's own; behind a TLS-terminating proxy, list the proxy in trusted_proxies",
                origin,
            )


#: The app's guard, for checks outside the middleware (`same_origin`).
ORIGIN_GUARD = web.AppKey("origin_guard", OriginGuard)


def origin_check(guard: OriginGuard) -> Middleware:
    """Refuse cross-site requests to a server reached through a loopback address (ComfyUI's rule).

    Browsers let any page send requests to 127.0.0.1; such a request carries the page's
    Origin, which then differs from the Host. Only loopback hosts are checked, so reverse
    proxies with their own names keep working. Requests without Origin are not from a
    cross-site page and pass. OPTIONS gets an empty 200, as in ComfyUI. This guard is
    ComfyUI's, no stricter: the login cookie asks for the same origin (`same_origin`).
    """

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        host = request.host  # a trusted proxy's forwarded host, else the Host header
        origin = request.headers.get(hdrs.ORIGIN)
        if host and origin:
            verdict = origin_verdict(host, origin)
            if (
                verdict is not None
                and not verdict.same_site
                and await guard.is_loopback(verdict.host)
            ):
                log.warning("request with Origin %r does not match Host %r: 403", origin, host)
                return web.Response(status=403)
        if request.method == hdrs.METH_OPTIONS:
            return web.Response()
        return await handler(request)

    return middleware


def cors(allowed_origins: Iterable[str], guard: OriginGuard) -> Middleware:
    """Let browser pages from `allowed_origins` ("*" for any) call the API (CORS).

    Their requests skip the cross-site guard, preflight OPTIONS requests are answered,
    and every answer to them names the origin in Access-Control-Allow-Origin.
    """
    allowed = frozenset(o.rstrip("/").lower() for o in allowed_origins)
    checked = origin_check(guard)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get(hdrs.ORIGIN, "")
        if not origin or not ("*" in allowed or origin.rstrip("/").lower() in allowed):
            return await checked(request, handler)
        if request.method == hdrs.METH_OPTIONS:
            response: web.StreamResponse = web.Response()
        else:
            response = await handler(request)
        response.headers[hdrs.ACCESS_CONTROL_ALLOW_ORIGIN] = origin
        response.headers[hdrs.ACCESS_CONTROL_ALLOW_METHODS] = "GET, POST, DELETE, OPTIONS"
        response.headers[hdrs.ACCESS_CONTROL_ALLOW_HEADERS] = "Content-Type, Authorization"
        response.headers[hdrs.VARY] = "Origin"
        return response

    return middleware


def body_limit(max_bytes: int) -> Middleware:
    """413 at once for a request whose Content-Length is past `max_bytes`, its body unread.

    aiohttp applies its body cap (client_max_size) only while a handler reads the body, so
    such a request would otherwise be refused after `max_bytes` had arrived, or never, if
    the client waits before sending the rest. The answer is the upload routes': no body.
    Bodies without a Content-Length (chunked) are still cut off at the cap as they are read.
    """

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.content_length is not None and request.content_length > max_bytes:
            if request.path.startswith("/api/v2/"):  # Comfy API v2's error envelope
                message = f"The request body is larger than {max_bytes} bytes"
                error = {"code": "too_large", "message": message, "details": None}
                return web.json_response({"error": error}, status=413)
            return web.Response(status=413)
        return await handler(request)

    return middleware


class _Verdict(NamedTuple):
    host: str  # the Host header's name, to test for loopback
    same_site: bool


def origin_verdict(host_header: str, origin_header: str) -> _Verdict | None:
    """Whether Origin names the Host by ComfyUI's rule; None when either has no host name
    to compare.

    Names are compared case-insensitively; ports only when both carry one, since
    some browsers leave the port out of one of the two; schemes not at all. Good enough
    to keep other sites' pages off a loopback server, not to trust a cookie with:
    that is `same_origin`.
    """
    try:
        host = urlsplit("//" + host_header.strip().lower())
        origin = urlsplit(origin_header.strip().lower())
    except ValueError:  # e.g. an unclosed IPv6 bracket: unreadable, so not trusted
        return _Verdict(host_header, False)
    if not host.hostname or not origin.hostname:  # e.g. `Origin: null`
        return None
    try:
        host_port, origin_port = host.port, origin.port
    except ValueError:  # not a port number: cannot be the same site
        return _Verdict(host.hostname, False)
    same = host.hostname == origin.hostname and (
        host_port is None or origin_port is None or host_port == origin_port
    )
    return _Verdict(host.hostname, same)


_DEFAULT_PORTS = {"http": 80, "https": 443}


class Origin(NamedTuple):
    scheme: str
    host: str
    port: int  # made explicit: 80 for http, 443 for https when the text has none


def parse_origin(text: str) -> Origin | None:
    """An http(s) origin as a browser's Origin header spells it (`scheme://host[:port]`);
    None for `null`, and for anything else, which no browser sends as an origin."""
    try:
        parts = urlsplit(text.strip().lower())
        port = parts.port
    except ValueError:  # e.g. an unclosed IPv6 bracket, a port that is not a number
        return None
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
        return None
    if parts.path or parts.query or parts.fragment or "@" in parts.netloc:
        return None
    return Origin(
        parts.scheme, parts.hostname, _DEFAULT_PORTS[parts.scheme] if port is None else port
    )


def request_origin(request: web.Request) -> Origin | None:
    """The origin a request was sent to: the scheme it arrived with and its Host, or
    what a trusted proxy forwarded (see `trusted_proxies`)."""
    return parse_origin(f"{request.scheme}://{request.host}")


def same_origin(request: web.Request, origin_header: str) -> bool:
    """Whether `origin_header` is the origin the request was sent to: scheme, host and
    port all equal, as a browser compares origins (`null` never is)."""
    own = request_origin(request)
    origin = parse_origin(origin_header)
    if own is None or origin is None:
        return False
    if origin == own:
        return True
    guard = request.app.get(ORIGIN_GUARD)
    if (
        guard is not None
        and origin.host == own.host
        and (own.scheme, origin.scheme)
        == (
            "http",
            "https",
        )
    ):
        guard.hint_at_proxy(origin_header)
    return False


def _loopback_literal(text: str) -> bool | None:
    """Whether an IP address literal is loopback; None when `text` is not an IP address."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """An unexpected exception becomes ComfyUI's JSON error body with status 500.

    The traceback goes to the log only: it can hold paths and values clients should not
    see. HTTP exceptions are deliberate answers and pass through unchanged.
    """
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except ConnectionResetError:  # the client left: there is no one to answer
        raise
    except StoreError as exc:
        if request.writer.output_size > 0:
            raise
        log.warning("%s %s: the store does not answer: %s", request.method, request.path, exc)
        headers = {hdrs.RETRY_AFTER: str(STORE_RETRY_AFTER)}
        return web.json_response(_STORE_UNAVAILABLE, status=503, headers=headers)
    except Exception:
        if request.writer.output_size > 0:  # a reply was already started; aiohttp closes it
            raise
        log.exception("unhandled error in %s %s", request.method, request.path)
        return web.json_response(_SERVER_ERROR, status=500)
