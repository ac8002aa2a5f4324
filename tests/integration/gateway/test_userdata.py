"""The editor's user data (saved workflows, settings): one folder per tenant, the path rules
of uploads (no traversal, no symlinks out), and kept across restarts."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from tests.integration.gateway.test_auth import tenants
from tests.integration.gateway.wire import serve

WORKFLOW = json.dumps({"nodes": [], "links": [], "version": 0.4})


async def test_each_tenant_has_its_own_workflows_and_settings(tmp_path: Path) -> None:
    async with tenants(tmp_path) as clients:
        alice, bob, root = clients.alice, clients.bob, clients.root
        saved = await alice.request(
            "POST", "/api/userdata/workflows%2Fmine.json?overwrite=false", data=WORKFLOW.encode()
        )
        assert saved.status == 200 and saved.json == "workflows/mine.json"
        assert (await alice.post("/api/settings/Comfy.Locale", "fr")).status == 200
        listing = "/api/userdata?dir=workflows&recurse=true&split=false&full_info=true"
        assert [f["path"] for f in await alice.get(listing)] == ["mine.json"]
        for other in (bob, root):
            assert (await other.request("GET", listing)).status == 404  # none saved
            assert (await other.request("GET", "/api/userdata/workflows%2Fmine.json")).status == 404
            assert await other.get("/api/settings") == {}
            assert await other.get("/api/v2/userdata") == []
        # Bob saving the same name makes his own file; Alice's stays.
        theirs = await bob.request("POST", "/api/userdata/workflows%2Fmine.json", data=b"{}")
        assert theirs.status == 200
        assert (await alice.request("GET", "/api/userdata/workflows%2Fmine.json")).text == WORKFLOW
        assert await alice.get("/api/settings") == {"Comfy.Locale": "fr"}
        data = clients.anonymous.data_dir
        assert (data / "tenants" / "alice" / "user" / "workflows" / "mine.json").is_file()
        assert (data / "tenants" / "bob" / "user" / "workflows" / "mine.json").is_file()
        assert json.loads((data / "tenants" / "alice" / "user" / "comfy.settings.json").read_text())
        anonymous = await clients.anonymous.request("GET", listing)
        assert anonymous.status == 401


async def test_names_never_lead_out_of_the_user_folder(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.json").write_text('{"secret": 1}')
    async with serve(tmp_path / "data", local_slots=0) as served:
        user = tmp_path / "data" / "user"
        user.mkdir()
        (user / "escape").symlink_to(outside, target_is_directory=True)
        (user / "leak.json").symlink_to(outside / "secret.json")
        (user / "inside.json").write_text("{}")
        (user / "alias.json").symlink_to(user / "inside.json")
        for name in (
            "..%2Foutside%2Fsecret.json",
            "escape%2Fsecret.json",
            "leak.json",
            "%2Fetc%2Fpasswd",
        ):
            reply = await served.request("GET", f"/api/userdata/{name}")
            assert reply.status == 403, name
            written = await served.request("POST", f"/api/userdata/{name}", data=b"{}")
            assert written.status == 403, name
        assert (await served.request("GET", "/api/userdata?dir=escape")).status == 403
        assert (await served.request("GET", "/api/v2/userdata?path=escape")).status == 400
        moved = await served.request("POST", "/api/userdata/inside.json/move/escape%2Fx.json")
        assert moved.status == 403
        listed = await served.get("/api/userdata?dir=.&recurse=true")
        assert "leak.json" not in listed and "alias.json" in listed
        # Deleting a link deletes the link, never what it names.
        assert (await served.request("DELETE", "/api/userdata/alias.json")).status == 204
        assert (user / "inside.json").is_file() and not (user / "alias.json").exists()
        assert (await served.request("DELETE", "/api/userdata/leak.json")).status == 204
        assert (outside / "secret.json").read_text() == '{"secret": 1}'
        assert sorted(p.name for p in outside.iterdir()) == ["secret.json"]


async def test_names_the_filesystem_cannot_hold_are_a_4xx_for_every_verb(tmp_path: Path) -> None:
    long = "w" * 300 + ".json"  # past NAME_MAX (255 bytes): ENAMETOOLONG
    async with serve(tmp_path / "data", local_slots=0) as served:
        user = tmp_path / "data" / "user"
        user.mkdir()
        (user / "inside.json").write_text("{}")
        too_long = [
            ("DELETE", f"/api/userdata/{long}"),
            ("DELETE", f"/api/userdata/{long}%2Fx.json"),
            ("POST", f"/api/userdata/{long}"),
            ("POST", f"/api/userdata/{long}%2Fx.json"),
            ("POST", f"/api/userdata/inside.json/move/{long}"),
            ("POST", f"/api/userdata/inside.json/move/{long}%2Fx.json"),
        ]
        for method, path in too_long:
            reply = await served.request(method, path, data=b"{}")
            assert (reply.status, reply.text) == (400, "File name too long"), (method, path)
        not_there = [
            ("GET", f"/api/userdata/{long}"),
            ("GET", f"/api/userdata?dir={long}"),
            ("GET", f"/api/v2/userdata?path={long}"),
            ("POST", f"/api/userdata/{long}/move/x.json"),
            ("DELETE", "/api/userdata/inside.json%2Fx.json"),  # a file taken for a folder
        ]
        for method, path in not_there:
            assert (await served.request(method, path)).status == 404, (method, path)
        assert sorted(p.name for p in user.iterdir()) == ["inside.json"]


async def test_concurrent_setting_changes_are_all_kept(tmp_path: Path) -> None:
    async with serve(tmp_path / "data", local_slots=0) as served:
        replies = await asyncio.gather(
            *(served.post(f"/api/settings/Key.{n}", n) for n in range(30)),
            served.post("/api/settings", {"Many.a": 1, "Many.b": [1, 2]}),
        )
        assert all(reply.status == 200 for reply in replies)
        settings = await served.get("/api/settings")
        assert settings == {**{f"Key.{n}": n for n in range(30)}, "Many.a": 1, "Many.b": [1, 2]}
        assert (await served.request("POST", "/api/settings", data=b"[1]")).status == 400
        assert (await served.request("POST", "/api/settings/X", data=b"")).status == 400
        assert (await served.request("POST", "/api/settings/X", data=b"{bad")).status == 400


async def test_saved_workflows_and_settings_survive_a_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with serve(data, local_slots=0) as served:
        path = "/api/userdata/workflows%2Fkept.json?overwrite=false&full_info=true"
        assert (await served.request("POST", path, data=WORKFLOW.encode())).status == 200
        assert (await served.post("/api/settings/Comfy.Locale", "de")).status == 200
    async with serve(data, local_slots=0) as served:
        listing = await served.get("/api/userdata?dir=workflows&full_info=true")
        assert [f["path"] for f in listing] == ["kept.json"]
        assert (await served.request("GET", "/api/userdata/workflows%2Fkept.json")).text == WORKFLOW
        assert await served.get("/api/settings/Comfy.Locale") == "de"
        assert await served.get("/api/users") == {"storage": "server", "migrated": True}
