"""Where a webhook may go: http(s) URLs of public hosts only, unless private addresses are
allowed. A URL is checked when a prompt names it, and every address a name resolves to is
checked again as a delivery connects (DNS may change in between): the sender's resolver
hands the connection only public addresses."""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import socket
from urllib.parse import SplitResult, urlsplit

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver

MAX_URL = 2048
#: Seconds a submit waits on DNS to check a webhook's host.
SUBMIT_DNS_TIMEOUT = 5.0

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class NotAllowed(ValueError):
    """A webhook URL that may not be used; the message says why."""


def is_public(address: Address) -> bool:
    """Globally routable unicast: not loopback, private, link-local, shared, reserved or
    multicast (an IPv4 address mapped into IPv6 is judged as itself)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


def parse_url(url: object) -> SplitResult:
    """`url` split, if it can be a webhook's: NotAllowed otherwise."""
    if not isinstance(url, str) or not url:
        raise NotAllowed("webhook_url must be a non-empty string")
    if len(url) > MAX_URL:
        raise NotAllowed(f"webhook_url is longer than {MAX_URL} characters")
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise NotAllowed("webhook_url holds blanks or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise NotAllowed(f"webhook_url is not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise NotAllowed("webhook_url must be an http or https URL")
    if not parts.hostname:
        raise NotAllowed("webhook_url has no host")
    if parts.username is not None or parts.password is not None:
        raise NotAllowed("webhook_url may not carry credentials (the signature authenticates)")
    if port == 0:
        raise NotAllowed("webhook_url has port 0")
    return parts


def literal_address(host: str) -> Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def check_literal(host: str) -> None:
    """NotAllowed when `host` is an IP address that is not public (names pass here)."""
    address = literal_address(host)
    if address is not None and not is_public(address):
        raise NotAllowed(f"webhook_url goes to a non-public address ({address})")


async def check_host(host: str) -> None:
    """NotAllowed when `host` is, or resolves to, a non-public address. A name that does
    not resolve (now) passes: the delivery checks what it connects to anyway."""
    check_literal(host)
    if literal_address(host) is not None:
        return
    if host.lower().rstrip(".") == "localhost" or host.lower().endswith(".localhost"):
        raise NotAllowed("webhook_url goes to localhost")
    loop = asyncio.get_running_loop()
    try:
        infos = await asyncio.wait_for(
            loop.getaddrinfo(host, None, type=socket.SOCK_STREAM), SUBMIT_DNS_TIMEOUT
        )
    except (OSError, TimeoutError, UnicodeError):
        return
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%")[0])
        if not is_public(address):
            raise NotAllowed(f"webhook_url's host {host} resolves to a non-public address")


class PublicResolver(AbstractResolver):
    """Resolves as aiohttp does, keeping only public addresses: a name with none left
    fails to connect, so no delivery reaches a private address through DNS."""

    def __init__(self) -> None:
        self._resolver = ThreadedResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self._resolver.resolve(host, port, family)
        public = [r for r in found if is_public(ipaddress.ip_address(r["host"].split("%")[0]))]
        if not public:
            # strerror: what aiohttp's connection error shows.
            raise OSError(errno.EHOSTUNREACH, f"{host} resolves to no public address")
        return public

    async def close(self) -> None:
        await self._resolver.close()
