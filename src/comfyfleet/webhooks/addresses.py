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

from comfyfleet.errors import ComfyfleetError

MAX_URL = 2048
#: Seconds a submit waits on DNS to check a webhook's host.
SUBMIT_DNS_TIMEOUT = 5.0

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class NotAllowed(ComfyfleetError, ValueError):
    """A webhook URL that may not be used; the message says why."""


# IPv6 ranges whose last 32 bits are the IPv4 address a packet goes to.
_EMBEDDING_IPV4 = (
    ipaddress.IPv6Network("::/96"),  # IPv4-compatible (deprecated; `::1` and `::` too)
    ipaddress.IPv6Network("::ffff:0:0:0/96"),  # IPv4-translated (SIIT)
    ipaddress.IPv6Network("64:ff9b::/96"),  # NAT64, well-known prefix
)
# Local-use NAT64 (RFC 8215): translated by the site's own gateway, never global.
_LOCAL_NAT64 = ipaddress.IPv6Network("64:ff9b:1::/48")


def embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries and is delivered to: mapped, compatible,
    translated, NAT64 or 6to4 (Teredo's range is not public as a whole)."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if any(address in network for network in _EMBEDDING_IPV4):
        return ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF)
    return None


def is_public(address: Address) -> bool:
    """Globally routable unicast: not loopback, private, link-local, shared, reserved or
    multicast. An IPv6 address that carries an IPv4 one is judged as that IPv4 address."""
    if isinstance(address, ipaddress.IPv6Address):
        if address in _LOCAL_NAT64:
            return False
        address = embedded_ipv4(address) or address
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
    """The IP address `host` names, read as a resolver reads it: a trailing dot (the DNS
    root) left off, IPv4 in every form inet_aton takes (`127.1`, `0x7f.1`, `2130706433`);
    None for a name."""
    text = host.strip("[]").rstrip(".")
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        pass
    try:
        return ipaddress.IPv4Address(socket.inet_aton(text))
    except (OSError, ValueError):
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
    name = host.lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
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
