"""With authentication on, the server's own pages work with a token given once: the login
page (or `?token=` on the page's URL) keeps it in a cookie the browser sends along with the
editor's API calls, WebSocket, images and scripts, and only with those of this server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import aiohttp
import pytest

from tests.integration.gateway.test_auth import ALICE, BOB, ROOT, tenants
from tests.integration.gateway.wire import Served


@asynccontextmanager
async def browser_like(served: Served) -> AsyncIterator[aiohttp.ClientSession]:
    """A client that keeps cookies (of an IP address too) and follows no redirect."""
    async with aiohttp.ClientSession(
        served.url, cookie_jar=aiohttp.CookieJar(unsafe=True)
    ) as session:
        yield session


async def _log_in(session: aiohttp.ClientSession, token: str, next_url: str = "/") -> str:
    form = {"token": token, "next": next_url}
    async with session.post("/login", data=form, allow_redirects=False) as answer:
        assert answer.status == 303, await answer.text()
        cookie = answer.headers["Set-Cookie"]
        assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and "Path=/" in cookie
        return answer.headers["Location"]


async def test_a_page_without_a_token_goes_to_the_login_page_and_back(tmp_path: Path) -> None:
    async with tenants(tmp_path, local_slots=0) as clients, browser_like(clients.anonymous) as web:
        async with web.get("/?x=1", allow_redirects=False) as page:
            assert page.status == 302
            location = urlsplit(page.headers["Location"])
            assert (location.path, parse_qs(location.query)) == ("/login", {"next": ["/?x=1"]})
        async with web.get("/login?next=/%3Fx%3D1") as login:
            text = await login.text()
            assert login.headers["Content-Type"].startswith("text/html")
            assert 'name="token"' in text and 'value="/?x=1"' in text
        async with web.post("/login", data={"token": "nope", "next": "/"}) as refused:
            assert "not known" in await refused.text()
            assert "Set-Cookie" not in refused.headers
        async with web.get("/api/settings") as api:
            assert api.status == 401  # API routes still answer 401, never a redirect
        assert await _log_in(web, ALICE, "/?x=1") == "/?x=1"
        async with web.get("/") as editor:
            assert editor.status == 200 and "<title>ComfyUI</title>" in await editor.text()
        async with web.post("/api/settings/Comfy.Locale", json="fr") as saved:
            assert saved.status == 200
        assert await clients.alice.get("/api/settings") == {"Comfy.Locale": "fr"}
        assert await clients.bob.get("/api/settings") == {}
        async with web.ws_connect("/ws?clientId=editor") as ws:  # the editor's own socket
            assert (await ws.receive_json())["type"] == "status"


async def test_token_in_the_page_url_moves_to_the_cookie(tmp_path: Path) -> None:
    async with tenants(tmp_path, local_slots=0) as clients, browser_like(clients.anonymous) as web:
        async with web.get(f"/?token={BOB}&x=1", allow_redirects=False) as page:
            assert page.status == 302
            assert page.headers["Location"] == "/?x=1"  # the token leaves the URL
            assert "HttpOnly" in page.headers["Set-Cookie"]
        async with web.get("/api/users") as users:
            assert users.status == 200
        async with web.post("/api/userdata/workflows%2Fb.json", data=b"{}") as saved:
            assert saved.status == 200
        assert (await clients.bob.request("GET", "/api/userdata/workflows%2Fb.json")).status == 200
        assert (
            await clients.alice.request("GET", "/api/userdata/workflows%2Fb.json")
        ).status == 404


async def test_the_cookie_counts_only_for_the_servers_own_pages(tmp_path: Path) -> None:
    async with tenants(tmp_path, local_slots=0) as clients, browser_like(clients.anonymous) as web:
        await _log_in(web, ALICE)
        host = clients.anonymous.url.removeprefix("http://")
        own = {"Origin": f"http://{host}"}
        async with web.post("/api/settings/A", json=1, headers=own) as same_site:
            assert same_site.status == 200
        for origin in ("https://evil.example", "null", f"http://{host.split(':')[0]}:1"):
            foreign = {"Origin": origin}
            async with web.post("/api/settings/A", json=2, headers=foreign) as refused:
                assert refused.status in (401, 403), origin
            async with web.get("/api/settings", headers=foreign) as read:
                assert read.status in (401, 403), origin
        assert await clients.alice.get("/api/settings") == {"A": 1}
        # Admin routes need an admin token, whatever carries it.
        async with web.get("/api/fleet/backends") as admin_only:
            assert admin_only.status == 403
    async with (
        tenants(tmp_path / "2", local_slots=0) as clients,
        browser_like(clients.anonymous) as web,
    ):
        await _log_in(web, ROOT)
        async with web.get("/api/fleet/backends") as admin:
            assert admin.status == 200


#: What the editor sends: each also under /api/ (a valid body, or a harmless one).
STATE_CHANGING = [
    ("/api/prompt", {"prompt": {}}),
    ("/api/queue", {"clear": False}),
    ("/api/interrupt", {}),
    ("/api/userdata/workflows%2Fcsrf.json", {}),
    ("/api/settings/Comfy.Csrf", 1),
]


@pytest.mark.parametrize(
    ("host", "origin", "counts"),
    [
        ("fleet.example.com", "http://fleet.example.com", True),
        ("fleet.example.com", "http://fleet.example.com:80", True),  # the default, spelled out
        ("fleet.example.com:80", "http://fleet.example.com", True),
        ("FLEET.example.com", "http://fleet.EXAMPLE.com", True),
        ("fleet.example.com:8188", "http://fleet.example.com:8188", True),
        ("fleet.example.com", "http://fleet.example.com:8080", False),  # another port
        ("fleet.example.com:8080", "http://fleet.example.com", False),
        ("fleet.example.com", "https://fleet.example.com", False),  # arrived over http
        ("fleet.example.com:443", "https://fleet.example.com", False),
        ("fleet.example.com", "http://other.example.com", False),
        ("fleet.example.com", "http://fleet.example.com/", False),  # not an origin
        ("fleet.example.com", "ftp://fleet.example.com", False),
        ("fleet.example.com", "http://fleet.example.com:0", False),
        ("fleet.example.com", "http://x@fleet.example.com", False),
        ("fleet.example.com", "null", False),
        ("127.0.0.1:8188", "http://127.0.0.1", False),  # port 80, not 8188
    ],
)
async def test_the_cookie_counts_only_for_the_servers_own_origin(
    tmp_path: Path, host: str, origin: str, counts: bool
) -> None:
    """Scheme, host and port, as a browser compares origins: a page on another port or
    scheme of the same host is another site's."""
    async with tenants(tmp_path, local_slots=0) as clients:
        served = clients.anonymous
        headers = {"Host": host, "Origin": origin, "Cookie": f"comfyfleet_token={ALICE}"}
        for path, body in STATE_CHANGING:
            async with served.session.post(served.url + path, json=body, headers=headers) as answer:
                # An empty prompt is a 400 of a request the cookie authenticated.
                assert (answer.status != 401) == counts, (path, answer.status)
        stored = (await clients.alice.request("GET", "/api/userdata/workflows%2Fcsrf.json")).status
        assert stored == (200 if counts else 404)
        assert await clients.alice.get("/api/settings") == ({"Comfy.Csrf": 1} if counts else {})


FLEET = {"Host": "fleet.example.com"}  # not loopback: ComfyUI's guard does not apply


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"Origin": "https://evil.example"}, 403),
        ({"Origin": "null"}, 403),  # a sandboxed page, or a redirect from another site
        ({"Origin": "http://fleet.example.com:8080"}, 403),  # another port
        ({"Origin": "https://fleet.example.com"}, 403),  # another scheme
        ({"Sec-Fetch-Site": "cross-site"}, 403),
        ({"Sec-Fetch-Site": "same-site"}, 403),  # a sibling host: another origin
        ({"Sec-Fetch-Site": "same-origin", "Origin": "https://evil.example"}, 403),
        ({"Origin": "http://fleet.example.com", "Sec-Fetch-Site": "same-origin"}, 303),
        ({"Origin": "http://fleet.example.com:80"}, 303),
        ({}, 303),  # not a browser's page: a script logging itself in
    ],
)
async def test_only_the_servers_own_login_form_sets_the_cookie(
    tmp_path: Path, headers: dict[str, str], status: int
) -> None:
    async with tenants(tmp_path, local_slots=0) as clients:
        served = clients.anonymous
        form = {"token": ALICE, "next": "/"}
        async with served.session.post(
            served.url + "/login", data=form, headers={**FLEET, **headers}, allow_redirects=False
        ) as answer:
            assert answer.status == status, await answer.text()
            assert ("Set-Cookie" in answer.headers) == (status == 303)
            if status == 403:
                assert "another site" in await answer.text()


async def test_a_login_that_says_nothing_of_its_page_replaces_no_other_session(
    tmp_path: Path,
) -> None:
    async with tenants(tmp_path, local_slots=0) as clients:
        served = clients.anonymous
        form = {"token": ALICE, "next": "/"}
        for cookie, status in ((BOB, 403), (ALICE, 303), ("stale-token", 303)):
            headers = {**FLEET, "Cookie": f"comfyfleet_token={cookie}"}
            async with served.session.post(
                served.url + "/login", data=form, headers=headers, allow_redirects=False
            ) as answer:
                assert answer.status == status, cookie
                if status == 403:
                    assert "log out first" in await answer.text()
                    assert "Set-Cookie" not in answer.headers


@pytest.mark.parametrize(
    ("fetch_site", "cookie", "sets"),
    [
        ("cross-site", None, False),  # a link on another site's page
        ("same-site", None, False),
        ("cross-site", BOB, False),  # nor does it replace the session the browser has
        ("none", None, True),  # typed, a bookmark, or opened from another program
        ("none", BOB, True),
        ("same-origin", BOB, True),  # a link on the server's own pages
        (None, None, True),  # a browser that does not say where the link was
        (None, "stale-token", True),  # ... replacing no session (the cookie's is unknown)
        (None, BOB, False),  # ... but never another session it has
        (None, ALICE, True),
    ],
)
async def test_a_token_link_from_another_site_never_sets_or_replaces_the_session(
    tmp_path: Path, fetch_site: str | None, cookie: str | None, sets: bool
) -> None:
    headers = dict(FLEET)
    if fetch_site is not None:
        headers["Sec-Fetch-Site"] = fetch_site
    if cookie is not None:
        headers["Cookie"] = f"comfyfleet_token={cookie}"
    async with tenants(tmp_path, local_slots=0) as clients:
        served = clients.anonymous
        async with served.session.get(
            f"{served.url}/fleet?token={ALICE}&x=1", headers=headers, allow_redirects=False
        ) as page:
            assert page.status == 302
            assert ("Set-Cookie" in page.headers) == sets
            if sets:
                assert f"comfyfleet_token={ALICE}" in page.headers["Set-Cookie"]
            location = urlsplit(page.headers["Location"])
            if sets or cookie == BOB:  # the page, in the session the browser has
                assert page.headers["Location"] == "/fleet?x=1"
            else:  # the login page says why the link did not log in
                assert location.path == "/login"
                assert parse_qs(location.query)["next"] == ["/fleet?x=1"]
                async with served.session.get(
                    served.url + page.headers["Location"], headers=FLEET
                ) as login:
                    assert "another site" in await login.text()


async def test_an_unknown_token_in_a_page_url_is_dropped_from_it(tmp_path: Path) -> None:
    """Kept in the URL, it would win over the cookie after logging in: a loop back to the
    login page."""
    async with tenants(tmp_path, local_slots=0) as clients:
        served = clients.anonymous
        for cookie, location in ((None, "/login?next=/fleet%3Fx%3D1"), (ALICE, "/fleet?x=1")):
            headers = {} if cookie is None else {"Cookie": f"comfyfleet_token={cookie}"}
            async with served.session.get(
                f"{served.url}/fleet?token=unknown&x=1", headers=headers, allow_redirects=False
            ) as page:
                assert page.status == 302 and "Set-Cookie" not in page.headers
                assert unquote(page.headers["Location"]) == unquote(location)


async def test_logout_from_another_site_is_refused(tmp_path: Path) -> None:
    async with tenants(tmp_path, local_slots=0) as clients:
        served = clients.anonymous
        for headers in ({"Origin": "https://evil.example"}, {"Sec-Fetch-Site": "cross-site"}):
            async with served.session.post(
                served.url + "/logout", headers={**FLEET, **headers}, allow_redirects=False
            ) as answer:
                assert answer.status == 403 and "Set-Cookie" not in answer.headers
        own = {**FLEET, "Origin": "http://fleet.example.com"}
        async with served.session.post(
            served.url + "/logout", headers=own, allow_redirects=False
        ) as answer:
            assert answer.status == 303 and "comfyfleet_token=" in answer.headers["Set-Cookie"]


async def test_login_goes_back_only_to_this_server_and_logout_forgets(tmp_path: Path) -> None:
    async with tenants(tmp_path, local_slots=0) as clients, browser_like(clients.anonymous) as web:
        for elsewhere in ("//evil.example/x", "https://evil.example/", "/\\evil", "x", ""):
            assert await _log_in(web, ALICE, elsewhere) == "/", elsewhere
        async with web.post("/logout", allow_redirects=False) as out:
            assert out.status == 303 and out.headers["Location"] == "/login"
        async with web.get("/api/settings") as after:
            assert after.status == 401


async def test_without_authentication_the_login_page_sends_the_browser_on(
    tmp_path: Path,
) -> None:
    from tests.integration.gateway.wire import serve

    async with serve(tmp_path, local_slots=0) as served, browser_like(served) as web:
        async with web.get("/login?next=/fleet", allow_redirects=False) as page:
            assert page.status == 303 and page.headers["Location"] == "/fleet"
        async with web.get("/", allow_redirects=False) as editor:
            assert editor.status == 200
