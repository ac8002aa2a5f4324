"""The login page: a token typed once, kept in a cookie for the server's own pages.

`GET /login` shows a form, `POST /login` checks the token and sets the cookie (see
`comfyfleet.server.access.auth`), then sends the browser back where it was going; `POST /logout`
removes the cookie. Opening a page with `?token=` does the same as logging in. Without
authentication there is nothing to log into: both send the browser on at once.

Neither is taken from another site's page (`auth.may_set_session`): it could log the
browser in as the other site chooses, or out.
"""

from __future__ import annotations

import html
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from comfyfleet.server.access.auth import (
    LINK_REFUSED,
    TOKEN_COOKIE,
    TokenTable,
    from_elsewhere,
    may_set_session,
    set_token_cookie,
)
from comfyfleet.server.plumbing.routing import Route

#: Bytes of the login form a client may send.
MAX_FORM = 16 * 1024

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>comfyfleet: log in</title>
<meta name="viewport" content="width=device-width,initial-scale=1">
<style>
body{{font:15px system-ui,sans-serif;background:#202020;color:#ddd;display:flex;
align-items:center;justify-content:center;height:100vh;margin:0}}
form{{background:#2b2b2b;padding:2em;border-radius:8px;min-width:20em}}
input{{width:100%;box-sizing:border-box;padding:.6em;margin:.6em 0 1em;background:#151515;
color:#eee;border:1px solid #555;border-radius:4px}}
button{{padding:.6em 1.4em;background:#3b6fd8;color:#fff;border:0;border-radius:4px}}
.error{{color:#ff8080}}
</style></head><body>
<form method="post" action="/login">
<h2>comfyfleet</h2>
<p>This server needs a token.</p>{error}
<label>Token<input type="password" name="token" autocomplete="current-password" autofocus></label>
<input type="hidden" name="next" value="{next}">
<button type="submit">Log in</button>
</form></body></html>
"""


def safe_next(value: object) -> str:
    """Where to go after logging in: a path on this server, `/` for anything else."""
    if not isinstance(value, str) or not value.startswith("/") or value.startswith("//"):
        return "/"
    if "\\" in value or any(ord(c) < 0x20 for c in value) or urlsplit(value).netloc:
        return "/"
    return value


_FROM_ELSEWHERE = "Refused: this came from another site's page, not from this server's own."
_LINK_REFUSED = (
    "The token in the link was not used: a link on another site cannot log you in. "
    "Enter the token here."
)
_LOGGED_IN = "This browser is logged in with another token: log out first."


def _page(next_url: str, error: str = "", status: int = 200) -> web.Response:
    notice = f'<p class="error">{html.escape(error)}</p>' if error else ""
    body = _PAGE.format(error=notice, next=html.escape(next_url, quote=True))
    return web.Response(
        status=status,
        text=body,
        content_type="text/html",
        headers={"Cache-Control": "no-store"},
    )


def login_routes(tokens: TokenTable) -> list[Route]:
    async def login_page(request: web.Request) -> web.StreamResponse:
        next_url = safe_next(request.query.get("next"))
        if not tokens:
            raise web.HTTPSeeOther(next_url)
        refused = request.query.get("link") == LINK_REFUSED
        return _page(next_url, _LINK_REFUSED if refused else "")

    async def login(request: web.Request) -> web.StreamResponse:
        if request.content_length is not None and request.content_length > MAX_FORM:
            return web.Response(status=413)
        try:
            form = await request.post()
        except (ValueError, LookupError, RuntimeError, HttpProcessingError):
            return web.Response(status=400)  # not a form a browser sends
        next_url = safe_next(form.get("next"))
        if not tokens:
            raise web.HTTPSeeOther(next_url)
        if from_elsewhere(request):
            return _page(next_url, _FROM_ELSEWHERE, status=403)
        token = form.get("token")
        if not isinstance(token, str) or not token or tokens.lookup(token) is None:
            return _page(next_url, "That token is not known here.")
        if not may_set_session(request, token, tokens):
            return _page(next_url, _LOGGED_IN, status=403)
        answer = web.HTTPSeeOther(next_url)
        set_token_cookie(request, answer, token)
        raise answer

    async def logout(request: web.Request) -> web.StreamResponse:
        if from_elsewhere(request):
            return web.Response(status=403, text=_FROM_ELSEWHERE)
        answer = web.HTTPSeeOther("/login")
        answer.del_cookie(TOKEN_COOKIE, path="/")
        raise answer

    return [
        Route("GET", "/login", login_page, api_alias=False, public=True),
        Route("POST", "/login", login, api_alias=False, public=True),
        Route("POST", "/logout", logout, api_alias=False, public=True),
    ]
