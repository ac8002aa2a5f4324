"""Trusted reverse proxies: the scheme and host the client used, as the proxy says.

Behind a proxy that terminates TLS, a request arrives over plain http, with the Host the
proxy chose; the client's scheme and host come in headers any client can also send. They
are read only from a request whose direct peer is one of the listed proxies:

- `Forwarded` (RFC 7239), when the request has one. Each proxy appends an element, so the
  last one is the direct peer's; while an element's `for` is a listed proxy too, the
  element before it (that proxy's) is read instead. Its `proto` and `host` are used.
- otherwise `X-Forwarded-Proto` and `X-Forwarded-Host`, their last values (a proxy
  that appends adds its own at the end).

The request is then handled as if it had arrived with that scheme and host: its
`scheme`, `secure`, `host` and `url` say so (the origin checks and the cookie's `Secure`
use them). A value that is not an http(s) scheme or a host[:port] is ignored.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Mapping

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from comfyfleet.server.config import ProxyNetwork
from comfyfleet.server.plumbing.middleware import parse_origin


def trusted_proxies(networks: Collection[ProxyNetwork]) -> Middleware:
    """Requests from `networks` take the scheme and host their forwarding headers give."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not is_listed(request.remote, networks):
            return await handler(request)
        scheme, host = _forwarded(request, networks)
        if scheme is None and host is None:
            return await handler(request)
        return await handler(
            request.clone(scheme=scheme or request.scheme, host=host or request.host)
        )

    return middleware


def is_listed(address: str | None, networks: Collection[ProxyNetwork]) -> bool:
    """Whether the IP address `address` lies in one of `networks` (names never do)."""
    try:
        ip = ipaddress.ip_address((address or "").partition("%")[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # a dual-stack socket's view of an IPv4 peer
    return any(ip in network for network in networks)


def _forwarded(
    request: web.Request, networks: Collection[ProxyNetwork]
) -> tuple[str | None, str | None]:
    """(scheme, host) the client used, each None when not (validly) given."""
    elements = request.forwarded
    if elements:
        chosen: Mapping[str, str] = elements[-1]
        for element in reversed(elements):
            chosen = element
            if not is_listed(_node_address(element.get("for", "")), networks):
                break
        return _scheme(chosen.get("proto")), _host(chosen.get("host"))
    proto = _last(request, "X-Forwarded-Proto")
    return _scheme(proto), _host(_last(request, "X-Forwarded-Host"))


def _node_address(node: str) -> str:
    """The address of a Forwarded node (`192.0.2.1`, `192.0.2.1:80`, `[2001:db8::1]:80`)."""
    if node.startswith("["):
        return node[1:].partition("]")[0]
    return node.partition(":")[0] if node.count(":") == 1 else node


def _last(request: web.Request, name: str) -> str | None:
    values = [v.strip() for v in ",".join(request.headers.getall(name, [])).split(",")]
    values = [v for v in values if v]
    return values[-1] if values else None


def _scheme(value: str | None) -> str | None:
    scheme = (value or "").strip().lower()
    return scheme if scheme in ("http", "https") else None


def _host(value: str | None) -> str | None:
    host = (value or "").strip()
    return host if host and parse_origin(f"http://{host}") is not None else None
