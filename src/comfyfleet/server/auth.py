"""Optional authentication: bearer tokens, each standing for a tenant.

With tokens configured, every request (the WebSocket included) must present one, as
`Authorization: Bearer <token>` or `?token=<token>` (what a browser can do for an
`<img src>` or a WebSocket). The request then acts for the token's tenant: it sees and
touches only that tenant's jobs and files. Routes marked admin also need an admin token.

Tokens are secrets: only their SHA-256 is kept here, compared in constant time, and no
token is ever logged or stored.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler, Middleware

from comfyfleet.protocol.errors import error, prompt_error_body
from comfyfleet.server.config import AuthToken
from comfyfleet.tenants import DEFAULT_TENANT

log = logging.getLogger(__name__)

#: The query parameter that carries a token where no header can be set.
TOKEN_PARAM = "token"


@dataclass(frozen=True)
class Tenant:
    name: str
    admin: bool = False


class TokenTable:
    """Which tenant each token stands for; holds digests, never the tokens."""

    def __init__(self, tokens: Iterable[AuthToken]) -> None:
        self._entries: list[tuple[bytes, Tenant]] = []
        seen: set[bytes] = set()
        for entry in tokens:
            digest = _digest(entry.token)
            if digest not in seen:  # the first entry of a token wins
                seen.add(digest)
                self._entries.append((digest, Tenant(entry.tenant, entry.admin)))

    def __bool__(self) -> bool:
        return bool(self._entries)

    def __repr__(self) -> str:
        return f"TokenTable(tenants={self.tenants()!r})"

    def tenants(self) -> list[str]:
        return sorted({tenant.name for _, tenant in self._entries})

    def lookup(self, token: str) -> Tenant | None:
        """The token's tenant, or None. Every entry is compared, each in constant time."""
        digest = _digest(token)
        found = None
        for known, tenant in self._entries:
            if hmac.compare_digest(digest, known) and found is None:
                found = tenant
        return found

    def redact(self, args: Sequence[str]) -> list[str]:
        """`args` (e.g. sys.argv) with every token, alone or as `--flag=token`, as `***`."""
        out = []
        for arg in args:
            flag, equals, value = arg.partition("=")
            if self.lookup(arg) is not None:
                arg = "***"
            elif equals and self.lookup(value) is not None:
                arg = f"{flag}=***"
            out.append(arg)
        return out


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


TENANT = web.RequestKey("comfyfleet_tenant", Tenant)


def request_tenant(request: web.Request) -> Tenant | None:
    """The tenant a request acts for; None when authentication is off."""
    return request.get(TENANT)


def scope(request: web.Request) -> str | None:
    """The tenant whose jobs a request may see; None (all of them) when auth is off."""
    tenant = request.get(TENANT)
    return None if tenant is None else tenant.name


def tenant_name(request: web.Request) -> str:
    """The tenant new jobs and files of a request belong to (`default` when auth is off)."""
    tenant = request.get(TENANT)
    return DEFAULT_TENANT if tenant is None else tenant.name


def visible(request: web.Request, owner: str) -> bool:
    """Whether a job of tenant `owner` exists as far as this request can tell."""
    tenant = request.get(TENANT)
    return tenant is None or tenant.name == owner


def presented_token(request: web.Request) -> str | None:
    """The token a request carries: the Authorization header first, then `?token=`."""
    header = request.headers.get(hdrs.AUTHORIZATION, "")
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return request.query.get(TOKEN_PARAM) or None


def _refusal(status: int, type_: str, message: str) -> web.Response:
    body = prompt_error_body(error(type_, message))
    headers = {hdrs.WWW_AUTHENTICATE: 'Bearer realm="comfyfleet"'} if status == 401 else {}
    return web.json_response(body, status=status, headers=headers)


def authenticate(table: TokenTable, admin_handlers: Collection[object] = ()) -> Middleware:
    """Every request needs a valid token; `admin_handlers` also need an admin token.

    Placed after the cross-site and CORS middlewares: preflight requests are answered
    there without a token, and a refusal here still gets the CORS headers.
    """

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        token = presented_token(request)
        tenant = table.lookup(token) if token is not None else None
        if tenant is None:
            what = "an unknown token" if token is not None else "no token"
            log.debug("%s %s refused: %s", request.method, request.path, what)
            return _refusal(
                401, "unauthorized", f"Authentication required: the request carries {what}"
            )
        if not tenant.admin and request.match_info.handler in admin_handlers:
            return _refusal(403, "forbidden", "This route needs an admin token")
        request[TENANT] = tenant
        return await handler(request)

    return middleware
