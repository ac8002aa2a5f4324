"""Optional authentication: bearer tokens, each standing for a tenant.

With tokens configured, every request (the WebSocket included) must present one, as
`Authorization: Bearer <token>` or `?token=<token>` (what a browser can do for an
`<img src>` or a WebSocket), or the cookie the login page sets for the server's own pages
(the editor and the dashboard). The request then acts for the token's tenant: it sees and
touches only that tenant's jobs and files. Routes marked admin also need an admin token.

The cookie is how the graph editor works with authentication on: its code calls the API,
opens the WebSocket, loads images and extensions without ever adding a token, and a
browser sends a cookie with each of those. It is HttpOnly (no script reads it) and
SameSite=Lax (no other site's page sends it along with its requests); and it counts only
for requests of the server's own pages: one carrying an Origin that is not the server's
own (scheme, host and port) is not authenticated by it. Nor does another site's page set
or replace it (`may_set_session`).

Tokens are secrets: only their SHA-256 is kept here, compared in constant time, and no
token is ever logged or stored.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import quote

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler, Middleware

from comfyfleet.protocol.errors import error, prompt_error_body
from comfyfleet.server.config import AuthToken
from comfyfleet.server.plumbing.middleware import same_origin
from comfyfleet.tenants import DEFAULT_TENANT

log = logging.getLogger(__name__)

#: The query parameter that carries a token where no header can be set.
TOKEN_PARAM = "token"
#: The cookie the login page sets: the token, for the server's own pages.
TOKEN_COOKIE = "comfyfleet_token"
#: Seconds the cookie is kept (30 days).
COOKIE_MAX_AGE = 30 * 24 * 3600


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
    """The token a request carries: the Authorization header first, then `?token=`, then
    the login cookie (only from the server's own pages: see `_cookie_token`)."""
    header = request.headers.get(hdrs.AUTHORIZATION, "")
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return request.query.get(TOKEN_PARAM) or _cookie_token(request)


def _cookie_token(request: web.Request) -> str | None:
    """The cookie's token, unless the request comes from another origin's page: a request
    a page sends elsewhere carries its Origin, which then is not this server's. Another
    port or scheme of the same host is another origin (the browser sends the cookie
    there too)."""
    token = request.cookies.get(TOKEN_COOKIE)
    origin = request.headers.get(hdrs.ORIGIN)
    if not token or origin is None:
        return token or None
    return token if same_origin(request, origin) else None


#: What a browser says of where a request comes from (never set by a page's script).
SEC_FETCH_SITE = "Sec-Fetch-Site"


def from_elsewhere(request: web.Request) -> bool:
    """Whether a browser sent the request for another origin's page: its Sec-Fetch-Site
    says another site (`same-site` is another origin too), or its Origin is not this
    server's (`null` included)."""
    site = request.headers.get(SEC_FETCH_SITE, "").strip().lower()
    if site and site not in ("same-origin", "none"):  # none: typed, a bookmark, an app
        return True
    origin = request.headers.get(hdrs.ORIGIN)
    return origin is not None and not same_origin(request, origin)


def may_set_session(request: web.Request, token: str, table: TokenTable) -> bool:
    """Whether the request may put `token` in the cookie. Never for another origin's
    page: it would log the browser in as someone else (login CSRF). A browser that says
    nothing of where the request comes from (no Sec-Fetch-Site, no Origin) may start a
    session, never replace another one it has."""
    if from_elsewhere(request):
        return False
    if SEC_FETCH_SITE in request.headers or hdrs.ORIGIN in request.headers:
        return True
    current = request.cookies.get(TOKEN_COOKIE)
    return not current or current == token or table.lookup(current) is None


def set_token_cookie(request: web.Request, response: web.StreamResponse, token: str) -> None:
    response.set_cookie(
        TOKEN_COOKIE,
        token,
        max_age=COOKIE_MAX_AGE,
        path="/",
        httponly=True,
        samesite="Lax",
        secure=request.secure,
    )


#: `?link=refused` on the login page: a token link did not log in (see `authenticate`).
LINK_REFUSED = "refused"


def login_url(back_to: str, *, link_refused: bool = False) -> str:
    """The login page, which sends the browser back to `back_to` once it has a token."""
    url = "/login?next=" + quote(back_to, safe="/")
    return url + "&link=" + LINK_REFUSED if link_refused else url


def _clean_page_url(request: web.Request) -> str:
    """The page's URL without its `token` parameter."""
    query = {k: v for k, v in request.query.items() if k != TOKEN_PARAM}
    return str(request.rel_url.with_query(query))


#: Routes under this prefix answer in Comfy API v2's error envelope.
V2_PREFIX = "/api/v2/"


def _refusal(request: web.Request, status: int, type_: str, message: str) -> web.Response:
    body: dict[str, object] = prompt_error_body(error(type_, message))
    if request.path.startswith(V2_PREFIX):
        body = {"error": {"code": type_, "message": message, "details": None}}
    headers = {hdrs.WWW_AUTHENTICATE: 'Bearer realm="comfyfleet"'} if status == 401 else {}
    return web.json_response(body, status=status, headers=headers)


def authenticate(
    table: TokenTable,
    admin_handlers: Collection[object] = (),
    *,
    public: Collection[object] = (),
    pages: Collection[object] = (),
) -> Middleware:
    """Every request needs a valid token; `admin_handlers` also need an admin token;
    `public` handlers need none. A page (`pages`) asked for without one sends the browser
    to the login page; with `?token=` it is sent back to itself, the token now in the
    cookie and out of its URL. A link from another site sets no cookie (`may_set_session`):
    the page opens in the session the browser has, else the login page says why.

    Placed after the cross-site and CORS middlewares: preflight requests are answered
    there without a token, and a refusal here still gets the CORS headers.
    """

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        route_handler = request.match_info.handler
        if route_handler in public:
            return await handler(request)
        token = presented_token(request)
        tenant = table.lookup(token) if token is not None else None
        if route_handler in pages and request.method == hdrs.METH_GET:
            linked = request.query.get(TOKEN_PARAM)
            if linked:  # out of the URL, where it would win over the cookie
                page = _clean_page_url(request)
                back = web.HTTPFound(page)
                known = tenant is not None
                if known and may_set_session(request, linked, table):
                    set_token_cookie(request, back, linked)
                    raise back
                session = _cookie_token(request)
                if session is None or table.lookup(session) is None:
                    raise web.HTTPFound(login_url(page, link_refused=known))
                raise back
            if tenant is None:
                raise web.HTTPFound(login_url(request.path_qs))
        if tenant is None:
            what = "an unknown token" if token is not None else "no token"
            log.debug("%s %s refused: %s", request.method, request.path, what)
            return _refusal(
                request, 401, "unauthorized", f"Authentication required: the request carries {what}"
            )
        if not tenant.admin and route_handler in admin_handlers:
            return _refusal(request, 403, "forbidden", "This route needs an admin token")
        request[TENANT] = tenant
        return await handler(request)

    return middleware
